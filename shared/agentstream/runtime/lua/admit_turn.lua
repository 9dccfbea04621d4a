-- admit_turn.lua: admits a turn into its trace once, and takes the lease (store.TraceStore.admit_turn).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: trace stream, idempotency hash, lease, dirty mark. ARGV: turn id, the turn entry's id,
-- version, the TurnInput's bytes, expiry in ms ('' = none), take the lease ('1'/'0'), lease ttl
-- in ms, after, the most entries read, the turn's digest ('' = none), the most turns admitted and
-- not ended ('' = no cap). A turn that ended before:
-- {'ended', entry that first brought it, absorbed, differs}. Else the turn is appended once
-- (`entry:<turn>` remembers the entry that brought it, `digest:<turn>` its digest) and, when
-- asked, the trace taken as take.lua does: {'turn', created, take's reply or {}, differs}.
-- Another entry bringing a turn that is in the trace and has not ended is a copy published
-- before the turn's ending: `copy:<turn>:<entry>` records it in the same step as the ending
-- is checked, so whenever that entry comes back (deferred, re-delivered) it is absorbed, not
-- answered again. `absorbed`: this entry was recorded so; `differs`: its digest is not the
-- admitted turn's (said once per copy entry, the first time it is recorded, and for each
-- entry that finds the turn ended).
-- Open turns: `open:<turn>` marks a turn admitted here and `open` counts them; append.lua
-- clears the mark and counts down when the turn's ending is appended. A new turn
-- that finds `open` at the cap is not appended: {'full', open} (steps.machine.queue_full_refusal).

-- The fencing token of a new lease: a counter per trace in its key hash (no global hot key). A new
-- counter (a new trace, or one deleted by retention and started again) starts at the server's
-- clock in microseconds, so a token never repeats one issued to the same trace id before.
local function next_fence(keys_hash)
  local n = redis.call('HINCRBY', keys_hash, 'fence', 1)
  if n == 1 then
    local t = redis.call('TIME')
    n = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('HSET', keys_hash, 'fence', string.format('%d', n))
  end
  return n
end

-- Entries after an id (exclusive), or from the first; and the trace's first entry id.
local function read_after(trace, after, count)
  local first = redis.call('XRANGE', trace, '-', '+', 'COUNT', 1)
  local first_id = ''
  if first[1] then first_id = first[1][1] end
  local start = '-'
  if after ~= '' then start = '(' .. after end
  return first_id, redis.call('XRANGE', trace, start, '+', 'COUNT', count)
end

-- KEYS: trace stream, idempotency hash, lease, dirty mark. ARGV: lease ttl in ms, after ('' =
-- from the first entry), the most entries read. Takes the lease when it is free and reads what
-- came after `after`: {1, token, first id, entries}. When another holds it, marks the trace
-- dirty (its holder looks again before it lets go): {0, holder's token, ms left}. A trace with
-- no stream is not taken: {2}.
local function take(ttl_ms, after, count)
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return {2}
  end
  local holder = redis.call('GET', KEYS[3])
  if holder then
    redis.call('SET', KEYS[4], '1', 'PX', tonumber(ttl_ms) * 4)
    return {0, holder, redis.call('PTTL', KEYS[3])}
  end
  local token = next_fence(KEYS[2])
  redis.call('SET', KEYS[3], string.format('%d', token), 'PX', ttl_ms)
  redis.call('DEL', KEYS[4])
  local first_id, entries = read_after(KEYS[1], after, count)
  return {1, string.format('%d', token), first_id, entries}
end

local turn = ARGV[1]
local digest = redis.call('HGET', KEYS[2], 'digest:' .. turn)
local differs = 0
if ARGV[10] ~= '' and digest and digest ~= ARGV[10] then differs = 1 end
if redis.call('HEXISTS', KEYS[2], 'end:' .. turn) == 1 then
  return {'ended', redis.call('HGET', KEYS[2], 'entry:' .. turn) or '',
          redis.call('HEXISTS', KEYS[2], 'copy:' .. turn .. ':' .. ARGV[2]), differs}
end
local present = redis.call('HEXISTS', KEYS[2], 'turn:' .. turn)
if present == 0 and ARGV[11] and ARGV[11] ~= '' then
  local open = tonumber(redis.call('HGET', KEYS[2], 'open') or '0')
  if open >= tonumber(ARGV[11]) then
    redis.call('HSETNX', KEYS[2], 'entry:' .. turn, ARGV[2])  -- its re-delivery is not a re-publish
    return {'full', open}
  end
end
redis.call('HSETNX', KEYS[2], 'entry:' .. turn, ARGV[2])
local created = 0
if present == 0 then
  redis.call('HSET', KEYS[2], 'open:' .. turn, '1')
  redis.call('HINCRBY', KEYS[2], 'open', 1)
  local id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[3], 'e', ARGV[4], 'k', 'turn:' .. turn)
  redis.call('HSET', KEYS[2], 'turn:' .. turn, id)
  if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'digest:' .. turn, ARGV[10]) end
  created = 1
  if ARGV[5] ~= '' then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
elseif redis.call('HGET', KEYS[2], 'entry:' .. turn) ~= ARGV[2] then
  if redis.call('HSET', KEYS[2], 'copy:' .. turn .. ':' .. ARGV[2], '1') == 0 then differs = 0 end
end
if ARGV[6] ~= '1' then
  return {'turn', created, {}, differs}
end
return {'turn', created, take(ARGV[7], ARGV[8], tonumber(ARGV[9])), differs}
