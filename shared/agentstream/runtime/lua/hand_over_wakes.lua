-- hand_over_wakes.lua: moves a gone owner's wake-ups to the partition's shared wake-up stream
-- (runtime.wake_routes; what moves: steps.wake_routes.to_move).
-- KEYS: the partition's owners set, the owner's stream, the shared stream, the attempts hash of
-- the owner's stream in the group (one hash slot).
-- ARGV: the owner, the consumer group, the most entries to move per call, '1' for the owner's
-- own hand-over at its stop (else only while the owner's expiry has passed).
-- Adds anew to the shared stream the entries of the owner's stream that its group has not
-- acknowledged (pending, or never delivered), each deleted from the owner's stream once moved;
-- when none is left, deletes the owner's stream and its attempts hash and takes the owner out of
-- the set. → {entries moved, 1 when the owner is gone from the set, 0 when more are left to move
-- (call again), -1 when the owner is alive again (nothing moved)}.
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
  return redis.error_reply('ERR hand_over_wakes: the stream is not the owner\'s')
end
if ARGV[4] ~= '1' then
  local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if expiry and tonumber(expiry) > now_ms() then
    return {0, -1}
  end
end
local count = tonumber(ARGV[3])
local moved = 0
local left = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  local last = nil
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local name, delivered = nil, nil
    for i = 1, #group, 2 do
      if group[i] == 'name' then
        name = group[i + 1]
      elseif group[i] == 'last-delivered-id' then
        delivered = group[i + 1]
      end
    end
    if name == ARGV[2] then
      last = delivered
    end
  end
  if last then
    local pending = redis.call('XPENDING', KEYS[2], ARGV[2], '-', '+', count)
    left = #pending >= count
    for _, p in ipairs(pending) do
      local entry = redis.call('XRANGE', KEYS[2], p[1], p[1])
      if #entry > 0 then
        redis.call('XADD', KEYS[3], '*', unpack(entry[1][2]))
        moved = moved + 1
      end
      redis.call('XACK', KEYS[2], ARGV[2], p[1])
      redis.call('XDEL', KEYS[2], p[1])
    end
  end
  local unread = redis.call('XRANGE', KEYS[2], '(' .. (last or '0-0'), '+', 'COUNT', count)
  left = left or #unread >= count
  for _, entry in ipairs(unread) do
    redis.call('XADD', KEYS[3], '*', unpack(entry[2]))
    redis.call('XDEL', KEYS[2], entry[1])
    moved = moved + 1
  end
end
if left then
  return {moved, 0}
end
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('ZREM', KEYS[1], ARGV[1])
return {moved, 1}
