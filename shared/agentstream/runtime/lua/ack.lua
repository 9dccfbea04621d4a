-- ack.lua: acknowledges handled entries and drops their counters (consumer.StreamConsumer).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--

-- KEYS: stream, attempts hash. ARGV: group, entry ids (at most ACK_BATCH). Acknowledges them
-- (one XACK) and drops their counters (one HDEL).
-- A Lua function, ``ack_entries(stream, counters, group, ids)``: the acknowledgement of handled entries as a consumer sends it (XACK, and HDEL of their attempts counters ``<id>`` and ``<id>:error``), for a script that acknowledges a handler's entry with its last write (:func:`current_delivery`).
local function ack_entries(stream, counters, group, ids)
  local fields = {}
  for _, id in ipairs(ids) do
    fields[#fields + 1] = id
    fields[#fields + 1] = id .. ':error'
  end
  redis.call('XACK', stream, group, unpack(ids))
  redis.call('HDEL', counters, unpack(fields))
end

local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
ack_entries(KEYS[1], KEYS[2], ARGV[1], ids)
return 0
