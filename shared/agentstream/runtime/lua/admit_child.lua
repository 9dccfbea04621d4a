-- admit_child.lua: admits a child trace under its root's limit (operations.admit_child).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the root trace's descendants set. ARGV: the child trace id, the limit.
-- 1 = admitted (now, or before), 0 = the root already has ``limit`` descendants.

if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
