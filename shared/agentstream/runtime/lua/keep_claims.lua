-- keep_claims.lua: renews the claims of a consumer's entries (claims.keep_claims).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: stream. ARGV: group, consumer, idle ms to set, then entry ids.
-- For each id still owned by the consumer: XCLAIM it to the same consumer with that idle time
-- and JUSTID (no delivery counted). Returns the ids still owned.

local kept = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    table.insert(kept, ARGV[i])
  end
end
return kept
