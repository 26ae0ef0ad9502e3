-- pull.lua: one round trip of a pull, on ONE shard set of one server: the group's
-- queued acks (ack_batch.lua), then a firing pass (fire.lua), then a claim (claim.lua),
-- each part optional. The loader puts the three scripts' text where the markers are,
-- each as the body of a function whose parameter ARGV holds that part's arguments, so
-- every key, argument and reply is the part script's own (see each file's header).
-- Not atomic as a whole (each part is, as when called alone).
--
-- ARGV: [1], [2], [3] how many arguments the ack, fire and claim parts get (0: that
--       part is not run), then those arguments in that order.
-- Returns an array of three replies (each the part's msgpack reply, "" when not run).
local counts = {tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])}
local at = 4
local function part(i)
  local n = counts[i]
  local args = {}
  for j = at, at + n - 1 do args[#args + 1] = ARGV[j] end
  at = at + n
  return args, n > 0
end
-- the parts' shared state (fresh fires, counter changes): see part_state.lua
--@state
local ack_args, ack_on = part(1)
local fire_args, fire_on = part(2)
local claim_args, claim_on = part(3)
local out = {'', '', ''}
if ack_on then
  out[1] = (function(ARGV)
--@ack_batch
  end)(ack_args)
end
if fire_on then
  out[2] = (function(ARGV)
--@fire
  end)(fire_args)
end
if claim_on then
  out[3] = (function(ARGV)
--@claim
  end)(claim_args)
end
flush_stats()
return out
