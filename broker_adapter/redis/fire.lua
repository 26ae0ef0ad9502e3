-- fire.lua: fire due messages (due -> ready of each group) and put in-flight messages
-- whose invisible time passed back to ready, in each shard given. On Redis Cluster it
-- is called with ONE shard (one slot); on a single instance with every shard of the
-- pass at once. Atomic per shard: any number of firing
-- processes may run it at once; each entry fires exactly once, and a process that dies
-- before or after the call loses nothing (the state is all in Redis).
--
-- Keys (B = a shard base from ARGV, all of one shard in its slot):
--   B.."due"             zset  entries with score <= now are removed      (read, written)
--   B.."p:<n // 1024>"   hash  field "<n>", the pending record: read, deleted (read, written)
--   B.."m:<n>", "b:<n>"  hash (s F, G<group> R0, ...) and body made from it; TTL retention
--   B.."k:<topic>\0<key>" string the key index entry: TTL retention          (written)
--   B.."subs:<topic>"    set   groups reading the topic                   (read)
--   B.."groups"          set   groups of this shard                       (read)
--   B.."log:<topic>"     zset  fired messages, trimmed to retention        (written)
--   B.."rdy:<group>"     zset  + fired / expired messages                 (written)
--   B.."inf:<group>"     zset  - expired deliveries                       (read, written)
--   B.."stat"            hash  p|, f|, r|, i| counters                    (written)
--   B.."kt"              zset  + "<topic>\0<key>" of each keyed fire, score = now +
--                              retention; its due members are trimmed on sweeps
--                              (scan) and in passes that fired keyed ones  (read, written)
--   B.."kx"              zset  - members whose k: entry expired (the trim)   (written)
--   B.."k:<topic>\0<key>" PTTL read by the trim                             (read)
-- ARGV: [1] now ms, [2] max entries per shard, [3] retention ms, [4] ready channel ("" =
--       nobody else listens: publish nothing), [5] origin; then triples [shard base, shard
--       number, 1 = also look at in-flight deadlines (else 0)]. One message
--       "<origin>:<shard>,<shard>..." is published on the ready channel, naming the shards
--       where anything moved.
-- Returns msgpack array, per shard, of {fired + redelivered, next due or -1, next
-- invisible deadline or -1 (none, or not looked at), more (0/1)}.
-- fresh (what fired here for the first time) and stats: see part_state.lua.
--@state
local now, limit, retention = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local news = {} -- shards where anything moved
local function bucket_of(base, n)
  return base .. 'p:' .. string.format('%d', math.floor(tonumber(n) / 1024))
end
local function fire(base, shard, scan)
local due_key = base .. 'due'
-- A peek at the wheel's head first: it mostly holds every due entry and the first one
-- after them, the head once they are gone (one command less per shard and pass).
local peek = math.min(8, limit)
local items = redis.call('ZRANGE', due_key, 0, peek - 1, 'WITHSCORES')
local next_head, known = -1, #items < 2 * peek
for i = 2, #items, 2 do
  if tonumber(items[i]) > now then
    next_head, known = tonumber(items[i]), true
    for j = #items, i - 1, -1 do items[j] = nil end
    break
  end
