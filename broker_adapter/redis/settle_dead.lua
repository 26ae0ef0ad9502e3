-- settle_dead.lua: requeue or purge dead letters of one group in ONE shard, atomically.
-- Requeue: the message waits in the due index as the group's retry "<n>|<group>" due
-- now with 0 deliveries (fire.lua moves it to rdy:<group> as any retry); purge: the
-- group's state becomes done. Either way it is no longer a dead letter and leaves the
-- group's dead-letter log (so the oldest are always at its head; a group that starts
-- reading %DLQ%<group> later does not get it); a log entry whose message retention
-- dropped leaves too. Groups already reading %DLQ%<group> keep their rdy: entry.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"          zset  + "<n>|<group>" at now (requeue; written)
--   B.."log:%DLQ%<group>"       zset  the oldest dead letters, without ids; settled ones
--                                     removed (read, written)
--   B.."m:<n>"                  hash  G<group> D<k> -> P0 (requeue) | X<k> (purge),
--                                     C<group> (read, written)
--   B.."b:<n>"                  string TTL refreshed (requeue; written)
--   B.."stat"                   hash  d|<group> -1, p|%RETRY%<group> +1 (written)
-- ARGV: [1] B, [2] group, [3] "R" requeue | "X" purge, [4] now ms, [5] most dead letters,
--       [6] wake channel, [7] shard, [8] retention ms, [9...] message numbers (none: the
--       oldest of the log, looking at no more than 4 x [5] + 100 entries).
-- Returns how many were requeued or purged.
local base, g, how, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local stat = base .. 'stat'
local rt = '%RETRY%' .. g
local done = 0

local log = base .. 'log:%DLQ%' .. g
local function settle(n)
  local mk = base .. 'm:' .. n
  local gs = redis.call('HGET', mk, 'G' .. g)
  if not gs then redis.call('ZREM', log, n) end  -- gone with retention: a stale entry
  if not gs or string.sub(gs, 1, 1) ~= 'D' then return end
  redis.call('ZREM', log, n)  -- no dead letter now (and the oldest are found at the head)
  redis.call('HINCRBY', stat, 'd|' .. g, -1)
  if how == 'X' then
    redis.call('HSET', mk, 'G' .. g, 'X' .. string.sub(gs, 2))
  else
    redis.call('HSET', mk, 'G' .. g, 'P0', 'C' .. g, rt)
    redis.call('PEXPIRE', mk, ARGV[8])
    redis.call('PEXPIRE', base .. 'b:' .. n, ARGV[8])
    redis.call('ZADD', KEYS[1], now, n .. '|' .. g)
    redis.call('HINCRBY', stat, 'p|' .. rt, 1)
  end
  done = done + 1
end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #ARGV >= 9 then
  for i = 9, #ARGV do
    if done >= limit then break end
    settle(ARGV[i])
  end
else
  local items = redis.call('ZRANGE', log, 0, 4 * limit + 99)
  for _, n in ipairs(items) do
    if done >= limit then break end
    settle(n)
  end
end
if how == 'R' and done > 0 and (head[2] == nil or now < tonumber(head[2])) then
  redis.call('PUBLISH', ARGV[6], ARGV[7] .. ':' .. string.format('%d', now))
end
return done
