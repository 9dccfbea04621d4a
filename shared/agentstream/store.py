"""The trace store: the only code that reads and writes traces in Redis.

A trace is one Redis stream (``Keys.trace``). Every append carries an idempotency key; the check
and the XADD run in one Lua script on keys of the same hash slot, so an effect is recorded once
however often the step that makes it runs. An append may also carry a fencing token: it then
succeeds only while that token is the trace's current lease (a stale holder cannot append).

Idempotency keys used by the services (see :func:`key_for`):

- ``turn:<turn_id>`` for TurnInput, ``model:<turn_id>:<step>`` for ModelOutput,
  ``result:<call_id>`` for ToolOutput (``late:<call_id>`` for a late one: a call has one
  result), ``end:<turn_id>`` for TurnEnded and TurnFailed (a turn has one ending),
  ``started:<call_id>`` for ToolStarted, ``cancel:<turn_id>`` for CancelRequested.

Besides appends, :meth:`TraceStore.begin_call` claims a tool call for one tool job (the
``claim:<call_id>`` marker), so a call published or delivered twice runs once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from agentstream import codec
from agentstream.errors import StaleLeaseError
from agentstream.events import (
    CancelRequested,
    Event,
    ModelOutput,
    ToolOutput,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.keys import Keys

# KEYS: trace stream, idempotency hash, lease. ARGV: fence token ('' = unfenced), version,
# then (idempotency key, event bytes) pairs. Returns {status, id, status, id, ...}:
# status 1 = appended, 0 = already there (id of the first append), -1 = fenced off.
_APPEND_LUA = """
if ARGV[1] ~= '' then
  local current = redis.call('GET', KEYS[3])
  if current ~= ARGV[1] then
    return {-1, current or ''}
  end
end
local out = {}
for i = 3, #ARGV, 2 do
  local existing = redis.call('HGET', KEYS[2], ARGV[i])
  if existing then
    table.insert(out, 0)
    table.insert(out, existing)
  else
    local id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[2], 'e', ARGV[i + 1], 'k', ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], id)
    table.insert(out, 1)
    table.insert(out, id)
  end
