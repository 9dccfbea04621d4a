-- renew.lua: renews a lease that is still `token`'s (store.TraceStore.renew). KEYS: lease. ARGV: token,
-- ttl in ms. → 1 renewed, 0 not ours.
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
