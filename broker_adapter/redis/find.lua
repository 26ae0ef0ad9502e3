-- find.lua: one bounded step of find_pending in ONE shard (read only): the pending
-- messages (not yet fired: a group's retry "<n>|<group>" is skipped) after a position,
-- in the due index's order (due, then member bytes), filtered by topic, key prefix, tag
-- and due time. The caller merges the shards' answers by (due, shard, member).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"     zset  the order walked (read)
--   B.."p:<n // 1024>"     hash  field "<n>", the pending record (read)
--   B.."kx"                zset  the key lex index: with a key prefix matching at most
--                          ARGV[12] keys, those keys are the candidates (read)
--   B.."k:<topic>\0<key>"  string "<n>|<asked>|<due>" of each candidate (read)
--   B.."stat"              hash  p|/f|<topic> (read: is the topic known here)
-- ARGV: [1] B, [2] mode: 0 due >= [3], 1 due > [3], 2 (due, member) > ([3], [4]); [3] due
--       ms or "-inf", [4] member, [5] end ms (exclusive) or "+inf", [6] most rows,
--       [7] most due entries looked at, [8] topic ("" any), [9] key prefix ("" none),
--       [10] tag ("" any), [11] "1": add the body, [12] most keys gathered by prefix.
-- Returns msgpack {known (0: the topic never had a message in this shard), exhausted
-- (1: nothing after what was looked at), last due looked at, last member looked at,
-- rows}: rows {n, due, topic, born, key, tags, body size, 0, body or ""} in order.
local base, mode, after = ARGV[1], ARGV[2], ARGV[4]
local lo = ARGV[3] == '-inf' and -math.huge or tonumber(ARGV[3])
local hi = ARGV[5] == '+inf' and math.huge or tonumber(ARGV[5])
local limit, work = tonumber(ARGV[6]), tonumber(ARGV[7])
local topic, prefix, tag, with_body = ARGV[8], ARGV[9], ARGV[10], ARGV[11] == '1'
local due_key = KEYS[1]

-- member order of a zset: bytes, as memcmp (Lua's own < follows the locale)
local function before(a, b)
  local la, lb = #a, #b
  for i = 1, math.min(la, lb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return la < lb
end
local function is_after(due, member)
  if mode == '0' then return due >= lo end
  if mode == '1' then return due > lo end
  return due > lo or (due == lo and before(after, member))
end
local function bucket(n) return base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024)) end

local known = 1
if topic ~= '' and redis.call('HEXISTS', base .. 'stat', 'p|' .. topic) == 0 and
    redis.call('HEXISTS', base .. 'stat', 'f|' .. topic) == 0 then
  known = 0
end
local rows = {}
local last_due, last_member = -1, ''
-- a row for member n due at due, if its record matches the filters
local function take(n, due)
  local rec = redis.call('HGET', bucket(n), n)
  if not rec then return end
  -- a record without the tag's or topic's bytes cannot match: skip it unpacked
  if (tag ~= '' and not string.find(rec, tag, 17, true)) or
      (topic ~= '' and not string.find(rec, topic, 17, true)) then
    return
  end
  local r = cmsgpack.unpack(string.sub(rec, 17))
  if (topic == '' or r[1] == topic) and (tag == '' or r[5] == tag) and
      (prefix == '' or string.sub(r[4], 1, #prefix) == prefix) then
    rows[#rows + 1] = {n, due, r[1], r[3], r[4], r[5], #r[7], 0, with_body and r[7] or ''}
  end
end

if known == 0 then return cmsgpack.pack({0, 1, -1, '', rows}) end

local head = topic .. '\0' .. prefix
local lex_lo, lex_hi = '[' .. head, '(' .. head .. '\255'
if prefix ~= '' and redis.call('ZLEXCOUNT', base .. 'kx', lex_lo, lex_hi) <= tonumber(ARGV[12]) then
  -- few keys under the prefix: gather them all, sort by (due, member), take in order
  local cands = {}
  for _, field in ipairs(redis.call('ZRANGEBYLEX', base .. 'kx', lex_lo, lex_hi)) do
    local entry = redis.call('GET', base .. 'k:' .. field)
    if entry then
      local b1 = string.find(entry, '|', 1, true)
      local b2 = string.find(entry, '|', b1 + 1, true)
      local n, due = string.sub(entry, 1, b1 - 1), tonumber(string.sub(entry, b2 + 1))
      if due < hi and is_after(due, n) and redis.call('HEXISTS', bucket(n), n) == 1 then
        cands[#cands + 1] = {due, n}
      end
    end
  end
  table.sort(cands, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return before(a[2], b[2])
  end)
  for _, c in ipairs(cands) do
    take(c[2], c[1])
    if #rows >= limit then
      return cmsgpack.pack({1, 0, c[1], c[2], rows})
    end
  end
  return cmsgpack.pack({1, 1, -1, '', rows})
end

-- walk the due index from the rank of the position
local start
if mode == '0' then
  start = lo == -math.huge and 0 or redis.call('ZCOUNT', due_key, '-inf', '(' .. ARGV[3])
elseif mode == '1' then
  start = redis.call('ZCOUNT', due_key, '-inf', ARGV[3])
else
  local rank = redis.call('ZRANK', due_key, after)
  if rank and tonumber(redis.call('ZSCORE', due_key, after)) == lo then
    start = rank + 1
  else -- the position's member has gone: binary search its place among equal dues
    start = redis.call('ZCOUNT', due_key, '-inf', '(' .. ARGV[3])
    local size = redis.call('ZCOUNT', due_key, ARGV[3], ARGV[3])
    local a, b = 0, size
    while a < b do
      local mid = math.floor((a + b) / 2)
      local m = redis.call('ZRANGE', due_key, start + mid, start + mid)[1]
      if before(after, m) then b = mid else a = mid + 1 end
    end
    start = start + a
  end
end
-- in growing batches: a page that fills early reads little of the index
local looked, batch = 0, math.max(2 * limit, 32)
while looked < work do
  local want = math.min(batch, work - looked)
  local items = redis.call('ZRANGE', due_key, start + looked, start + looked + want - 1,
                           'WITHSCORES')
  for i = 1, #items, 2 do
    local member, due = items[i], tonumber(items[i + 1])
    if due >= hi then return cmsgpack.pack({1, 1, -1, '', rows}) end
    last_due, last_member = due, member
    if not string.find(member, '|', 1, true) then
      take(member, due)
      if #rows >= limit then return cmsgpack.pack({1, 0, due, member, rows}) end
    end
  end
  if #items / 2 < want then return cmsgpack.pack({1, 1, -1, '', rows}) end
  looked = looked + want
  batch = batch * 2
end
return cmsgpack.pack({1, 0, last_due, last_member, rows})
