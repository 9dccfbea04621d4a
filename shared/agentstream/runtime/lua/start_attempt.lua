-- start_attempt.lua: renews an entry's claim and counts a start (claims.start_attempt).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: stream, its attempts hash (same slot). ARGV: group, consumer, entry id, refund.
-- Confirms the consumer still owns the entry and renews its claim (XCLAIM JUSTID), then counts
-- one start (less the refund) → the starts so far, or 0 when the entry is no longer ours.

-- The attempt counter of an entry: ``entry id → handler starts``. A field that is absent for an
-- entry in the pending entries list means one start: an entry read new (XREADGROUP ``>``) starts
-- at once, and that first start is not written down (it would cost a command per entry); every
-- later start, and every start given back, writes the count.
local function count(attempts, entry, delta)
  local n = tonumber(redis.call('HGET', attempts, entry) or '1') + tonumber(delta)
  redis.call('HSET', attempts, entry, n)
  return n
end

local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', 0, 'JUSTID')
return count(KEYS[2], ARGV[3], 1 - tonumber(ARGV[4]))
