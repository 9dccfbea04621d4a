-- begin_call.lua: checks and claims a tool call for a job, and its run key (store.TraceStore.begin_call).
-- Loaded once by agentstream.runtime.lua.script; one Lua script, readable whole.
--
-- KEYS: the trace's key hash, the trace stream, the call's run key. ARGV: call id, turn id,
-- job ref, tool name, runner ('' = take no run key), run key ttl in ms, '1' when the caller
-- checked the call itself (no marker check), the digest of the job's arguments ('' = not
-- checked), '1' when any tool will do (the name is not checked; an empty name is a name).
-- First the job must name a call that may run: {'no_trace'}, {'no_turn'}, {'unchecked', turn
-- entry} (no marker of the call), {'other', marker} (the call is another turn's or tool's),
-- {'arguments', marker} (the call was made with other arguments; a marker written before
-- markers had a digest, `<turn>\n<tool>`, answers 'unchecked' when the arguments are to be
-- checked: the caller reads the turn). Then the call is claimed for the job unless it is
-- answered, its turn is cancelled or over, or another job holds it; and a claimed call's run
-- key is taken for the runner unless another runner holds it:
-- {'ok', result, cancelled, ended, started, holder, run holder, ms left}. A call that awaits a
-- person's approval, or was denied it (its `gate:<call id>` mark is '1'), is never claimed:
-- {'unapproved'}.

local h = KEYS[1]
local call, turn = ARGV[1], ARGV[2]
local ended = redis.call('HEXISTS', h, 'end:' .. turn)
if ARGV[7] ~= '1' then
  if redis.call('EXISTS', KEYS[2]) == 0 then return {'no_trace'} end
  local entry = redis.call('HGET', h, 'turn:' .. turn)
  if not entry then return {'no_turn'} end
  local made = redis.call('HGET', h, 'call:' .. call)
  if not made then return {'unchecked', entry} end
  local marker = made
  local want = turn .. '\n' .. ARGV[4]
  if ARGV[9] == '1' then
    made, want = string.sub(made, 1, #turn + 1), turn .. '\n'
  elseif string.sub(made, 1, #want + 1) == want .. '\n' then  -- the call's arguments digest follows
    if ARGV[8] ~= '' and string.sub(made, #want + 2) ~= ARGV[8] then return {'arguments', marker} end
    made = want
  elseif made == want and ARGV[8] ~= '' then  -- no digest: its arguments are checked in the turn's events
    return {'unchecked', entry}
  end
  if made ~= want then return {'other', marker} end
end
if redis.call('HGET', h, 'gate:' .. call) == '1' then return {'unapproved'} end
local result = redis.call('HEXISTS', h, 'result:' .. call)
local cancelled = redis.call('HEXISTS', h, 'cancel:' .. turn)
local started = redis.call('HEXISTS', h, 'started:' .. call)
local holder = redis.call('HGET', h, 'claim:' .. call)
local live = result == 0 and cancelled == 0 and ended == 0
if not holder and live then
  redis.call('HSET', h, 'claim:' .. call, ARGV[3])
  holder = ARGV[3]
end
local runner, left = '', 0
if live and holder == ARGV[3] and ARGV[5] ~= '' then
  local current = redis.call('GET', KEYS[3])
  if current and current ~= ARGV[5] then
    runner, left = current, redis.call('PTTL', KEYS[3])
  else
    redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
    runner = ARGV[5]
  end
end
return {'ok', result, cancelled, ended, started, holder or '', runner, left}
