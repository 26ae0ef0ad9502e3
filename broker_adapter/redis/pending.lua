-- pending.lua: messages of ONE shard not yet due, in due order (read only).
--
-- Keys (B = ARGV[1]): KEYS[1] = B.."due" zset (read); B.."p:<n // 1024>" field "<n>", pending record (read);
-- for a retry B.."m:<n>" hash and B.."b:<n>" string length (read).
-- ARGV: [1] B, [2] start ms (inclusive), [3] end ms (exclusive) or "+inf", [4] limit,
--       [5] topic or "" for all. A retry ("<n>|<group>") counts for the message's topic.
-- Returns msgpack array of {n, due, topic, born, key, tags, body size, deliveries}.
local base, limit, topic = ARGV[1], tonumber(ARGV[4]), ARGV[5]
local upper = ARGV[3]
if upper ~= '+inf' then upper = '(' .. upper end
local out = {}
local offset = 0
local scanned = 0
while #out < limit and scanned < 200000 do
  local items = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[2], upper, 'WITHSCORES', 'LIMIT', offset, 512)
  if #items == 0 then break end
  for i = 1, #items, 2 do
    local member = items[i]
    local n, g = member, nil
    local bar = string.find(member, '|', 1, true)
    if bar then n, g = string.sub(member, 1, bar - 1), string.sub(member, bar + 1) end
    local v, size, att = nil, 0, 0
    if g then -- a group's retry of a fired message
      local mk = base .. 'm:' .. n
      v = redis.call('HMGET', mk, 't', 'o', 'k', 'g')
      if v[1] then
        att = tonumber(string.sub(redis.call('HGET', mk, 'G' .. g) or 'P0', 2))
        size = redis.call('STRLEN', base .. 'b:' .. n)
      end
    else
      local rec = redis.call('HGET', base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024)), n)
      if rec then
        local r = cmsgpack.unpack(string.sub(rec, 17))
        v = {r[1], r[3], r[4], r[5]}
        size = #r[7]
      end
    end
    if v and v[1] and (topic == '' or topic == v[1]) then
      out[#out + 1] = {n, tonumber(items[i + 1]), v[1], tonumber(v[2]), v[3], v[4], size, att}
      if #out >= limit then break end
    end
  end
  offset = offset + #items / 2
  scanned = scanned + #items / 2
end
return cmsgpack.pack(out)
