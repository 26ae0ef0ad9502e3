-- ack_batch.lua: mark deliveries consumed by ONE group, each only if it is still that
-- delivery in flight, in one or many shards at once (the ack batcher; a lone ack is a
-- batch of one). On Redis Cluster it is called once per master with that master's
-- shards; on one instance once with every shard.
--
-- Keys (B = a shard base from ARGV, per shard, all of one shard in its slot):
--   B.."m:<n>"           hash  G<group> I<k> -> X<k>                  (read, written)
--   B.."inf:<group>"     zset  members removed                       (written)
--   B.."stat"            hash  i|<group>|<topic> -1, a|<group> +1    (written)
-- ARGV: [1] group, then per shard [B, k, then k pairs [n, deliveries of the receipt]].
-- Returns msgpack array, per shard, of how many were acked (each only if it is still
-- that delivery in flight).
--@state
local g = ARGV[1]
local results = {}
local a = 2
while a <= #ARGV do
  local base, k = ARGV[a], tonumber(ARGV[a + 1])
  local inf, stat_key = base .. 'inf:' .. g, base .. 'stat'
  local done, cnt, gone = 0, {}, {}
  for i = a + 2, a + 2 * k, 2 do
    local n, att = ARGV[i], ARGV[i + 1]
    local mk = base .. 'm:' .. n
    local v = redis.call('HMGET', mk, 'G' .. g, 'C' .. g, 't')
    if v[1] == 'I' .. att then
      gone[#gone + 1] = n
      redis.call('HSET', mk, 'G' .. g, 'X' .. att)
      local ct = v[2] or v[3]
      cnt[ct] = (cnt[ct] or 0) + 1
      done = done + 1
    end
  end
  for i = 1, #gone, 1000 do
    redis.call('ZREM', inf, unpack(gone, i, math.min(i + 999, #gone)))
  end
  for topic, c in pairs(cnt) do
    stat(stat_key, 'i|' .. g .. '|' .. topic, -c)
  end
  if done > 0 then stat(stat_key, 'a|' .. g, done) end
  results[#results + 1] = done
  a = a + 2 + 2 * k
end
flush_stats() --@alone
return cmsgpack.pack(results)
