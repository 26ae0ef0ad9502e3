-- send.lua: store a batch of messages of ONE shard (message hash + due index + key index).
--
-- Keys (B = ARGV[1] = "<prefix>:{<tag>}:", all in the shard's slot):
--   KEYS[1] = B.."due"  zset  member "<n>", score due ms          (written)
--   B.."n"              string counter of message numbers          (INCRBY)
--   B.."m:<n>"          hash  t d o s [k g p]                       (written)
--   B.."b:<n>"          string the body                              (written)
--   B.."keys"           hash  "<topic>\0<key>" -> "<n>|<asked ms>"  (read, written)
--   B.."stat"           hash  "p|<topic>" += sent                   (written)
-- ARGV: [1] B, [2] now ms, [3] msgpack array of {topic, body, key, tags, props, due, asked}
--       ("" = none), [4] wake channel, [5] shard number.
-- Returns {msgpack array of {1 (OK) | 0 (DUPLICATE), n, due}, wake due or -1}.
-- A keyed message is a DUPLICATE while its key's message is pending, or when that
-- message fired (not aborted) and was asked for the same due ms.
local base, now = ARGV[1], ARGV[2]
local due_key = KEYS[1]
local msgs = cmsgpack.unpack(ARGV[3])
local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local old_head = head[2] and tonumber(head[2]) or nil
local keys_hash = base .. 'keys'
local seq = redis.call('INCRBY', base .. 'n', #msgs) - #msgs
local out, batch_keys, counts, zargs = {}, {}, {}, {}
local min_due = nil
for i, m in ipairs(msgs) do
  local topic, key, due = m[1], m[3], m[6]
  local dup = nil
  local field = nil
  if key ~= '' then
    field = topic .. '\0' .. key
    dup = batch_keys[field]
    if not dup then
      local entry = redis.call('HGET', keys_hash, field)
      if entry then
        local bar = string.find(entry, '|', 1, true)
        local on = string.sub(entry, 1, bar - 1)
        local st = redis.call('HMGET', base .. 'm:' .. on, 's', 'd')
        if st[1] == 'P' or (st[1] == 'F' and tonumber(string.sub(entry, bar + 1)) == m[7]) then
          dup = {0, on, tonumber(st[2])}
        end
      end
    end
  end
  if dup then
    out[i] = {0, dup[2], dup[3]}
  else
    seq = seq + 1
    local n = string.format('%d', seq)
    local sdue = string.format('%d', due)
    local h = {'t', topic, 'd', sdue, 'o', now, 's', 'P'}
    if key ~= '' then
      h[#h + 1] = 'k'; h[#h + 1] = key
      redis.call('HSET', keys_hash, field, n .. '|' .. string.format('%d', m[7]))
      batch_keys[field] = {0, n, due}
    end
    if m[4] ~= '' then h[#h + 1] = 'g'; h[#h + 1] = m[4] end
    if m[5] ~= '' then h[#h + 1] = 'p'; h[#h + 1] = m[5] end
    redis.call('HSET', base .. 'm:' .. n, unpack(h))
    redis.call('SET', base .. 'b:' .. n, m[2])
    zargs[#zargs + 1] = sdue
    zargs[#zargs + 1] = n
    counts[topic] = (counts[topic] or 0) + 1
    if min_due == nil or due < min_due then min_due = due end
    out[i] = {1, n, due}
  end
end
for i = 1, #zargs, 1000 do
  redis.call('ZADD', due_key, unpack(zargs, i, math.min(i + 999, #zargs)))
end
for topic, c in pairs(counts) do
  redis.call('HINCRBY', base .. 'stat', 'p|' .. topic, c)
end
local wake = -1
if min_due ~= nil and (old_head == nil or min_due < old_head) then
  wake = min_due
  redis.call('PUBLISH', ARGV[4], ARGV[5] .. ':' .. string.format('%d', min_due))
end
return {cmsgpack.pack(out), wake}
