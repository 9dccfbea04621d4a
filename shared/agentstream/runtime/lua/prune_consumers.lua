-- prune_consumers.lua: deletes idle consumers that own nothing (claims.prune_consumers).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: stream. ARGV: group, idle ms threshold, a consumer name never to delete.
-- Deletes, in one atomic step with the check, every consumer idle at least that long that owns
-- no pending entries; returns their names.

local deleted = {}
local rows = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, row in ipairs(rows) do
  local info = {}
  for i = 1, #row, 2 do info[row[i]] = row[i + 1] end
  if info['name'] ~= ARGV[3] and tonumber(info['pending']) == 0 and tonumber(info['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    table.insert(deleted, info['name'])
  end
end
return deleted
