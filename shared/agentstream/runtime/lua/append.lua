-- append.lua: appends events to a trace once each, fenced (agentstream.runtime.store,
-- TraceStore.append); loaded once by agentstream.runtime.lua.script.
--
-- KEYS: trace stream, idempotency hash, lease, a run key ('' when none). ARGV: fence token
-- ('' = unfenced), version, after ('' = read nothing back), how many trailing events are
-- conditional, expiry in ms of the trace and its key hash when something is appended ('' =
-- none), the most entries read back, guard key ('' = none), the run key's holder ('' = none: the
-- run key is deleted when that holder still has it), then per event: its idempotency key, its
-- bytes, a count m, and m (field, value) markers set in the key hash when the event is appended.
-- The conditional events are appended only when no entry came after `after` before this call.
-- Returns {{status, id, ...}, first id, entries}: status 1 = appended, 0 = already there (id of
-- the first append), 2 = not appended (the condition failed), -1 = fenced off, -2 = the guard
-- key is there (nothing appended).

-- Entries after an id (exclusive), or from the first; and the trace's first entry id.
local function read_after(trace, after, count)
  local first = redis.call('XRANGE', trace, '-', '+', 'COUNT', 1)
  local first_id = ''
  if first[1] then first_id = first[1][1] end
  local start = '-'
  if after ~= '' then start = '(' .. after end
  return first_id, redis.call('XRANGE', trace, start, '+', 'COUNT', count)
end

-- Appends the events of ARGV[first_event...] (each: its idempotency key, its bytes, a count m,
-- and m (field, value) markers set in the key hash when the event is appended), fenced by
-- ARGV[1] and guarded by ARGV[7] as said above → the status and id of each event ({status, id,
-- ...}), or nil and the script's whole reply when it is fenced off or guarded.
local function append_events(first_event)
  if ARGV[1] ~= '' then
    local current = redis.call('GET', KEYS[3])
    if current ~= ARGV[1] then
      return nil, {{-1, current or ''}, '', {}}
    end
  end
  if ARGV[7] ~= '' then
    local guard = redis.call('HGET', KEYS[2], ARGV[7])
    if guard then
      return nil, {{-2, guard}, '', {}}
    end
  end
  local starts = {}
  local i = first_event
  while i <= #ARGV do
    table.insert(starts, i)
    i = i + 3 + 2 * tonumber(ARGV[i + 2])
  end
  local conditional_from = #starts + 1
  local n_then = tonumber(ARGV[4])
  if n_then > 0 then
    local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    local last_id = ''
    if last[1] then last_id = last[1][1] end
    if last_id == ARGV[3] then
      n_then = 0
    end
    conditional_from = #starts + 1 - n_then
  end
  local out = {}
  local created = false
  for n, i in ipairs(starts) do
    if n >= conditional_from then
      table.insert(out, 2)
      table.insert(out, '')
    else
      local existing = redis.call('HGET', KEYS[2], ARGV[i])
      if existing then
        table.insert(out, 0)
        table.insert(out, existing)
      else
        local id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[2], 'e', ARGV[i + 1], 'k', ARGV[i])
        redis.call('HSET', KEYS[2], ARGV[i], id)
        -- a turn's ending: it is no longer open (admit_turn.lua counts the open turns)
        if string.sub(ARGV[i], 1, 4) == 'end:' and redis.call('HDEL', KEYS[2], 'open:' .. string.sub(ARGV[i], 5)) == 1 then
          redis.call('HINCRBY', KEYS[2], 'open', -1)
        end
        for m = 1, tonumber(ARGV[i + 2]) do
          redis.call('HSET', KEYS[2], ARGV[i + 1 + 2 * m], ARGV[i + 2 + 2 * m])
        end
        table.insert(out, 1)
        table.insert(out, id)
        created = true
      end
    end
  end
  if created and ARGV[5] ~= '' then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
  if ARGV[8] ~= '' and redis.call('GET', KEYS[4]) == ARGV[8] then
    redis.call('DEL', KEYS[4])
  end
  return out
end

local out, refused = append_events(9)
if refused then
  return refused
end
if ARGV[3] == '' then
  return {out, '', {}}
end
local first_id, entries = read_after(KEYS[1], ARGV[3], tonumber(ARGV[6]))
return {out, first_id, entries}
