-- part_state.lua: not a script. The loader puts it where "--@state" stands: at the top
-- of fire.lua, claim.lua and ack_batch.lua when each is called alone, and once at the
-- top of pull.lua, whose parts then share it (their own "--@state" is dropped, and so
-- are their lines ending in "--@alone", such as the final flush_stats()).
--
-- fresh[B.."m:<n>"] = {retention, topic, due, born, key, tags, props, body} of each
--   message the fire part fired for the first time in this call, so the claim part
--   need not read back what the call just wrote nor set its TTLs again.
-- stats[B.."stat"][field] = the change of a counter: each part adds to it and it is
--   written once at the end (HINCRBY, when not 0), so a pull that fires, claims and
--   acks in one call writes "r|..." (+fired -claimed) and "i|..." (+claimed -acked)
--   once per shard, or not at all when they cancel out.
local fresh, stats = {}, {}
local function stat(key, field, d)
  local t = stats[key]
  if not t then t = {}; stats[key] = t end
  t[field] = (t[field] or 0) + d
end
local function flush_stats()
  for key, t in pairs(stats) do
    for f, d in pairs(t) do
      if d ~= 0 then redis.call('HINCRBY', key, f, d) end
    end
  end
end
