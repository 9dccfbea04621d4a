"""Cancel requests: publishing them, and hearing them in every service process.

A cancel is a :class:`~agentstream.wire.events.CancelMessage` in the field ``cancel`` of an entry on
the cancel stream (``<ns>:cancel``). It travels two ways:

- **durably**, through the agent loop's consumer group on that stream: the handler writes a
  ``cancel_requested`` event into the trace (the truth) and advances the trace, which ends the
  turn as cancelled at its next step (every call left without a result gets a cancelled result);
- **at once**, to every agent-loop and tool-worker process through a :class:`CancelListener`
  (a plain XREAD, no group, so each process sees each cancel): an agent loop aborts its
  in-flight model request for that trace, a tool worker tells the calls it is running.

A process that misses the broadcast (it started after it) still stops at the next step
boundary: the agent loop reads the trace at every step, and a tool worker checks the trace's
cancel key (``cancel:<turn id>`` in the trace's key hash) before it runs a job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentstream.ops import logs
from agentstream.runtime.entries import keep_doubled_fields
from agentstream.wire import codec
from agentstream.wire.backends import confined_cancel
from agentstream.wire.checks import WireLimits, validate_cancel
from agentstream.wire.events import CancelMessage, Event, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.keys import CANCEL_FIELD, Keys

log = logging.getLogger("agentstream.runtime.cancel")

OnCancel = Callable[[CancelMessage], Awaitable[None]]


@dataclass(frozen=True)
class CancelTarget:
    """What a cancel of a trace would stop (see :func:`cancel_target`).

    Attributes:
        turn_id: the turn to cancel; None when there is none.
        ending: the turn's ending, when the named turn already ended.
        reason: why there is nothing to cancel ("" when there is a turn).
        any_turn: whether the trace holds any turn at all (False: no such trace, or an empty one).
    """

    turn_id: str | None
    ending: TurnEnded | TurnFailed | None = None
    reason: str = ""
    any_turn: bool = True


def cancel_target(events: Sequence[Event], turn_id: str = "") -> CancelTarget:
    """The turn a cancel names in a trace's events: ``turn_id``, or without it the running turn.

    Only a turn the trace holds and that has not ended can be cancelled (a queued one too: its
    cancel takes effect when it comes up). A cancel recorded for any other id would wait in the
    trace and cancel a later turn that takes that id at once, so there is no target then.
    """
    endings = {e.turn_id: e for e in events if isinstance(e, (TurnEnded, TurnFailed))}
    turns = [e.turn_id for e in events if isinstance(e, TurnInput)]
    if not turns:
        return CancelTarget(None, reason="no such running turn: the trace holds no turn", any_turn=False)
    if not turn_id:
        running = next((t for t in turns if t not in endings), None)
        return CancelTarget(running, reason="" if running else "no turn is running")
    if turn_id not in turns:
        return CancelTarget(None, reason=f"no such running turn: the trace has no turn {turn_id!r}")
    if turn_id in endings:
        return CancelTarget(
            None, ending=endings[turn_id], reason=f"no such running turn: turn {turn_id!r} has already ended"
        )
    return CancelTarget(turn_id)


async def publish_cancel(redis: aioredis.Redis, keys: Keys, message: CancelMessage) -> str:
    """Publish a cancel request → its entry id on the cancel stream."""
    entry_id = await redis.xadd(keys.cancel, {CANCEL_FIELD: codec.encode(message)})
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


class CancelListener:
    """Calls ``on_cancel`` for every cancel request published while it runs (every process).

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        on_cancel: ``await on_cancel(message)``; its errors are logged, never raised.
        block_ms: longest wait of one blocking read, in milliseconds.
        backoff_max_s: the longest wait between retries after a Redis error, in seconds.
        stream: the cancel stream heard (default the shared ``<ns>:cancel``; one listener per
            stream of :attr:`~agentstream.wire.keys.Keys.cancel_streams`). A backend's cancel stream
            is confined to its conversations and its ``by`` is the backend
            (:func:`agentstream.wire.backends.confined_cancel`); a refused cancel is not passed on.
        limits: the wire's limits a cancel is held to (:func:`agentstream.wire.checks.validate_cancel`:
            its size first); default the defaults.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        on_cancel: OnCancel,
        *,
        block_ms: int = 1000,
        backoff_max_s: float = 5.0,
        stream: str | None = None,
        limits: WireLimits | None = None,
    ):
        self.redis = keep_doubled_fields(redis)
        self.limits = limits or WireLimits()  # a cancel that repeats a field is ignored
        self.stream = stream or keys.cancel
        self.backend = keys.backend_of_stream(self.stream)
        self.on_cancel = on_cancel
        self.block_ms = block_ms
        self.backoff_max_s = backoff_max_s
        self.heard = 0
        self.ignored = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Listen until ``stop`` is set; only requests published after the start are heard."""
        last: str | None = None
        backoff_s = 0.1
        while not stop.is_set():
            try:
                if last is None:
                    newest = await self.redis.xrevrange(self.stream, count=1)
                    last = _s(newest[0][0]) if newest else "0-0"
                reply = await self.redis.xread({self.stream: last}, block=self.block_ms, count=100)
                for _stream, entries in reply or ():
                    for entry_id, fields in entries:
                        last = _s(entry_id)
                        await self._handle(last, fields)
                backoff_s = 0.1
            except (RedisConnectionError, RedisTimeoutError, OSError, ResponseError) as exc:
                log.warning("cancel listener lost Redis (%s); retrying in %.1f s", exc, backoff_s)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=backoff_s * random.uniform(0.8, 1.2))
                except TimeoutError:
                    pass
                backoff_s = min(backoff_s * 2, self.backoff_max_s)

    async def _handle(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """One entry of the cancel stream; nothing its bytes do gets past here (a listener that
        raised would stop its whole service)."""
        try:
            message = validate_cancel(codec.entry_field(fields, CANCEL_FIELD), self.limits)
        except (Exception, RecursionError) as exc:  # any bytes: bad JSON, wrong types, nesting too deep
            self.ignored += 1
            # the agent loop's group consumer records it on the errors stream
            log.warning("ignoring malformed cancel %s on %s: %s", entry_id, self.stream, _short(exc))
            return
        confined, refusal = confined_cancel(self.backend, message)
        if confined is None:  # the agent loop's group consumer records it on the errors stream
            self.ignored += 1
            log.warning("ignoring cancel %s on %s: %s", entry_id, self.stream, refusal)
            return
        message = confined
        self.heard += 1
        with logs.bind(trace_id=message.trace_id, turn_id=message.turn_id or None):
            try:
                await self.on_cancel(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handling cancel %s of trace %s failed", entry_id, message.trace_id)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:300] + "..."


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def cancel_listeners(
    redis: aioredis.Redis, keys: Keys, on_cancel: OnCancel, *, block_ms: int = 1000, limits: WireLimits | None = None
) -> list[CancelListener]:
    """One :class:`CancelListener` per cancel stream (the shared one, then each configured
    backend's: a blocking read of several streams would be a cross-slot command on a Redis
    Cluster)."""
    return [
        CancelListener(redis, keys, on_cancel, block_ms=block_ms, stream=s, limits=limits) for s in keys.cancel_streams
    ]
