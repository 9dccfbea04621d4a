-- beat_wake_owner.lua: an agent-loop consumer says it is alive in one partition (runtime.wake_routes).
-- KEYS: the partition's owners set, the consumer's own wake-up stream (one hash slot).
-- ARGV: the owner, its liveness in ms, the consumer group, the most stale owners to return.
-- Creates the owner's stream and group when missing (before it is named alive, so a wake-up
-- routed to it is read from the group's start), sets its expiry to now + liveness, and returns
-- the owners whose expiry has passed (steps.wake_routes.stale_owners), the earliest first.
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--

-- Now on the server's clock, in Unix ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The owner's stream as the owners set names it: a key that is not it is never written.
-- (<wake partition>:owners:{<wake partition>} → <wake partition>:to:{<wake partition>}:<owner>)
local function owned_stream(owners, owner)
  local at = string.find(owners, ':owners:{', 1, true)
  if not at then
    return ''
  end
  return string.sub(owners, 1, at - 1) .. ':to:' .. string.sub(owners, at + #':owners:') .. ':' .. owner
end

if KEYS[2] ~= owned_stream(KEYS[1], ARGV[1]) then
  return redis.error_reply('ERR beat_wake_owner: the stream is not the owner\'s')
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[3], '0', 'MKSTREAM')
end
local now = now_ms()
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
