-- count_attempts.lua: counts an attempt of an entry (claims.count_attempt).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: attempts hash. ARGV: entry id, delta.

-- The attempt counter of an entry: ``entry id → handler starts``. A field that is absent for an
-- entry in the pending entries list means one start: an entry read new (XREADGROUP ``>``) starts
-- at once, and that first start is not written down (it would cost a command per entry); every
-- later start, and every start given back, writes the count.
local function count(attempts, entry, delta)
  local n = tonumber(redis.call('HGET', attempts, entry) or '1') + tonumber(delta)
  redis.call('HSET', attempts, entry, n)
  return n
end

return count(KEYS[1], ARGV[1], ARGV[2])
