-- append.lua: appends events to a trace once each, fenced, and optionally publishes what the
-- step leaves waiting and gives the lease back in the same script (agentstream.runtime.store:
-- TraceStore.append_and_read, TraceStore.apply); loaded once by agentstream.runtime.lua.script.
--
-- KEYS: trace stream, idempotency hash, lease, a run key (the trace stream when none); with a
-- publication, then: the dirty mark, the awaiting set, the work stream and the attempts counter
-- of the entry the step handles (acknowledged when the lease is released: the handler's work is
-- done), and the stream of each entry published (other hash slots: one server, not a cluster).
-- ARGV: fence token ('' = unfenced), version, after ('' = read nothing back), how many trailing
-- events are conditional, expiry in ms of the trace and its key hash when something is appended
-- ('' = none), the most entries read back, guard key ('' = none), the run key's holder ('' =
-- none: the run key is deleted when that holder still has it), the count P of publication
-- arguments (0 = no publication), the P publication arguments, then per event: its idempotency
-- key, its bytes, a count m, and m (field, value) markers set in the key hash when the event is
-- appended. The publication arguments: the trace id, the awaited time in ms ('' = no watchdog
-- record), the consumer group and the id of the entry to acknowledge ('' = none), the count of
-- markers and the markers, then per entry its call id ('' = not a tool job), turn id, field and
-- payload.
--
-- The conditional events are appended only when no entry came after `after` before this call.
-- The entries are published only when every event was appended by this call under a fence and no
-- entry came after `after` before it (the step decided them from the trace up to `after`, under
-- the lease checked first); then the markers that say they went out are set, the jobs recorded
-- for the watchdog (entries with a call id: the `awaited` field, the trace in the awaiting set),
-- and the lease released, or kept when a hint came meanwhile (its dirty mark cleared).
--
-- Returns {{status, id, ...}, first id, entries}: status 1 = appended, 0 = already there (id of
-- the first append), 2 = not appended (the condition failed), -1 = fenced off, -2 = the guard
-- key is there (nothing appended; both with '' and {} and nothing more). With a publication,
-- three more: its outcome (0 = not published, 1 = published and released, 2 = published and the
-- lease kept; -3 = a stream, or the awaiting set, holds another type, checked before any XADD,
-- or an XADD failed, with its error: no marker set, the lease held), the entry ids (or the
-- error), and 1 when the work entry was acknowledged (with a release, its stream a stream and
-- its counters a hash).

-- Entries after an id (exclusive), or from the first; and the trace's first entry id.
local function read_after(trace, after, count)
  local first = redis.call('XRANGE', trace, '-', '+', 'COUNT', 1)
  local first_id = ''
  if first[1] then first_id = first[1][1] end
  local start = '-'
  if after ~= '' then start = '(' .. after end
  return first_id, redis.call('XRANGE', trace, start, '+', 'COUNT', count)
end

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

-- The id of the trace's last entry ('' for an empty trace).
local function last_entry(trace)
  local last = redis.call('XREVRANGE', trace, '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return ''
end

-- Appends the events of ARGV[first_event...] (each: its idempotency key, its bytes, a count m,
-- and m (field, value) markers set in the key hash when the event is appended), fenced by
-- ARGV[1] and guarded by ARGV[7] as said above; `untouched` says whether the trace's last entry
-- was still ARGV[3] before this call (nil: not looked at, no conditional events) → the status
-- and id of each event ({status, id, ...}), or nil and the script's whole reply when it is
-- fenced off or guarded.
local function append_events(first_event, untouched)
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
  if not untouched then
    conditional_from = #starts + 1 - tonumber(ARGV[4])
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

-- Whether `key` holds a type other than `kind` (a missing key holds none).
local function refuses(key, kind)
  local t = redis.call('TYPE', key)['ok']
  return t ~= 'none' and t ~= kind
end

-- Publishes the entries of the publication arguments (ARGV[10...], as said above), sets their
-- markers, records the jobs for the watchdog, releases the lease and acknowledges the work entry
-- → the outcome, the entry ids (or the error) and 1 when the work entry was acknowledged.
local function publish()
  local n_marks = tonumber(ARGV[14])
  local record = {}
  local a = 15 + n_marks
  for j = 9, #KEYS do
    if refuses(KEYS[j], 'stream') then
      return -3, {'WRONGTYPE ' .. KEYS[j] .. ' holds no stream'}, 0
    end
  end
  if ARGV[11] ~= '' and refuses(KEYS[6], 'zset') then
    return -3, {'WRONGTYPE ' .. KEYS[6] .. ' holds no sorted set'}, 0
  end
  local entry_ids = {}
  for j = 9, #KEYS do
    local id = redis.pcall('XADD', KEYS[j], '*', ARGV[a + 2], ARGV[a + 3])
    if type(id) == 'table' and id.err then
      return -3, {id.err}, 0
    end
    table.insert(entry_ids, id)
    if ARGV[a] ~= '' then table.insert(record, {ARGV[a + 1], ARGV[a], KEYS[j], id}) end
    a = a + 4
  end
  if ARGV[11] ~= '' and #record > 0 then
    redis.call('HSET', KEYS[2], 'awaited', cjson.encode(record))
    redis.call('ZADD', KEYS[6], ARGV[11], ARGV[10])
  end
  local marks = {}
  for m = 15, 14 + n_marks do
    marks[#marks + 1] = ARGV[m]
  end
  local published = release(KEYS[3], KEYS[5], KEYS[2], ARGV[1], true, marks)
  if published == 1 and ARGV[13] ~= '' and not refuses(KEYS[7], 'stream') and not refuses(KEYS[8], 'hash') then
    ack_entries(KEYS[7], KEYS[8], ARGV[12], {ARGV[13]})
    return published, entry_ids, 1
  end
  return published, entry_ids, 0
end

local n_publish = tonumber(ARGV[9])
local untouched = nil
if n_publish > 0 or tonumber(ARGV[4]) > 0 then
  untouched = last_entry(KEYS[1]) == ARGV[3]
end
local out, refused = append_events(10 + n_publish, untouched)
if refused then
  return refused
end
if n_publish == 0 then
  if ARGV[3] == '' then
    return {out, '', {}}
  end
  local first_id, entries = read_after(KEYS[1], ARGV[3], tonumber(ARGV[6]))
  return {out, first_id, entries}
end

local published, entry_ids, acked = 0, {}, 0
local all_new = untouched and ARGV[1] ~= '' and #out > 0
for n = 1, #out, 2 do
  if out[n] ~= 1 then all_new = false end
end
if all_new then
  published, entry_ids, acked = publish()
end
local first_id, entries = read_after(KEYS[1], ARGV[3], tonumber(ARGV[6]))
return {out, first_id, entries, published, entry_ids, acked}
