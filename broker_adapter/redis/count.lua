-- count.lua: pending counts per due-time bucket in ONE shard (read only): ZCOUNT of the
-- due index per bucket (first sends and retries alike), and the pending counters the
-- caller needs to estimate one topic's share.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"          zset  the shard's timing wheel (read)
--   B.."stat"                   hash  p|<topic> counters (read)
-- ARGV: [1] B, [2] topic ("" for all), [3...] the bucket edges (ms), increasing.
-- Returns {counts, the topic's pending, every topic's pending (retries included)};
-- both pending numbers are 0 without a topic.
local base, topic = ARGV[1], ARGV[2]
local counts = {}
for i = 3, #ARGV - 1 do
  counts[#counts + 1] = redis.call('ZCOUNT', KEYS[1], ARGV[i], '(' .. ARGV[i + 1])
end
local mine, all = 0, 0
if topic ~= '' then
  local fields = redis.call('HGETALL', base .. 'stat')
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 'p|' then
      local v = tonumber(fields[i + 1]) or 0
      if v > 0 then all = all + v end
      if name == 'p|' .. topic and v > 0 then mine = v end
    end
  end
end
return {counts, mine, all}
