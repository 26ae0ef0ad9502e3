-- reschedule.lua: move a pending message of ONE shard, by number or by key, to a new due
-- time (and optionally a new body). Atomic on the shard, as fire.lua is: a reschedule
-- racing the fire finds the record either still pending (and moves it) or fired (and
-- answers "D"), so the message is delivered exactly once.
--
-- Keys (B = ARGV[1], all in the shard's slot):
--   KEYS[1] = B.."due"     zset  member "<n>": its score becomes the new due    (written)
--   B.."k:<topic>\0<key>"  string "<n>|<asked>|<due>": the due part is updated, the asked
--                          due of the first send kept                     (read, written)
--   B.."p:<n // 1024>"     hash  field "<n>", the pending record: rewritten with the new
--                          due (and body); id, key, tags, props, born kept (read, written)
--   B.."m:<n>"             hash  s, d (read: F fired, X aborted)           (read)
-- ARGV: [1] B, [2] "id" or "key", [3] n or "<topic>\0<key>", [4] new due ms, [5] "1" with
--       a new body in [6] ("0": keep the body), [7] max body + props bytes, [8] wake
--       channel, [9] shard number, [10] now ms.
-- Returns {status, n, due, wake}: "R" rescheduled (due = the new due; wake = the new
-- due when it is the shard's new head, published on the wake channel, else -1); "D"
-- already fired, or due by now and left to the firer, as the embedded broker fires
-- what is due before it moves anything (due = the due it fires at); "N" not found (n
-- "" when no message has that key; an aborted message is not found); or {"T", size}:
-- the new body plus the message's properties is over the limit (nothing changed).
local base, due = ARGV[1], tonumber(ARGV[4])
local n = ARGV[3]
if ARGV[2] == 'key' then
  local entry = redis.call('GET', base .. 'k:' .. ARGV[3])
  if not entry then return {'N', '', -1, -1} end
  n = string.sub(entry, 1, string.find(entry, '|', 1, true) - 1)
end
local pk = base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024))
local rec = redis.call('HGET', pk, n)
if not rec then
  local v = redis.call('HMGET', base .. 'm:' .. n, 's', 'd')
  if v[1] == 'F' then return {'D', n, tonumber(v[2]), -1} end
  return {'N', n, -1, -1}
end
local old_due = tonumber(string.sub(rec, 1, 15))
if old_due <= tonumber(ARGV[10]) then return {'D', n, old_due, -1} end
local r = cmsgpack.unpack(string.sub(rec, 17))
if ARGV[5] == '1' then
  local size = #ARGV[6] + #r[6]
  if size > tonumber(ARGV[7]) then return {'T', size} end
  r[7] = ARGV[6]
end
local sdue = string.format('%d', due)
r[2] = due
redis.call('HSET', pk, n, string.format('%015d', due) .. string.sub(rec, 16, 16) .. cmsgpack.pack(r))
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], due, n)
if r[4] ~= '' then
  local kk = base .. 'k:' .. r[1] .. '\0' .. r[4]
  local entry = redis.call('GET', kk)
  if entry then
    local b1 = string.find(entry, '|', 1, true)
    local b2 = string.find(entry, '|', b1 + 1, true)
    if string.sub(entry, 1, b1 - 1) == n then
      redis.call('SET', kk, string.sub(entry, 1, b2) .. sdue)
    end
  end
end
local wake = -1
if head[2] == nil or due < tonumber(head[2]) then
  wake = due
  redis.call('PUBLISH', ARGV[8], ARGV[9] .. ':' .. sdue)
end
return {'R', n, due, wake}