end
if not known then -- more due than the peek holds
  items = redis.call('ZRANGEBYSCORE', due_key, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
end
local cnt = {}
local function add(f, d) cnt[f] = (cnt[f] or 0) + d end
local subs_of, touched, members, gone, gone_order, trims = {}, {}, {}, {}, {}, {}
-- score/member pairs per key (rdy:<group>, log:<topic>): one ZADD each, not one per
-- message
local adds, add_order = {}, {}
local function zadd(key, score, member)
  local l = adds[key]
  if not l then l = {}; adds[key] = l; add_order[#add_order + 1] = key end
  l[#l + 1] = score; l[#l + 1] = member
end
local moved = 0
for i = 1, #items, 2 do
  local member, score = items[i], items[i + 1]
  members[#members + 1] = member
  local bar = string.find(member, '|', 1, true)
  if bar then -- one group's retry
    local n, g = string.sub(member, 1, bar - 1), string.sub(member, bar + 1)
    local mk = base .. 'm:' .. n
    local gs = redis.call('HGET', mk, 'G' .. g)
    if gs and string.sub(gs, 1, 1) == 'P' then
      redis.call('HSET', mk, 'G' .. g, 'R' .. string.sub(gs, 2))
      zadd(base .. 'rdy:' .. g, score, n)
      local rt = '%RETRY%' .. g
      add('p|' .. rt, -1); add('f|' .. rt, 1); add('r|' .. g .. '|' .. rt, 1)
      moved = moved + 1
    end
  else
    local pk = bucket_of(base, member)
    local rec = redis.call('HGET', pk, member)
    if rec then
      if not gone[pk] then gone[pk] = {}; gone_order[#gone_order + 1] = pk end
      local g_list = gone[pk]
      g_list[#g_list + 1] = member
      -- the pending record becomes the fired message's hash and body
      local r = cmsgpack.unpack(string.sub(rec, 17))
      local topic, key = r[1], r[4]
      local subs = subs_of[topic]
      if not subs then
        subs = redis.call('SMEMBERS', base .. 'subs:' .. topic)
        subs_of[topic] = subs
      end
      local mk = base .. 'm:' .. member
      local h = {'t', topic, 'd', string.format('%d', r[2]), 'o', string.format('%d', r[3]),
                 's', 'F'}
      if key ~= '' then h[#h + 1] = 'k'; h[#h + 1] = key end
      if r[5] ~= '' then h[#h + 1] = 'g'; h[#h + 1] = r[5] end
      if r[6] ~= '' then h[#h + 1] = 'p'; h[#h + 1] = r[6] end
      for _, g in ipairs(subs) do
        h[#h + 1] = 'G' .. g; h[#h + 1] = 'R0'
        zadd(base .. 'rdy:' .. g, score, member)
        add('r|' .. g .. '|' .. topic, 1)
      end
      redis.call('HSET', mk, unpack(h))
      redis.call('PEXPIRE', mk, retention)
      redis.call('SET', base .. 'b:' .. member, r[7], 'PX', retention)
      fresh[mk] = {retention, topic, r[2], r[3], key, r[5], r[6], r[7]}
      if key ~= '' then
        local field = topic .. '\0' .. key
        redis.call('PEXPIRE', base .. 'k:' .. field, retention)
        trims[#trims + 1] = now + tonumber(retention)
        trims[#trims + 1] = field
      end
      zadd(base .. 'log:' .. topic, score, member)
      add('p|' .. topic, -1); add('f|' .. topic, 1)
      touched[topic] = true
      moved = moved + 1
    end
  end
end
for _, key in ipairs(add_order) do
  local l = adds[key]
  for i = 1, #l, 2000 do redis.call('ZADD', key, unpack(l, i, math.min(i + 1999, #l))) end
end
for i = 1, #members, 1000 do
  redis.call('ZREM', due_key, unpack(members, i, math.min(i + 999, #members)))
end
for _, pk in ipairs(gone_order) do
  local l = gone[pk]
  for i = 1, #l, 1000 do redis.call('HDEL', pk, unpack(l, i, math.min(i + 999, #l))) end
end
local kt, kx = base .. 'kt', base .. 'kx'
for i = 1, #trims, 1000 do
  redis.call('ZADD', kt, unpack(trims, i, math.min(i + 999, #trims)))
end
-- the key lex index keeps a fired key while its k: entry lives (retention): drop the
-- ones whose entry expired; queue again those Redis has not expired yet (its clock is
-- not the broker's); one pending again (re-sent) stays and leaves the queue
-- (on sweeps and in passes that fired keyed messages, which keeps pace with them; a
-- reader skips the few stale members left meanwhile)
local old = {}
if scan == '1' or #trims > 0 then
  old = redis.call('ZRANGEBYSCORE', kt, '-inf', now, 'LIMIT', 0, limit)
end
if #old > 0 then
  local drop, again = {}, {}
  for _, m in ipairs(old) do
    local ttl = redis.call('PTTL', base .. 'k:' .. m)
    if ttl == -2 then drop[#drop + 1] = m
    elseif ttl > 0 then again[#again + 1] = now + ttl; again[#again + 1] = m end
  end
  for i = 1, #old, 1000 do redis.call('ZREM', kt, unpack(old, i, math.min(i + 999, #old))) end
  for i = 1, #drop, 1000 do redis.call('ZREM', kx, unpack(drop, i, math.min(i + 999, #drop))) end
  for i = 1, #again, 1000 do
    redis.call('ZADD', kt, unpack(again, i, math.min(i + 999, #again)))
  end
end
for topic, _ in pairs(touched) do
  redis.call('ZREMRANGEBYSCORE', base .. 'log:' .. topic, '-inf', '(' .. (now - tonumber(retention)))
end
-- invisible time: expired deliveries go back to ready, deliveries count stays
local next_deadline = -1
local groups = {}
if scan == '1' then groups = redis.call('SMEMBERS', base .. 'groups') end
for _, g in ipairs(groups) do
  local inf = base .. 'inf:' .. g
  local expired = redis.call('ZRANGEBYSCORE', inf, '-inf', now, 'LIMIT', 0, limit)
  for _, n in ipairs(expired) do
    redis.call('ZREM', inf, n)
    local mk = base .. 'm:' .. n
    local v = redis.call('HMGET', mk, 'G' .. g, 'C' .. g, 't')
    if v[1] and string.sub(v[1], 1, 1) == 'I' then
      redis.call('HSET', mk, 'G' .. g, 'R' .. string.match(v[1], '^I(%d+)'))
      redis.call('ZADD', base .. 'rdy:' .. g, now, n)
      local ct = v[2] or v[3]
      add('i|' .. g .. '|' .. ct, -1); add('r|' .. g .. '|' .. ct, 1)
      moved = moved + 1
    end
  end
  local h = redis.call('ZRANGE', inf, 0, 0, 'WITHSCORES')
  if h[2] then
    local d = tonumber(h[2])
    if next_deadline < 0 or d < next_deadline then next_deadline = d end
  end
end
for f, d in pairs(cnt) do stat(base .. 'stat', f, d) end
if moved > 0 then news[#news + 1] = shard end
if not known then
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  next_head = head[2] and tonumber(head[2]) or -1
end
local more = 0
if #items / 2 >= limit then more = 1 end
return {moved, next_head, next_deadline, more}
end
local results = {}
for i = 6, #ARGV, 3 do results[#results + 1] = fire(ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
if #news > 0 and ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5] .. ':' .. table.concat(news, ','))
end
flush_stats() --@alone
return cmsgpack.pack(results)
