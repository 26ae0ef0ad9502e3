-- ack.lua: mark deliveries consumed by their group, each only if it is still that
-- delivery in flight (a batch of acks of ONE shard and ONE group).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"   (routing only)
--   B.."m:<n>"           hash  G<group> I<k> -> X<k>                  (read, written)
--   B.."inf:<group>"     zset  members removed                       (written)
--   B.."stat"            hash  i|<group>|<topic> -1, a|<group> +1    (written)
-- ARGV: [1] B, [2] group, then pairs [n, deliveries of the receipt].
-- Returns how many of them were acked (0 when none was in flight).
local base, g = ARGV[1], ARGV[2]
local inf, stat = base .. 'inf:' .. g, base .. 'stat'
local done, cnt = 0, {}
for i = 3, #ARGV, 2 do
  local n, att = ARGV[i], ARGV[i + 1]
  local mk = base .. 'm:' .. n
  local v = redis.call('HMGET', mk, 'G' .. g, 'C' .. g, 't')
  if v[1] == 'I' .. att then
    redis.call('ZREM', inf, n)
    redis.call('HSET', mk, 'G' .. g, 'X' .. att)
    local ct = v[2] or v[3]
    cnt[ct] = (cnt[ct] or 0) + 1
    done = done + 1
  end
end
for topic, c in pairs(cnt) do
  redis.call('HINCRBY', stat, 'i|' .. g .. '|' .. topic, -c)
end
if done > 0 then redis.call('HINCRBY', stat, 'a|' .. g, done) end
return done
