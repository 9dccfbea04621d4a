-- acquire.lua: takes a trace's lease when free (store.TraceStore.acquire). KEYS: the trace's key hash,
-- the lease. ARGV: lease ttl in ms. → the new token, or false when the lease is held.
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--

-- The fencing token of a new lease: a counter per trace in its key hash (no global hot key). A new
-- counter (a new trace, or one deleted by retention and started again) starts at the server's
-- clock in microseconds, so a token never repeats one issued to the same trace id before.
local function next_fence(keys_hash)
  local n = redis.call('HINCRBY', keys_hash, 'fence', 1)
  if n == 1 then
    local t = redis.call('TIME')
    n = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('HSET', keys_hash, 'fence', string.format('%d', n))
  end
  return n
end

if redis.call('EXISTS', KEYS[2]) == 1 then
  return false
end
local token = string.format('%d', next_fence(KEYS[1]))
redis.call('SET', KEYS[2], token, 'PX', ARGV[1])
return token
