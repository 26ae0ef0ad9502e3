-- extend.lua: move the invisible deadline of one in-flight delivery (changeInvisibleDuration).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"   (routing only)
--   B.."m:<n>"           hash  G<group> must be I<deliveries>; TTL refreshed (read)
--   B.."b:<n>"           string the body, TTL refreshed                     (written)
--   B.."inf:<group>"     zset  score = the new deadline                     (written)
-- ARGV: [1] B, [2] group, [3] n, [4] deliveries of the receipt, [5] new deadline ms,
--       [6] retention ms.
-- Returns 1 (extended) or 0 (not in flight with that receipt).
local base, g, n = ARGV[1], ARGV[2], ARGV[3]
local mk = base .. 'm:' .. n
if redis.call('HGET', mk, 'G' .. g) ~= 'I' .. ARGV[4] then return 0 end
redis.call('ZADD', base .. 'inf:' .. g, 'XX', ARGV[5], n)
redis.call('PEXPIRE', mk, ARGV[6])
redis.call('PEXPIRE', base .. 'b:' .. n, ARGV[6])
return 1
