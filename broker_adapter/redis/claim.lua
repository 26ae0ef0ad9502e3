-- claim.lua: put the first ready messages of one group in flight (a pull), in each
-- shard given. On Redis Cluster it is called with ONE shard (one slot); on a single
-- instance with every shard of the pull at once (one call instead of one per shard).
--
-- Keys (B = a shard base from ARGV, all of one shard in its slot):
--   KEYS[1] = B.."due"   (routing only)
--   B.."rdy:<group>"     zset  the first ones removed (claimed)          (read, written)
--   B.."inf:<group>"     zset  members added, score = deadline            (written)
--   B.."m:<n>"           hash  G<group> -> I<deliveries>:<claim>, K<group> claims
--                              counted, TTL refreshed                   (read, written)
--   B.."b:<n>"           string the body, TTL refreshed                  (read)
--   B.."stat"            hash  r|<group>|<topic> -1, i|<group>|<topic> +1 (written)
-- ARGV: [1] group, [2] deadline ms, [3] retention ms, then pairs [shard base, how
--       many at most there].
-- Returns msgpack array, per shard, of arrays of {n, topic, body, due, born, key, tags,
-- props, deliveries, ready score, claim number} in ready (fire) order. The receipt's
-- "<deliveries>:<claim>" names the delivery in every other script. Atomic: members of a group
-- never share a delivery.
local g, deadline, retention = ARGV[1], ARGV[2], ARGV[3]
local function claim(base, share)
local rdy, inf = base .. 'rdy:' .. g, base .. 'inf:' .. g
local items = redis.call('ZRANGE', rdy, 0, share - 1, 'WITHSCORES')
local out, cnt, gone = {}, {}, {}
for i = 1, #items, 2 do
  local n = items[i]
  gone[#gone + 1] = n
  local mk = base .. 'm:' .. n
  -- v[2] (a placeholder here) becomes the body, which lives in its own key
  local v = redis.call('HMGET', mk, 't', 'o', 'd', 'o', 'k', 'g', 'p', 'G' .. g, 'C' .. g)
  if v[1] and v[8] then
    local att = tonumber(string.sub(v[8], 2)) + 1
    -- the claim number makes each delivery's receipt unique, also after a release,
    -- which gives a delivery back without counting it
    local k = redis.call('HINCRBY', mk, 'K' .. g, 1)
    redis.call('HSET', mk, 'G' .. g, 'I' .. att .. ':' .. k)
    redis.call('PEXPIRE', mk, retention)
    redis.call('PEXPIRE', base .. 'b:' .. n, retention)
    v[2] = redis.call('GET', base .. 'b:' .. n) or ''
    redis.call('ZADD', inf, deadline, n)
    local ct = v[9] or v[1]
    cnt[ct] = (cnt[ct] or 0) + 1
    out[#out + 1] = {n, v[1], v[2], tonumber(v[3]), tonumber(v[4]), v[5], v[6], v[7], att,
                     tonumber(items[i + 1]), k}
  end
end
if #gone > 0 then redis.call('ZREM', rdy, unpack(gone)) end
for topic, c in pairs(cnt) do
  redis.call('HINCRBY', base .. 'stat', 'r|' .. g .. '|' .. topic, -c)
  redis.call('HINCRBY', base .. 'stat', 'i|' .. g .. '|' .. topic, c)
end
return out
end
local results = {}
for i = 4, #ARGV, 2 do results[#results + 1] = claim(ARGV[i], tonumber(ARGV[i + 1])) end
return cmsgpack.pack(results)
