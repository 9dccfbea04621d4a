-- note_conversation.lua: notes a conversation in the index (conversations.note_conversation).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the index. ARGV: time (Unix ms), trace id, how many to keep. The index is trimmed only
-- when it grew (a conversation it did not hold), so a turn of a listed one costs one ZADD.

if redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[3]) - 1)
end
return 0
