-- rate.lua: take one permit of a rate limit (GCRA: at most ARGV[1] permits per ARGV[2]
-- ms, bursts of up to ARGV[1]), shared by every client of the prefix.
--
-- Keys: KEYS[1] = "<prefix>:rl:<bucket>" string: the theoretical arrival time (TAT, epoch
-- ms, fractional) (read, written). With Redis's clock it expires when the bucket is full
-- again, so an idle bucket leaves nothing behind.
-- ARGV: [1] limit, [2] period ms, [3] now ms ("" = the Redis server's TIME: one clock for
--       every client, so skew between machines adds no permits).
-- Returns 0 (permit taken) or the ms to wait before asking again (nothing taken).
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
else
  now = tonumber(ARGV[3])
end
local interval = period / limit
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
-- a permit is allowed while the TAT is at most period - interval ahead of now
local allowed_at = tat + interval - period
if now < allowed_at then return math.max(1, math.ceil(allowed_at - now)) end
tat = tat + interval
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX',
             string.format('%d', math.ceil(tat - now) + 1))
else
  redis.call('SET', KEYS[1], string.format('%.3f', tat))
end
return 0
