"""Token deltas: what a model writes while it writes, on a short-lived stream per trace.

While the agent loop streams a model's reply it XADDs each piece to the trace's delta stream
(:meth:`agentstream.wire.keys.Keys.deltas`, in the trace's hash slot). Clients that show a reply as
it is written follow that stream beside the trace (:func:`follow`); the final answer is still
the one ModelOutput appended to the trace, and the delta stream is capped (``MAXLEN ~``) and
expires, so it is never the record. A reply that comes whole (not streamed) writes nothing
here: every follower (``agentstream ask``, the gateway's SSE stream, the console) shows it from
its ModelOutput in the trace, so publishing it again as deltas would only cost commands.

Wire format: each entry has one field ``d`` holding the JSON of a :class:`Delta`, e.g.::

    {"turn_id":"t1","step":0,"attempt":"3f9c0a1b2c4d","kind":"text","text":"Hel"}

Kinds:

- ``start``: an HTTP attempt of model call (``turn_id``, ``step``) began to answer.
- ``text`` / ``reasoning``: a piece of the answer / of the reasoning text (``text``).
- ``tool_call``: a piece of tool call number ``index``: ``call_id`` and ``name`` when they are
  first known, then pieces of the raw argument text (``text``).
- ``abort``: this attempt failed (``reason``). Drop everything it wrote: a retry may follow
  under a new attempt id.
- ``end``: the attempt completed (``stop_reason``). The ModelOutput whose ``attempt_id`` is
  this attempt follows in the trace (or, when another worker won the race, a different one).

Every piece carries its ``attempt`` id, so a client keeps only the pieces of the newest attempt
of each model call; :class:`PartialReplies` does exactly that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentstream.runtime.entries import Entries, StreamsReply, xadd_fields
from agentstream.wire import codec
from agentstream.wire.deltas import Delta, decode_delta, encode_delta
from agentstream.wire.events import Event
from agentstream.wire.keys import DELTA_FIELD, Keys

if TYPE_CHECKING:
    import asyncio

    import redis.asyncio as aioredis
    from redis.typing import KeyT, StreamIdT

log = logging.getLogger("agentstream.runtime.deltas")


DEFAULT_MAXLEN = 2000
"""Entries kept on a trace's delta stream (``XADD ... MAXLEN ~``)."""

DEFAULT_TTL_S = 600
"""Seconds a delta stream lives after its last attempt started or ended (``EXPIRE``)."""


