-- trim_acknowledged.lua: trims a work stream below what every group acknowledged (retention).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: stream. ARGV: '1' = approximate (~) trim, '0' = exact.
-- Returns {removed, threshold} where threshold is the MINID used ('' when nothing was trimmed).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, ''}
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  return {0, ''}
end
local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function less(a_ms, a_seq, b_ms, b_seq)
  return a_ms < b_ms or (a_ms == b_ms and a_seq < b_seq)
end
local best_ms, best_seq = nil, nil
for _, g in ipairs(groups) do
  local name, last
  for j = 1, #g, 2 do
    if g[j] == 'name' then name = g[j + 1] end
    if g[j] == 'last-delivered-id' then last = g[j + 1] end
  end
  -- the first id after the last delivered one: everything from there is undelivered
  local ms, seq = parse(last)
  seq = seq + 1
  local summary = redis.call('XPENDING', KEYS[1], name)
  if summary[1] > 0 then
    local p_ms, p_seq = parse(summary[2])
    if less(p_ms, p_seq, ms, seq) then
      ms, seq = p_ms, p_seq
    end
  end
  if best_ms == nil or less(ms, seq, best_ms, best_seq) then
    best_ms, best_seq = ms, seq
  end
end
local threshold = string.format('%d-%d', best_ms, best_seq)
local removed
if ARGV[1] == '1' then
  removed = redis.call('XTRIM', KEYS[1], 'MINID', '~', threshold)
else
  removed = redis.call('XTRIM', KEYS[1], 'MINID', threshold)
end
return {removed, threshold}
