-- peek.lua: due scores and sizes of the first ready messages of one group, in each
-- shard given (read only). Used by pulls when a backlog builds up, so a pull claims
-- exactly the oldest messages across shards. One shard per call on Redis Cluster.
--
-- Keys (B = a shard base from ARGV): B.."rdy:<group>" zset (read); B.."b:<n>" string and
-- B.."m:<n>" hash field p, their lengths (read).
-- ARGV: [1] group, [2] how many per shard, [3..] shard bases.
-- Returns msgpack array, per shard, of arrays of {ready score, size}.
local g, k = ARGV[1], tonumber(ARGV[2])
local results = {}
for bi = 3, #ARGV do
  local base = ARGV[bi]
  local items = redis.call('ZRANGE', base .. 'rdy:' .. g, 0, k - 1, 'WITHSCORES')
  local out = {}
  for i = 1, #items, 2 do
    local n = items[i]
    out[#out + 1] = {tonumber(items[i + 1]), redis.call('STRLEN', base .. 'b:' .. n)
                     + redis.call('HSTRLEN', base .. 'm:' .. n, 'p')}
  end
  results[#results + 1] = out
end
return cmsgpack.pack(results)