class RedisDeltaSink:
    """Publishes deltas on a trace's delta stream.

    Each delta is one ``XADD <stream> MAXLEN ~ maxlen * d <json>``; the stream's expiry is set
    again when an attempt starts, ends or aborts (and every 256 pieces in between). Redis
    errors are logged once and otherwise ignored: streaming is a courtesy, the trace is the
    record, and a model call never fails because a delta could not be published.

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        trace_id: the trace whose delta stream this writes.
        maxlen: entries kept (approximately) on the stream.
        ttl_s: seconds the stream lives after its last attempt started or ended.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        trace_id: str,
        *,
        maxlen: int = DEFAULT_MAXLEN,
        ttl_s: int = DEFAULT_TTL_S,
    ):
        self.redis = redis
        self.stream = keys.deltas(trace_id)
        self.maxlen = maxlen
        self.ttl_s = ttl_s
        self._since_expire = 0
        self._warned = False

    async def emit(self, delta: Delta) -> None:
        from redis.exceptions import RedisError

        payload = xadd_fields({DELTA_FIELD: encode_delta(delta)})
        self._since_expire += 1
        try:
            if delta.kind in ("start", "end", "abort") or self._since_expire >= 256:
                self._since_expire = 0
                pipe = self.redis.pipeline(transaction=False)
                pipe.xadd(self.stream, payload, maxlen=self.maxlen, approximate=True)
                pipe.expire(self.stream, self.ttl_s)
                await pipe.execute()
            else:
                await self.redis.xadd(self.stream, payload, maxlen=self.maxlen, approximate=True)
        except RedisError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot publish token deltas on %s (%s); the model call goes on", self.stream, exc)


# --- following: the client side ------------------------------------------------------------


@dataclass
class PartialToolCall:
    """A tool call as streamed so far."""

    index: int
    call_id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class PartialReply:
    """The reply of one model call as streamed so far by its newest attempt.

    Attributes:
        turn_id, step: the model call.
        attempt: the attempt whose pieces these are.
        text: the answer text so far.
        reasoning: the reasoning text so far.
        tool_calls: the tool calls so far, by index.
        done: the attempt ended (``stop_reason`` says why).
    """

    turn_id: str
    step: int
    attempt: str
    text: str = ""
    reasoning: str = ""
    tool_calls: dict[int, PartialToolCall] = field(default_factory=dict)
    done: bool = False
    stop_reason: str = ""


@dataclass(frozen=True)
class Dropped:
    """An attempt whose partial output was dropped (it failed, or a newer attempt started)."""

    turn_id: str
    step: int
    attempt: str
    reason: str


class PartialReplies:
    """Folds deltas into the partial reply of each model call, newest attempt only.

    A ``start`` for a model call replaces whatever an earlier attempt of that call wrote; an
    ``abort`` drops the attempt's output; pieces of an attempt that is not the call's newest
    are ignored (they arrived late).
    """

    def __init__(self) -> None:
        self.replies: dict[tuple[str, int], PartialReply] = {}
        self.dropped: list[Dropped] = []

    def get(self, turn_id: str, step: int) -> PartialReply | None:
        """The partial reply of a model call, or None."""
        return self.replies.get((turn_id, step))

    def feed(self, delta: Delta) -> PartialReply | Dropped | None:
        """Fold one delta in → the reply it changed, the attempt it dropped, or None (ignored)."""
        key = (delta.turn_id, delta.step)
        current = self.replies.get(key)
        if delta.kind == "start":
            if current is not None and current.attempt != delta.attempt and not current.done:
                self.dropped.append(Dropped(delta.turn_id, delta.step, current.attempt, "a newer attempt started"))
            reply = PartialReply(turn_id=delta.turn_id, step=delta.step, attempt=delta.attempt)
            self.replies[key] = reply
            return reply
        if current is None or current.attempt != delta.attempt:
            return None
        match delta.kind:
            case "text":
                current.text += delta.text
            case "reasoning":
                current.reasoning += delta.text
            case "tool_call":
                call = current.tool_calls.setdefault(delta.index, PartialToolCall(index=delta.index))
                call.call_id = call.call_id or delta.call_id
                call.name = call.name or delta.name
                call.arguments += delta.text
            case "abort":
                del self.replies[key]
                dropped = Dropped(delta.turn_id, delta.step, delta.attempt, delta.reason)
                self.dropped.append(dropped)
                return dropped
            case "end":
                current.done = True
                current.stop_reason = delta.stop_reason
        return current


@dataclass(frozen=True)
class TraceItem:
    """One thing :func:`follow` yields: a trace event or a delta, with its entry id."""

    entry_id: str
    event: Event | None = None
    delta: Delta | None = None


async def last_entry_id(redis: aioredis.Redis, stream: str) -> str:
    """The id of the newest entry of ``stream``, or ``0-0`` when it is empty or missing."""
    last = cast(Entries, await redis.xrevrange(stream, count=1))
    if not last:
        return "0-0"
    raw = last[0][0]
    return raw.decode() if isinstance(raw, bytes) else raw


async def follow(
    redis: aioredis.Redis,
    keys: Keys,
    trace_id: str,
    *,
    after: str = "0-0",
    deltas_after: str = "0-0",
    block_ms: int = 1000,
    stop: asyncio.Event | None = None,
    accept: Callable[[Delta], bool] | None = None,
    outage_s: float = 0.0,
) -> AsyncIterator[TraceItem]:
    """Yield a trace's events and its token deltas as they are appended, in arrival order.

    One blocking ``XREAD`` reads both streams (they share the trace's hash slot), so tokens and
    events interleave as they happened. Malformed delta entries are skipped (deltas are a
    courtesy); a malformed trace entry raises as :meth:`TraceStore.read` would.

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        keys: the key names.
        trace_id: the trace.
        after: yield trace events after this entry id.
        deltas_after: yield deltas after this entry id (use :func:`last_entry_id` to skip old ones).
        block_ms: the longest one XREAD waits before ``stop`` is checked again, in milliseconds.
        stop: set it to end the iteration.
        accept: when given, only deltas for which it returns True are yielded.
        outage_s: how long Redis may stay unreachable (a restart) before the connection error
            is raised: meanwhile the read is retried with backoff from the same positions, so
            nothing is missed or repeated. 0 raises at once (after the client's own retries).

    Raises:
        SchemaVersionError, EventDecodeError: a trace entry cannot be read.
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: Redis stayed unreachable
            for ``outage_s``.
    """
    trace_stream = keys.trace(trace_id)
    delta_stream = keys.deltas(trace_id)
    positions: dict[KeyT, StreamIdT] = {trace_stream: after, delta_stream: deltas_after}
    down_since: float | None = None
    pause = 0.1
    while stop is None or not stop.is_set():
        try:
            reply = cast("StreamsReply | None", await redis.xread(positions, block=block_ms, count=500))
        except (RedisConnectionError, RedisTimeoutError) as exc:
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            if now - down_since >= outage_s:
                raise
            log.warning("following trace %s: Redis is unreachable (%s); retrying in %.1f s", trace_id, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            continue
        down_since, pause = None, 0.1
        batch: list[tuple[tuple[int, int, int], TraceItem]] = []
        for raw_stream, entries in reply or ():
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            if stream == trace_stream:
                for entry_id, event in codec.decode_entries(entries, trace_id=trace_id):
                    positions[trace_stream] = entry_id
                    batch.append((_order(entry_id, 1), TraceItem(entry_id=entry_id, event=event)))
                continue
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                positions[delta_stream] = entry_id
                try:
                    delta = decode_delta(codec.entry_field(fields, DELTA_FIELD))
                except msgspec.DecodeError:
                    log.debug("skipping malformed delta entry %s of %s", entry_id, delta_stream)
                    continue
                if accept is None or accept(delta):
                    batch.append((_order(entry_id, 0), TraceItem(entry_id=entry_id, delta=delta)))
        # one read returns each stream's entries apart: put them back in time order (entry ids
        # are milliseconds on the server's clock; within one millisecond deltas come first, as
        # a reply's pieces are always published before its ModelOutput is appended)
        batch.sort(key=lambda pair: pair[0])
        for _, item in batch:
            yield item


def _order(entry_id: str, rank: int) -> tuple[int, int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), rank, int(seq or 0)
