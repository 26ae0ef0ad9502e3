-- register.lua: subscribe a consumer group to topics in ONE shard. A topic new to the
-- group is backfilled from its retained log, so nothing fired before is skipped.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"   (routing only)
--   B.."groups"          set   + group                                  (written)
--   B.."subs:<topic>"    set   + group                                  (written)
--   B.."log:<topic>"     zset  retained fired messages                  (read)
--   B.."m:<n>"           hash  G<group> R0 (only when absent), C<group> (written)
--   B.."rdy:<group>"     zset  + backfilled messages                    (written)
--   B.."stat"            hash  r|<group>|<topic> +backfilled            (written)
-- ARGV: [1] B, [2] group, [3..] topics. Returns how many were backfilled.
local base, g = ARGV[1], ARGV[2]
redis.call('SADD', base .. 'groups', g)
local total = 0
for i = 3, #ARGV do
  local topic = ARGV[i]
  if redis.call('SADD', base .. 'subs:' .. topic, g) == 1 then
    local items = redis.call('ZRANGE', base .. 'log:' .. topic, 0, -1, 'WITHSCORES')
    local c = 0
    for j = 1, #items, 2 do
      local n = items[j]
      local mk = base .. 'm:' .. n
      local t = redis.call('HGET', mk, 't')
      if t and redis.call('HSETNX', mk, 'G' .. g, 'R0') == 1 then
        if t ~= topic then redis.call('HSET', mk, 'C' .. g, topic) end
        redis.call('ZADD', base .. 'rdy:' .. g, items[j + 1], n)
        c = c + 1
      end
    end
    if c > 0 then redis.call('HINCRBY', base .. 'stat', 'r|' .. g .. '|' .. topic, c) end
    total = total + c
  end
end
return total
