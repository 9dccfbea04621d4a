-- fork.lua: starts a forked conversation: its first event and the copied history, in one step,
-- once per fork (runtime.forks.fork_conversation; steps.forking decides what is copied).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the fork's trace stream, its idempotency hash. ARGV: the fork's point (what it was
-- forked from, as one string), version, the turn the fork holds open ('' = none), expiry in ms of
-- the trace and its key hash ('' = none), then per event: its idempotency key, its bytes, a
-- count m, and m (field, value) markers set in the key hash with it (as append.lua takes them).
-- A trace forked before (`forked` in its key hash): {'forked', its point, its first entry id},
-- nothing written. Any other trace that exists: {'exists'}, nothing written. Else the events are
-- appended in order (each key set to its entry id, as append.lua does), `forked` set to the
-- point, and the open turn counted open as admit_turn.lua counts an admitted turn (`open:<turn>`
-- and `open`; append.lua counts it down at its ending): {'created', first entry id, count}.

local point = redis.call('HGET', KEYS[2], 'forked')
if point then
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  local first_id = ''
  if first[1] then first_id = first[1][1] end
  return {'forked', point, first_id}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'exists'}
end
local first_id = ''
local count = 0
local i = 5
while i <= #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[2], 'e', ARGV[i + 1], 'k', ARGV[i])
  if first_id == '' then first_id = id end
  redis.call('HSET', KEYS[2], ARGV[i], id)
  for m = 1, tonumber(ARGV[i + 2]) do
    redis.call('HSET', KEYS[2], ARGV[i + 1 + 2 * m], ARGV[i + 2 + 2 * m])
  end
  count = count + 1
  i = i + 3 + 2 * tonumber(ARGV[i + 2])
end
redis.call('HSET', KEYS[2], 'forked', ARGV[1])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], 'open:' .. ARGV[3], '1')
  redis.call('HINCRBY', KEYS[2], 'open', 1)
end
if ARGV[4] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return {'created', first_id, count}
