-- earlier_turns.lua: the entries before one entry of a turns stream that its consumer group has
-- delivered and not acknowledged, whose turn may name a trace (turn_order.EarlierTurns.read).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the turns stream. ARGV: the group, the entry in hand's id, where to start (an entry id,
-- inclusive, or '-'), the most pending entries to look at, the field that holds a turn, then the
-- marks (byte strings one of which a payload naming the trace holds: steps.turn_order.trace_marks).
-- Looks at the group's pending entries from the start up to the entry in hand (XPENDING, oldest
-- first, at most that many) and reads each (one XRANGE of one id); an entry whose turn field holds
-- one of the marks is returned whole. Only pending entries are looked at: an acknowledged one was
-- handled, so a long run of handled entries costs nothing.
-- Returns {where the next page starts ('' when the range was looked at whole), {{id, fields}...}}.

local count = tonumber(ARGV[4])
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[2], count)
local found = {}
local last = ''
for _, row in ipairs(pending) do
  local id = row[1]
  last = id
  if id ~= ARGV[2] then
    local entry = redis.call('XRANGE', KEYS[1], id, id)[1]
    if entry then
      local fields = entry[2]
      local hit = false
      for i = 1, #fields, 2 do
        if fields[i] == ARGV[5] then
          for m = 6, #ARGV do
            if string.find(fields[i + 1], ARGV[m], 1, true) then hit = true break end
          end
        end
        if hit then break end
      end
      if hit then table.insert(found, entry) end
    end
  end
end
local next_start = ''
if #pending == count and last ~= ARGV[2] then next_start = last end
return {next_start, found}