end
return out
"""


def key_for(event: Event) -> str:
    """The idempotency key of an event (see the module docstring)."""
    match event:
        case TurnInput(turn_id=turn_id):
            return f"turn:{turn_id}"
        case ModelOutput(turn_id=turn_id, step=step):
            return f"model:{turn_id}:{step}"
        case ToolOutput(call_id=call_id, late=late):
            return f"late:{call_id}" if late else f"result:{call_id}"
        case TurnEnded(turn_id=turn_id) | TurnFailed(turn_id=turn_id):
            return f"end:{turn_id}"
        case ToolStarted(call_id=call_id):
            return f"started:{call_id}"
        case CancelRequested(turn_id=turn_id):
            return f"cancel:{turn_id}"
    raise TypeError(f"no idempotency key for event type {type(event).__name__}")


@dataclass(frozen=True)
class Appended:
    """The outcome of one append.

    Attributes:
        entry_id: the stream id of the event (the first append's id when it was already there).
        created: False when an event with the same idempotency key was already in the trace.
    """

    entry_id: str
    created: bool


@dataclass(frozen=True)
class CallState:
    """What the trace says about a tool call when a job for it arrives (:meth:`TraceStore.begin_call`).

    Attributes:
        has_result: the call already has its result.
        cancelled: its turn was cancelled.
        turn_ended: its turn has ended.
        started: a ToolStarted was recorded (a tool with side effects began running it).
        holder: the job (``<stream>/<entry id>``) that holds the call's claim, or ``""``.
        claimed: this job holds the claim (it was free, or this job took it before).
    """

    has_result: bool
    cancelled: bool
    turn_ended: bool
    started: bool
    holder: str
    claimed: bool

    @property
    def should_skip(self) -> bool:
        """Nothing to run: answered already, or its turn is over or being cancelled."""
        return self.has_result or self.cancelled or self.turn_ended


# KEYS: the trace's key hash. ARGV: call id, turn id, job ref. Claims the call for the job
# unless it is answered, its turn is cancelled or over, or another job holds it.
_BEGIN_CALL_LUA = """
local h = KEYS[1]
local result = redis.call('HEXISTS', h, 'result:' .. ARGV[1])
local cancelled = redis.call('HEXISTS', h, 'cancel:' .. ARGV[2])
local ended = redis.call('HEXISTS', h, 'end:' .. ARGV[2])
local started = redis.call('HEXISTS', h, 'started:' .. ARGV[1])
local holder = redis.call('HGET', h, 'claim:' .. ARGV[1])
if not holder and result == 0 and cancelled == 0 and ended == 0 then
  redis.call('HSET', h, 'claim:' .. ARGV[1], ARGV[3])
  holder = ARGV[3]
end
return {result, cancelled, ended, started, holder or ''}
"""


class TraceStore:
    """Reads and writes traces.

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        keys: the key names (namespace).
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys | None = None):
        self.redis = redis
        self.keys = keys or Keys()
        self._append_script = redis.register_script(_APPEND_LUA)

    async def append(self, trace_id: str, event: Event, *, key: str | None = None, fence: int | None = None) -> Appended:
        """Append one event once.

        Args:
            trace_id: the trace.
            event: the event.
            key: the idempotency key; defaults to :func:`key_for` of the event.
            fence: the fencing token of the caller's lease, or None for an unfenced append.

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease.
        """
        (result,) = await self.append_many(trace_id, [event], keys=[key] if key else None, fence=fence)
        return result

    async def append_many(
        self,
        trace_id: str,
        events: Sequence[Event],
        *,
        keys: Sequence[str] | None = None,
        fence: int | None = None,
    ) -> list[Appended]:
        """Append several events in order, each once, in one round trip and atomically.

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease (nothing is appended).
        """
        if not events:
            return []
        idem = list(keys) if keys is not None else [key_for(e) for e in events]
        argv: list[bytes | str] = ["" if fence is None else str(fence), codec._VERSION_BYTES]
        for k, event in zip(idem, events, strict=True):
            argv.append(k)
            argv.append(codec.encode(event))
        k = self.keys
        raw = await self._append_script(keys=[k.trace(trace_id), k.trace_keys(trace_id), k.lease(trace_id)], args=argv)
        if raw and int(raw[0]) == -1:
            holder = raw[1].decode() if isinstance(raw[1], bytes) else raw[1]
            raise StaleLeaseError(
                f"trace {trace_id!r}: append fenced off (token {fence}, current lease {holder or 'none'}); "
                "another worker now holds this trace"
            )
        out = []
        for i in range(0, len(raw), 2):
            entry_id = raw[i + 1].decode() if isinstance(raw[i + 1], bytes) else raw[i + 1]
            out.append(Appended(entry_id=entry_id, created=int(raw[i]) == 1))
        return out

    async def append_result(self, trace_id: str, result: ToolOutput) -> tuple[Appended, bool]:
        """Append a tool result once per call; one that finds the call answered is kept as late.

        Returns:
            ``(appended, late)``: ``late`` is True when the call already had a result (cancelled,
            outcome unknown, dead letter), so this one was recorded with ``late`` set.
        """
        appended = await self.append(trace_id, result)
        if appended.created:
            return appended, False
        return await self.append(trace_id, msgspec.structs.replace(result, late=True)), True

    async def begin_call(self, trace_id: str, turn_id: str, call_id: str, job: str) -> CallState:
        """Look at a tool call and claim it for ``job`` (``<stream>/<entry id>``), in one step.

        The claim is taken only when the call has no result and its turn is neither cancelled
        nor over; once taken it stays with that job (a re-delivery of the same job finds it
        ``claimed``; a second job for the same call finds another ``holder``).
        """
        raw = await self.redis.eval(_BEGIN_CALL_LUA, 1, self.keys.trace_keys(trace_id), call_id, turn_id, job)
        holder = raw[4].decode() if isinstance(raw[4], bytes) else raw[4]
        return CallState(
            has_result=bool(int(raw[0])),
            cancelled=bool(int(raw[1])),
            turn_ended=bool(int(raw[2])),
            started=bool(int(raw[3])),
            holder=holder,
            claimed=holder == job,
        )

    async def keep_for(self, trace_id: str, seconds: float) -> None:
        """Delete the whole trace (events, keys, lease) ``seconds`` from now, unless renewed.

        The runtime never trims a trace; this is the explicit retention of whole conversations
        (setting ``AGENTSTREAM_TRACE_RETENTION_S``), renewed each time a turn of it ends.
        """
        ms = max(1, int(seconds * 1000))
        pipe = self.redis.pipeline(transaction=False)
        for key in (self.keys.trace(trace_id), self.keys.trace_keys(trace_id)):
            pipe.pexpire(key, ms)
        await pipe.execute()

    async def has_key(self, trace_id: str, key: str) -> bool:
        """Whether an append with this idempotency key is in the trace."""
        return bool(await self.redis.hexists(self.keys.trace_keys(trace_id), key))

    async def read(self, trace_id: str, *, after: str | None = None, count: int | None = None) -> list[tuple[str, Event]]:
        """The trace's events ``[(entry id, event)]`` in order, after ``after`` (exclusive).

        Raises:
            SchemaVersionError, EventDecodeError: an entry cannot be read.
        """
        start = f"({after}" if after else "-"
        entries = await self.redis.xrange(self.keys.trace(trace_id), min=start, max="+", count=count)
        return codec.decode_entries(entries, trace_id=trace_id)

    async def exists(self, trace_id: str) -> bool:
        """Whether the trace has any event."""
        return bool(await self.redis.exists(self.keys.trace(trace_id)))

    async def follow(
        self, trace_id: str, *, after: str = "0-0", block_ms: int = 1000, stop: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, Event]]:
        """Yield the trace's events after ``after`` as they are appended (blocking reads).

        Runs until the consumer stops iterating or ``stop`` is set. ``block_ms`` is the longest
        one XREAD waits before checking ``stop`` again.
        """
        last = after
        stream = self.keys.trace(trace_id)
        while stop is None or not stop.is_set():
            reply = await self.redis.xread({stream: last}, block=block_ms, count=500)
            for _stream, entries in reply or ():
                for entry_id, event in codec.decode_entries(entries, trace_id=trace_id):
                    last = entry_id
                    yield entry_id, event

    # --- the lease: one step at a time per trace --------------------------------------------

    async def acquire_lease(self, trace_id: str, *, ttl_ms: int) -> int | None:
        """Take the trace's lease for ``ttl_ms`` → its fencing token, or None when held.

        Fencing tokens increase across the whole namespace, so a newer holder always has a
        larger token than an older one.
        """
        token = int(await self.redis.incr(self.keys.fence))
        ok = await self.redis.set(self.keys.lease(trace_id), str(token), nx=True, px=ttl_ms)
        return token if ok else None

    async def renew_lease(self, trace_id: str, token: int, *, ttl_ms: int) -> bool:
        """Extend a held lease by ``ttl_ms``; False when the lease is no longer ours."""
        return bool(await self.redis.eval(_RENEW_LUA, 1, self.keys.lease(trace_id), str(token), ttl_ms))

    async def release_lease(self, trace_id: str, token: int, *, keep_if_dirty: bool = True) -> str:
        """Give the lease back, unless a hint came while it was held.

        Args:
            keep_if_dirty: False gives the lease back whatever came meanwhile (a worker that
                stops or fails mid-step), leaving the dirty mark for the next holder.

        Returns:
            ``"released"``; or ``"dirty"`` when a hint arrived meanwhile (the mark is cleared,
            the lease is kept: look at the trace again, then release); or ``"lost"`` when the
            lease is no longer ours (it expired and perhaps another worker took it).
        """
        k = self.keys
        code = int(
            await self.redis.eval(_RELEASE_LUA, 2, k.lease(trace_id), k.dirty(trace_id), str(token), "1" if keep_if_dirty else "0")
        )
        return {1: "released", 2: "dirty"}.get(code, "lost")

    async def mark_dirty(self, trace_id: str, *, ttl_ms: int) -> None:
        """Note that a hint for the trace arrived (read by :meth:`release_lease`)."""
        await self.redis.set(self.keys.dirty(trace_id), b"1", px=ttl_ms)


_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '1' and redis.call('DEL', KEYS[2]) == 1 then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
"""
