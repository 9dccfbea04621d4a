-- keep_run.lua: renews or deletes a call's run key when ours (call_runs.CallRuns).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: run key. ARGV: runner, ttl ms ('0' = delete). Renews or deletes the key when ours.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
