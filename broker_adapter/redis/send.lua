-- send.lua: store a batch of messages (pending record + due index + key index), in each
-- shard given. On Redis Cluster it is called once per master with that master's shards;
-- on one instance once with every shard of the batch.
--
-- Keys (B = a shard base "<prefix>:{<tag>}:" from ARGV, all of one shard in its slot):
--   B.."due"            zset  member "<n>", score due ms          (written)
--   B.."n"              string counter of message numbers          (INCRBY)
--   B.."p:<n // 1024>"  hash  field "<n>" = the pending record as the caller packed it
--                       (written; 1,024 numbers share one hash)
--   B.."k:<topic>\0<key>" string "<n>|<asked ms>|<due ms>": the key index entry (read,
--                       written; no TTL while its message is pending)
--   B.."m:<n>"          hash  s (read: F = fired, for the duplicate rule)
--   B.."kx"             zset  + "<topic>\0<key>" (score 0) of each new keyed message: the
--                       key lex index                                (written)
--   B.."stat"           hash  "p|<topic>" += sent                   (written)
-- A record is 15 digits of due ms, "k" (keyed) or "-", then a msgpack array {topic, due,
-- born, key, tags, props, body, asked due} ("" for none): the due and the flag can be read
-- without unpacking, so a keyless message costs one HSET pair and one ZADD member.
-- ARGV: [1] wake channel, then per shard [B, shard number, T = topics counted below,
--       C = messages, then T pairs [topic, keyless messages of it], then C records].
-- Returns msgpack array, per shard, of {last number before the batch, wake due or -1,
-- flat triples [index, n, due] of the DUPLICATE messages}: the others got numbers
-- last+1, last+2, ... in order.
-- A keyed message is a DUPLICATE while its key's message is pending, or when that
-- message fired (not aborted) and was asked for the same due ms.
local function send(base, shard, topics, count, at)
local due_key = base .. 'due'
local first = at + 2 * topics
local last = first + count - 1
local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
local old_head = head[2] and tonumber(head[2]) or nil
local start = redis.call('INCRBY', base .. 'n', count) - count
local seq = start
local counts, zargs, dups, batch_keys, lex = {}, {}, {}, {}, {}
for t = at, first - 1, 2 do counts[ARGV[t]] = tonumber(ARGV[t + 1]) end
local min_due = nil
local idx = 0
local buckets, bucket_order = {}, {} -- "p:<n // 1024>" -> {n, record, ...}
local function bucket_of(num) return base .. 'p:' .. string.format('%d', math.floor(num / 1024)) end
for a = first, last do
  idx = idx + 1
  local rec = ARGV[a]
  local due = string.sub(rec, 1, 15)
  local field, asked, topic = nil, nil, nil
  local dup = nil
  if string.byte(rec, 16) == 107 then -- "k": keyed
    local r = cmsgpack.unpack(string.sub(rec, 17))
    topic = r[1]
    field = topic .. '\0' .. r[4]
    asked = string.format('%d', r[8])
    dup = batch_keys[field]
    if not dup then
      local entry = redis.call('GET', base .. 'k:' .. field)
      if entry then
        local b1 = string.find(entry, '|', 1, true)
        local b2 = string.find(entry, '|', b1 + 1, true)
        local on = string.sub(entry, 1, b1 - 1)
        if redis.call('HEXISTS', bucket_of(tonumber(on)), on) == 1 or (
            string.sub(entry, b1 + 1, b2 - 1) == asked and
            redis.call('HGET', base .. 'm:' .. on, 's') == 'F') then
          dup = {on, string.sub(entry, b2 + 1)}
        end
      end
    end
  end
  if dup then
    dups[#dups + 1] = idx; dups[#dups + 1] = dup[1]; dups[#dups + 1] = dup[2]
  else
    seq = seq + 1
    local n = string.format('%d', seq)
    local d = tonumber(due)
    if field then
      local sdue = string.format('%d', d)
      redis.call('SET', base .. 'k:' .. field, n .. '|' .. asked .. '|' .. sdue)
      batch_keys[field] = {n, sdue}
      lex[#lex + 1] = 0
      lex[#lex + 1] = field
      counts[topic] = (counts[topic] or 0) + 1
    end
    local bk = bucket_of(seq)
    local pairs_of = buckets[bk]
    if not pairs_of then
      pairs_of = {}
      buckets[bk] = pairs_of
      bucket_order[#bucket_order + 1] = bk
    end
    pairs_of[#pairs_of + 1] = n
    pairs_of[#pairs_of + 1] = rec
    zargs[#zargs + 1] = due
    zargs[#zargs + 1] = n
    if min_due == nil or d < min_due then min_due = d end
  end
end
for _, bk in ipairs(bucket_order) do
  local h = buckets[bk]
  for i = 1, #h, 1000 do redis.call('HSET', bk, unpack(h, i, math.min(i + 999, #h))) end
end
for i = 1, #zargs, 1000 do
  redis.call('ZADD', due_key, unpack(zargs, i, math.min(i + 999, #zargs)))
end
for i = 1, #lex, 1000 do
  redis.call('ZADD', base .. 'kx', unpack(lex, i, math.min(i + 999, #lex)))
end
for topic, c in pairs(counts) do
  if c > 0 then redis.call('HINCRBY', base .. 'stat', 'p|' .. topic, c) end
end
local wake = -1
if min_due ~= nil and (old_head == nil or min_due < old_head) then
  wake = min_due
  redis.call('PUBLISH', ARGV[1], shard .. ':' .. string.format('%d', min_due))
end
return {start, wake, dups}
end
local results = {}
local a = 2
while a <= #ARGV do
  local topics, count = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  results[#results + 1] = send(ARGV[a], ARGV[a + 1], topics, count, a + 4)
  a = a + 4 + 2 * topics + count
end
return cmsgpack.pack(results)
