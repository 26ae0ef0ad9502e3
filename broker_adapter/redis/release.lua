-- release.lua: give claimed deliveries back to ready as if never pulled (a pull took
-- more than it may hand out: past its message or byte limit, or past fire order).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"   (routing only)
--   B.."m:<n>"           hash  G<group> I<k>:<claim> -> R<k-1>          (read, written)
--   B.."inf:<group>"     zset  members removed                           (written)
--   B.."rdy:<group>"     zset  members back at their ready score         (written)
--   B.."stat"            hash  i|<group>|<topic> -1, r|<group>|<topic> +1 (written)
-- ARGV: [1] B, [2] group, then triples [n, "<deliveries>:<claim>", ready score].
-- Returns how many went back.
local base, g = ARGV[1], ARGV[2]
local inf, rdy, stat = base .. 'inf:' .. g, base .. 'rdy:' .. g, base .. 'stat'
local done = 0
for i = 3, #ARGV, 3 do
  local n, att = ARGV[i], ARGV[i + 1]
  local mk = base .. 'm:' .. n
  local v = redis.call('HMGET', mk, 'G' .. g, 'C' .. g, 't')
  if v[1] == 'I' .. att then
    redis.call('ZREM', inf, n)
    redis.call('ZADD', rdy, ARGV[i + 2], n)
    redis.call('HSET', mk, 'G' .. g, 'R' .. (tonumber(string.match(att, '^%d+')) - 1))
    local ct = v[2] or v[3]
    redis.call('HINCRBY', stat, 'i|' .. g .. '|' .. ct, -1)
    redis.call('HINCRBY', stat, 'r|' .. g .. '|' .. ct, 1)
    done = done + 1
  end
end
return done
