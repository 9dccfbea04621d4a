-- forgive_owed.lua: forgets an owed reply unless noted again (watchdog).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the owed replies set. ARGV: trace id, the score it was read with. Removes the trace only
-- when no refusal noted it again meanwhile (a newer score).

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
