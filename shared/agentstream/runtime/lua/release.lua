-- release.lua: gives a trace's lease back, setting markers first (store.TraceStore.release).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: lease, dirty mark, the trace's key hash. ARGV: token, keep if dirty ('1'/'0'), then
-- markers to set in the key hash (whatever the lease's state: they record effects done already).

-- Giving a lease back: the markers first (whatever the lease's state: they record effects done
-- already), then 0 when the lease is not `token`'s, 2 when a hint came while it was held and it
-- is kept (the dirty mark cleared), else 1: released.
local function release(lease, dirty, keys_hash, token, keep_if_dirty, marks)
  for _, mark in ipairs(marks) do
    redis.call('HSET', keys_hash, mark, '1')
  end
  if redis.call('GET', lease) ~= token then
    return 0
  end
  if keep_if_dirty and redis.call('DEL', dirty) == 1 then
    return 2
  end
  redis.call('DEL', lease)
  return 1
end

local marks = {}
for i = 3, #ARGV do
  marks[#marks + 1] = ARGV[i]
end
return release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2] == '1', marks)
