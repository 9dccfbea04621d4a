-- route_wake.lua: sends a wake-up to its owner's stream while the owner is alive, else to the
-- partition's shared wake-up stream (operations.RoutedWake; the rule: steps.wake_routes.route).
-- KEYS: the partition's owners set (<wake partition>:owners:{<wake partition>}), the owner's stream
-- (<wake partition>:to:{<wake partition>}:<owner>), the shared stream (<wake partition>): one hash slot.
-- ARGV: the owner, then the entry's fields and values. → {the stream written, the entry id}.
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

local target = KEYS[3]
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now_ms() and KEYS[2] == owned_stream(KEYS[1], ARGV[1]) then
  target = KEYS[2]
end
return {target, redis.call('XADD', target, '*', unpack(ARGV, 2))}
