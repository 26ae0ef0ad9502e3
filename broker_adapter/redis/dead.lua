-- dead.lua: one bounded step of dead_letters in ONE shard (read only): the group's dead
-- letters after a position, in the order of the group's dead-letter log (death time,
-- then member bytes). A log member whose message is no longer dead in the group
-- (requeued, purged) is skipped. The caller merges the shards' answers by (death,
-- shard, member), as find.lua's.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"          zset  (only names the shard's slot)
--   B.."log:%DLQ%<group>"       zset  dead letters by death time (read)
--   B.."m:<n>"                  hash  t, o, k, g, G<group> (D<k>), E<group> (read)
--   B.."b:<n>"                  string the body (read: size, or the body if asked)
-- ARGV: [1] B, [2] group, [3] mode: 0 death >= [4], 1 death > [4], 2 (death, member) >
--       ([4], [5]); [4] death ms or "-inf", [5] member, [6] most rows, [7] most log
--       entries looked at, [8] "1": add the body.
-- Returns msgpack {1, exhausted (1: nothing after what was looked at), last death looked
-- at, last member looked at, rows}: rows {n, death, topic, born, key, tags, body size,
-- deliveries, body or "", error or ""} in order.
local base, g, mode, after = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local lo = ARGV[4] == '-inf' and '-inf' or ARGV[4]
local limit, work, with_body = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'

local function before(a, b) -- memcmp order of zset members
  local la, lb = #a, #b
  for i = 1, math.min(la, lb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return la < lb
end

local min = lo
if mode == '1' then min = '(' .. lo end
local items = redis.call('ZRANGEBYSCORE', base .. 'log:%DLQ%' .. g, min, '+inf',
  'WITHSCORES', 'LIMIT', 0, work)
local rows = {}
local last_due, last_member = -1, ''
local looked = 0
for i = 1, #items, 2 do
  local n, death = items[i], tonumber(items[i + 1])
  if mode ~= '2' or death > tonumber(lo) or before(after, n) then
    looked = looked + 1
    last_due, last_member = death, n
    local v = redis.call('HMGET', base .. 'm:' .. n, 'G' .. g, 't', 'o', 'k', 'g', 'E' .. g)
    if v[1] and string.sub(v[1], 1, 1) == 'D' then
      local bk = base .. 'b:' .. n
      local body = with_body and (redis.call('GET', bk) or '') or ''
      local size = with_body and #body or redis.call('STRLEN', bk)
      local k = tonumber(string.match(v[1], '^D(%d+)')) or 0
      rows[#rows + 1] = {n, death, v[2] or '', v[3] or 0, v[4] or '', v[5] or '', size, k,
        body, v[6] or ''}
      if #rows >= limit then
        return cmsgpack.pack({1, 0, last_due, last_member, rows})
      end
    end
  end
end
local exhausted = (#items / 2) < work and 1 or 0
return cmsgpack.pack({1, exhausted, last_due, last_member, rows})
