-- abort.lua: cancel a pending message of ONE shard, by number or by key.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"     zset  member "<n>" removed                     (written)
--   B.."k:<topic>\0<key>"  string "<n>|<asked>|<due>": TTL retention      (read, written)
--   B.."p:<n // 1024>"     hash  field "<n>", the pending record: read, deleted (read, written)
--   B.."m:<n>", "b:<n>"    hash (s X, t d o k g p) and body made from the record, TTL
--                          retention; or read: s F fired, X aborted       (read, written)
--   B.."stat"              hash  p|<topic> -1                             (written)
--   B.."kx"                zset  - "<topic>\0<key>": the key lex index    (written)
-- ARGV: [1] B, [2] "id" or "key", [3] n or "<topic>\0<key>", [4] retention ms.
-- Returns {status, n}: status "A" aborted (now or before), "D" already fired, "N" not
-- found (n is "" when no message has that key).
local base, retention = ARGV[1], ARGV[4]
local n = ARGV[3]
local kk = nil
if ARGV[2] == 'key' then
  kk = base .. 'k:' .. ARGV[3]
  local entry = redis.call('GET', kk)
  if not entry then return {'N', ''} end
  n = string.sub(entry, 1, string.find(entry, '|', 1, true) - 1)
end
local pk = base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024))
local mk = base .. 'm:' .. n
local rec = redis.call('HGET', pk, n)
if not rec then
  local s = redis.call('HGET', mk, 's')
  if not s then return {'N', n} end
  if s == 'F' then return {'D', n} end
  return {'A', n}
end
local r = cmsgpack.unpack(string.sub(rec, 17))
local h = {'t', r[1], 'd', string.format('%d', r[2]), 'o', string.format('%d', r[3]), 's', 'X'}
if r[4] ~= '' then h[#h + 1] = 'k'; h[#h + 1] = r[4] end
if r[5] ~= '' then h[#h + 1] = 'g'; h[#h + 1] = r[5] end
if r[6] ~= '' then h[#h + 1] = 'p'; h[#h + 1] = r[6] end
redis.call('ZREM', KEYS[1], n)
redis.call('HDEL', pk, n)
redis.call('HSET', mk, unpack(h))
redis.call('PEXPIRE', mk, retention)
redis.call('SET', base .. 'b:' .. n, r[7], 'PX', retention)
if r[4] ~= '' then
  local field = r[1] .. '\0' .. r[4]
  redis.call('PEXPIRE', base .. 'k:' .. field, retention)
  redis.call('ZREM', base .. 'kx', field)
end
redis.call('HINCRBY', base .. 'stat', 'p|' .. r[1], -1)
return {'A', n}
