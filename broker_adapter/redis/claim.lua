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
-- A message the fire part of the same pull.lua call fired with this retention (fresh,
-- see part_state.lua) is claimed from what the fire wrote (its hash holds exactly
-- that: state R0, no claims, no retry topic) and keeps the TTLs the fire just set: an
-- HMGET, a GET and two PEXPIREs less per message.
--@state
local g, deadline, retention = ARGV[1], ARGV[2], ARGV[3]
local function opt(x) -- a fired record's "" is a field HMGET would find missing
  if x == '' then return false end
  return x
end
local function claim(base, share)
local rdy, inf = base .. 'rdy:' .. g, base .. 'inf:' .. g
local items = redis.call('ZRANGE', rdy, 0, share - 1, 'WITHSCORES')
local out, cnt, gone, adds = {}, {}, {}, {} -- adds: inf's score/member pairs, one ZADD
for i = 1, #items, 2 do
  local n = items[i]
  gone[#gone + 1] = n
  local mk = base .. 'm:' .. n
  local f = fresh[mk]
  local v
  if f and f[1] == retention then
    v = {f[2], f[8], f[3], f[4], opt(f[5]), opt(f[6]), opt(f[7]), 'R0', false, false}
  else
    f = nil
    -- v[2] (a placeholder here) becomes the body, which lives in its own key
    v = redis.call('HMGET', mk, 't', 'o', 'd', 'o', 'k', 'g', 'p', 'G' .. g, 'C' .. g, 'K' .. g)
  end
  if v[1] and v[8] then
    local att = tonumber(string.sub(v[8], 2)) + 1
    -- the claim number makes each delivery's receipt unique, also after a release,
    -- which gives a delivery back without counting it (read with the rest and written
    -- with the state: one command less per message than an HINCRBY)
    local k = tonumber(v[10] or '0') + 1
    redis.call('HSET', mk, 'G' .. g, 'I' .. att .. ':' .. k, 'K' .. g, k)
    if not f then
      redis.call('PEXPIRE', mk, retention)
      redis.call('PEXPIRE', base .. 'b:' .. n, retention)
      v[2] = redis.call('GET', base .. 'b:' .. n) or ''
    end
    adds[#adds + 1] = deadline
    adds[#adds + 1] = n
    local ct = v[9] or v[1]
    cnt[ct] = (cnt[ct] or 0) + 1
    out[#out + 1] = {n, v[1], v[2], tonumber(v[3]), tonumber(v[4]), v[5], v[6], v[7], att,
                     tonumber(items[i + 1]), k}
  end
end
if #gone > 0 then redis.call('ZREM', rdy, unpack(gone)) end
for i = 1, #adds, 2000 do redis.call('ZADD', inf, unpack(adds, i, math.min(i + 1999, #adds))) end
for topic, c in pairs(cnt) do
  stat(base .. 'stat', 'r|' .. g .. '|' .. topic, -c)
  stat(base .. 'stat', 'i|' .. g .. '|' .. topic, c)
end
return out
end
local results = {}
for i = 4, #ARGV, 2 do results[#results + 1] = claim(ARGV[i], tonumber(ARGV[i + 1])) end
flush_stats() --@alone
return cmsgpack.pack(results)
