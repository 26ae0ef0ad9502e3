-- peek.lua: ready scores of the first ready messages of one group, in each shard given
-- (read only). Used by pulls when a backlog builds up, so a pull claims exactly the
-- oldest messages across shards. One call per master on Redis Cluster.
--
-- Keys (B = a shard base from ARGV): B.."rdy:<group>" zset (read).
-- ARGV: [1] group, [2] how many per shard, [3..] shard bases.
-- Returns msgpack array, per shard, of arrays of ready scores.
local g, k = ARGV[1], tonumber(ARGV[2])
local results = {}
for bi = 3, #ARGV do
  local base = ARGV[bi]
  local items = redis.call('ZRANGE', base .. 'rdy:' .. g, 0, k - 1, 'WITHSCORES')
  local out = {}
  for i = 2, #items, 2 do out[#out + 1] = tonumber(items[i]) end
  results[#results + 1] = out
end
return cmsgpack.pack(results)
