-- slot.lua: take, renew or give back one slot of a semaphore with expiring leases.
--
-- Keys: KEYS[1] = "<prefix>:sem:<name>" zset: member holder, score = the end of its lease
-- (epoch ms) (read, written). Leases that ended are removed first; with Redis's clock
-- the key expires with its last lease.
-- ARGV: [1] "acquire" or "release", [2] holder, [3] limit, [4] lease ms, [5] now ms ("" =
--       the Redis server's TIME, one clock for every client).
-- Returns 1 (acquire: taken or renewed; release: it held a live lease) or 0.
local key, holder = KEYS[1], ARGV[2]
local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[5])
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if ARGV[1] == 'release' then return redis.call('ZREM', key, holder) end
if not redis.call('ZSCORE', key, holder) and redis.call('ZCARD', key) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', key, now + tonumber(ARGV[4]), holder)
if ARGV[5] == '' then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, string.format('%d', tonumber(last[2]) - now + 1))
end
return 1
