-- forget_awaited.lua: forgets a trace's awaited record unless re-scored (watchdog).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: awaiting set. ARGV: member, score seen. Removes the member only if its score is still
-- the one seen (a newer publish re-scored it meanwhile: it stays).

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
