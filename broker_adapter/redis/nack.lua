-- nack.lua: give one in-flight delivery back for a later retry of its group (the retry
-- waits in the due index as "<n>|<group>", topic %RETRY%<group>), or dead-letter it into
-- %DLQ%<group> (fanned out to that topic's groups at once).
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"     zset  + "<n>|<group>" at now + delay          (written)
--   B.."m:<n>"             hash  G<group> -> P<k> | D<k>, C<group>, E<group>; for each
--                                DLQ reader G<reader> R0, C<reader>     (read, written)
--   B.."b:<n>"             string TTL refreshed                          (written)
--   B.."inf:<group>"       zset  member removed                          (written)
--   B.."subs:%DLQ%<group>" set   groups reading the dead letters         (read)
--   B.."rdy:<reader>"      zset  + dead letter                           (written)
--   B.."log:%DLQ%<group>"  zset  + dead letter                           (written)
--   B.."stat"              hash  i|, p|, f|, r|, d| counters             (written)
-- ARGV: [1] B, [2] group, [3] n, [4] "<deliveries>:<claim>" of the receipt, [5] now ms, [6] delay ms,
--       [7] max attempts, [8] reason ("" = none), [9] 1 = dead letter now, [10] wake
--       channel, [11] shard, [12] retention ms, [13] 1 = a release: this delivery does
--       not count (stored as one delivery less, never dead-lettered).
-- Returns 0 (not in flight), 1 (retry pending; wake published if it is the new head),
-- or 2 (dead).
local base, g, n, att = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = tonumber(ARGV[5])
local mk = base .. 'm:' .. n
local v = redis.call('HMGET', mk, 'G' .. g, 'C' .. g, 't')
if v[1] ~= 'I' .. att then return 0 end
att = tonumber(string.match(att, '^%d+'))  -- "<deliveries>:<claim>": the count
local stat = base .. 'stat'
redis.call('ZREM', base .. 'inf:' .. g, n)
redis.call('HINCRBY', stat, 'i|' .. g .. '|' .. (v[2] or v[3]), -1)
redis.call('PEXPIRE', mk, ARGV[12])
redis.call('PEXPIRE', base .. 'b:' .. n, ARGV[12])
if ARGV[8] ~= '' then redis.call('HSET', mk, 'E' .. g, ARGV[8]) end
local released = ARGV[13] == '1'
if not released and (ARGV[9] == '1' or att >= tonumber(ARGV[7])) then
  local dlq = '%DLQ%' .. g
  redis.call('HSET', mk, 'G' .. g, 'D' .. att)
  redis.call('HINCRBY', stat, 'd|' .. g, 1)
  redis.call('HINCRBY', stat, 'f|' .. dlq, 1)
  redis.call('ZADD', base .. 'log:' .. dlq, now, n)
  for _, r in ipairs(redis.call('SMEMBERS', base .. 'subs:' .. dlq)) do
    if redis.call('HSETNX', mk, 'G' .. r, 'R0') == 1 then
      redis.call('HSET', mk, 'C' .. r, dlq)
      redis.call('ZADD', base .. 'rdy:' .. r, now, n)
      redis.call('HINCRBY', stat, 'r|' .. r .. '|' .. dlq, 1)
    end
  end
  return 2
end
local rt = '%RETRY%' .. g
local due = now + tonumber(ARGV[6])
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if released then att = att - 1 end
redis.call('HSET', mk, 'G' .. g, 'P' .. att, 'C' .. g, rt)
redis.call('ZADD', KEYS[1], due, n .. '|' .. g)
redis.call('HINCRBY', stat, 'p|' .. rt, 1)
if head[2] == nil or due < tonumber(head[2]) then
  redis.call('PUBLISH', ARGV[10], ARGV[11] .. ':' .. string.format('%d', due))
end
return 1
