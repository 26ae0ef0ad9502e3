-- abort.lua: cancel a pending message of ONE shard, by number or by key.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"   zset  member "<n>" removed                     (written)
--   B.."keys"            hash  "<topic>\0<key>" -> "<n>|<asked>"         (read)
--   B.."m:<n>", "b:<n>"  hash  s P -> X; both TTL retention            (read, written)
--   B.."stat"            hash  p|<topic> -1                             (written)
-- ARGV: [1] B, [2] "id" or "key", [3] n or "<topic>\0<key>", [4] retention ms.
-- Returns {status, n}: status "A" aborted (now or before), "D" already fired, "N" not
-- found (n is "" when no message has that key).
local base = ARGV[1]
local n = ARGV[3]
if ARGV[2] == 'key' then
  local entry = redis.call('HGET', base .. 'keys', ARGV[3])
  if not entry then return {'N', ''} end
  n = string.sub(entry, 1, string.find(entry, '|', 1, true) - 1)
end
local mk = base .. 'm:' .. n
local v = redis.call('HMGET', mk, 's', 't')
if not v[1] then return {'N', n} end
if v[1] == 'X' then return {'A', n} end
if v[1] == 'F' then return {'D', n} end
redis.call('ZREM', KEYS[1], n)
redis.call('HSET', mk, 's', 'X')
redis.call('PEXPIRE', mk, ARGV[4])
redis.call('PEXPIRE', base .. 'b:' .. n, ARGV[4])
redis.call('HINCRBY', base .. 'stat', 'p|' .. v[2], -1)
return {'A', n}
