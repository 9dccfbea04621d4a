-- take.lua: takes a trace's lease and reads what is new (store.TraceStore.take).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--

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

return take(ARGV[1], ARGV[2], tonumber(ARGV[3]))
