-- abort_prefix.lua: one chunk of an abort by key prefix in ONE shard: the next keys of
-- the topic under the prefix, in key order, from the key lex index. Each pending one is
-- aborted as abort.lua aborts it; each whose message fired is named. The caller calls
-- again from the last key until "more" is 0, so the shard is never held for long (the
-- firer runs between chunks).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"     zset  members "<n>" of the aborted removed            (written)
--   B.."kx"                zset  the key lex index: read in order; aborted keys and
--                          stale ones (no k: entry) removed                (read, written)
--   B.."k:<topic>\0<key>"  string "<n>|<asked>|<due>": TTL retention when aborted
--                                                                          (read, written)
--   B.."p:<n // 1024>"     hash  field "<n>", the pending record: read, deleted (read, written)
--   B.."m:<n>", "b:<n>"    hash (s X, t d o k g p) and body made from the record, TTL
--                          retention; or read: s F fired                   (read, written)
--   B.."stat"              hash  p|<topic> -aborted; p|/f|<topic> read (is it known)
-- ARGV: [1] B, [2] topic, [3] prefix, [4] the last key of the previous chunk ("" on the
--       first call), [5] most keys in this chunk, [6] retention ms.
-- Returns {known (1 when this shard has ever had a message of the topic), aborted,
-- {keys whose message fired, in key order}, the last key looked at ("" for none),
-- more (1: call again from that key)}.
local base, topic, prefix, after = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local chunk, retention = tonumber(ARGV[5]), ARGV[6]
local stat, kx = base .. 'stat', base .. 'kx'
local known = 1
if redis.call('HEXISTS', stat, 'p|' .. topic) == 0 and
    redis.call('HEXISTS', stat, 'f|' .. topic) == 0 then
  known = 0
end
local head = topic .. '\0'
local lo = '[' .. head .. prefix
if after ~= '' then lo = '(' .. head .. after end
local fields = redis.call('ZRANGEBYLEX', kx, lo, '(' .. head .. prefix .. '\255', 'LIMIT', 0, chunk)
local aborted, fired, remove, gone, gone_order = 0, {}, {}, {}, {}
for _, field in ipairs(fields) do
  local key = string.sub(field, #head + 1)
  local kk = base .. 'k:' .. field
  local entry = redis.call('GET', kk)
  if not entry then
    remove[#remove + 1] = field -- its retention ran out before the trim took it
  else
    local n = string.sub(entry, 1, string.find(entry, '|', 1, true) - 1)
    local pk = base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024))
    local rec = redis.call('HGET', pk, n)
    if rec then
      local r = cmsgpack.unpack(string.sub(rec, 17))
      local h = {'t', r[1], 'd', string.format('%d', r[2]), 'o', string.format('%d', r[3]),
                 's', 'X', 'k', r[4]}
      if r[5] ~= '' then h[#h + 1] = 'g'; h[#h + 1] = r[5] end
      if r[6] ~= '' then h[#h + 1] = 'p'; h[#h + 1] = r[6] end
      local mk = base .. 'm:' .. n
      redis.call('HSET', mk, unpack(h))
      redis.call('PEXPIRE', mk, retention)
      redis.call('SET', base .. 'b:' .. n, r[7], 'PX', retention)
      redis.call('PEXPIRE', kk, retention)
      if not gone[pk] then gone[pk] = {}; gone_order[#gone_order + 1] = pk end
      local g_list = gone[pk]
      g_list[#g_list + 1] = n
      remove[#remove + 1] = field
      aborted = aborted + 1
    elseif redis.call('HGET', base .. 'm:' .. n, 's') == 'F' then
      fired[#fired + 1] = key
    else
      remove[#remove + 1] = field -- aborted before: not in the index any more
    end
  end
end
for _, pk in ipairs(gone_order) do
  local l = gone[pk]
  redis.call('ZREM', KEYS[1], unpack(l))
  redis.call('HDEL', pk, unpack(l))
end
if #remove > 0 then redis.call('ZREM', kx, unpack(remove)) end
if aborted > 0 then redis.call('HINCRBY', stat, 'p|' .. topic, -aborted) end
local last = ''
if #fields > 0 then last = string.sub(fields[#fields], #head + 1) end
local more = 0
if #fields >= chunk then more = 1 end
return {known, aborted, fired, last, more}
