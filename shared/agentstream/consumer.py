"""Consuming a work stream with a consumer group: the delivery guarantees of every service.

A :class:`StreamConsumer` reads one work stream in one consumer group and calls a handler per
entry, several at a time. Its rules:

- An entry is acknowledged (XACK) only after its handler returned: a handler that raises or a
  process that dies leaves the entry pending.
- On start it first drains its own pending entries (XREADGROUP from ``0``), then reads new
  entries (``>``).
- Entries pending on any consumer for longer than ``min_idle_ms`` are claimed (XAUTOCLAIM, in
  batches) and handled again, so a dead worker's entries are finished by a live one.
- An entry delivered ``max_deliveries`` times goes to the dead-letter stream (with its payload,
  delivery count and last error) and ``on_dead_letter`` is called so the waiting turn learns of
  it; then it is acknowledged.
- A missing stream or group (Redis restarted without persistence, a flush) is recreated with a
  warning and a backoff; a connection error backs off and retries. Never a hot loop.

Redis references: XREADGROUP, XAUTOCLAIM, XPENDING (https://redis.io/docs/latest/develop/data-types/streams/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentstream import metrics

log = logging.getLogger("agentstream.consumer")

Fields = dict[bytes, bytes]
Handler = Callable[[str, Fields], Awaitable[None]]
DeadLetterHook = Callable[[str, Fields, str], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerConfig:
    """How a consumer reads.

    Attributes:
        block_ms: longest wait of one blocking read, in milliseconds.
        batch_size: entries read (or claimed) per call.
        concurrency: entries handled at the same time.
        min_idle_ms: a pending entry idle this long is claimed from its consumer.
        reclaim_interval_ms: how often to look for idle pending entries.
        max_deliveries: deliveries after which an entry is dead-lettered.
        backoff_max_s: the longest wait between retries after a Redis error, in seconds.
    """

    block_ms: int = 2000
    batch_size: int = 32
    concurrency: int = 16
    min_idle_ms: int = 60_000
    reclaim_interval_ms: int = 5_000
    max_deliveries: int = 5
    backoff_max_s: float = 5.0


class StreamConsumer:
    """One consumer of one stream in one consumer group.

    Args:
        redis: an asyncio Redis client.
        stream: the work stream.
        group: the consumer group (created at ``0`` with MKSTREAM when missing, so entries
            published before the first worker started are delivered).
        consumer: this consumer's name; a restarted process that keeps its name drains what it
            left pending.
        handler: ``await handler(entry_id, fields)``; returning acknowledges the entry.
        dead_stream: the dead-letter stream.
        on_dead_letter: ``await on_dead_letter(entry_id, fields, last_error)`` before the entry is
            moved to the dead-letter stream.
        config: read settings.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler,
        dead_stream: str,
        on_dead_letter: DeadLetterHook | None = None,
        config: ConsumerConfig | None = None,
    ):
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.handler = handler
        self.dead_stream = dead_stream
        self.on_dead_letter = on_dead_letter
        self.config = config or ConsumerConfig()
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._last_error: dict[str, str] = {}
        self.handled = 0
        self.failed = 0
        self.reclaimed = 0
        self.dead_lettered = 0

    async def ensure_group(self) -> None:
        """Create the stream and the group when missing (no error when they exist)."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            log.info("created consumer group %s on %s", self.group, self.stream)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then wait for the entries in hand.

        Entries still running when the caller gives up (cancels this task) stay pending and
        are claimed by another consumer after ``min_idle_ms``.
        """
        backoff_s = 0.1
        drained_own = False
        loop = asyncio.get_running_loop()
        next_reclaim = 0.0
        need_group = True
        while not stop.is_set():
            try:
                if need_group:
                    await self.ensure_group()
                    need_group = False
                if not drained_own:
                    await self._drain_own_pending(stop)
                    drained_own = True
                if loop.time() >= next_reclaim:
                    await self._reclaim()
                    next_reclaim = loop.time() + self.config.reclaim_interval_ms / 1000.0
                await self._read_new(stop)
                backoff_s = 0.1
            except ResponseError as exc:
                if "NOGROUP" in str(exc) or "no longer exists" in str(exc):
                    need_group = True
                    log.warning(
                        "stream %s or its group %s is gone (Redis restarted without persistence or was "
                        "flushed?); recreating in %.1f s",
                        self.stream,
                        self.group,
                        backoff_s,
                    )
                else:
                    log.error("Redis error on %s: %s; retrying in %.1f s", self.stream, exc, backoff_s)
                await _sleep_or_stop(stop, backoff_s)
                backoff_s = min(backoff_s * 2, self.config.backoff_max_s)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("lost Redis on %s (%s); reconnecting in %.1f s", self.stream, exc, backoff_s)
                await _sleep_or_stop(stop, backoff_s)
                backoff_s = min(backoff_s * 2, self.config.backoff_max_s)
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def run_until_idle(self, *, idle_reads: int = 1) -> None:
        """Handle entries until a read finds nothing ``idle_reads`` times in a row (for tests)."""
        await self.ensure_group()
        stop = asyncio.Event()
        await self._drain_own_pending(stop)
        empty = 0
        while empty < idle_reads:
            got = await self._read_new(stop, block_ms=50)
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
            empty = 0 if got else empty + 1

    async def _drain_own_pending(self, stop: asyncio.Event) -> None:
        last = "0"
        while not stop.is_set():
            reply = await self.redis.xreadgroup(
                self.group, self.consumer, {self.stream: last}, count=self.config.batch_size
            )
            entries = reply[0][1] if reply else []
            if not entries:
                return
            for entry_id, fields in entries:
                last = _s(entry_id)
                if fields is None or not fields:
                    await self._lost_entry(last)
                    continue
                await self._dispatch(last, fields, check_deliveries=True)
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def _read_new(self, stop: asyncio.Event, block_ms: int | None = None) -> int:
        free = max(1, min(self.config.batch_size, self._slots._value))  # type: ignore[attr-defined]
        reply = await self.redis.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=free,
            block=self.config.block_ms if block_ms is None else block_ms,
        )
        entries = reply[0][1] if reply else []
        for entry_id, fields in entries:
            if stop.is_set():
                # Not started: leave it pending for this consumer's next start or a reclaim.
                break
            await self._dispatch(_s(entry_id), fields or {}, check_deliveries=False)
        return len(entries)

    async def _reclaim(self) -> None:
        """Claim entries idle on other (dead) consumers, in batches."""
        start = "0-0"
        while True:
            reply = await self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                min_idle_time=self.config.min_idle_ms,
                start_id=start,
                count=self.config.batch_size,
            )
            next_start, claimed = _s(reply[0]), reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            for entry_id in deleted or []:
                await self._lost_entry(_s(entry_id))
            for entry_id, fields in claimed:
                entry = _s(entry_id)
                if entry in self._inflight:
                    continue
                self.reclaimed += 1
                metrics.RECLAIMS.labels(stream=self.stream).inc()
                log.info("claimed idle entry %s of %s", entry, self.stream)
                if not fields:
                    await self._lost_entry(entry)
                    continue
                await self._dispatch(entry, fields, check_deliveries=True)
            if next_start == "0-0" or not claimed:
                return
            start = next_start

    async def _deliveries(self, entry_id: str) -> int:
        info = await self.redis.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        return int(info[0]["times_delivered"]) if info else 0

    async def _dispatch(self, entry_id: str, fields: Fields, *, check_deliveries: bool) -> None:
        if entry_id in self._inflight:
            return
        if check_deliveries:
            deliveries = await self._deliveries(entry_id)
            if deliveries > self.config.max_deliveries:
                await self._dead_letter(entry_id, fields, deliveries)
                return
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(entry_id, fields))
        self._inflight[entry_id] = task

    async def _handle(self, entry_id: str, fields: Fields) -> None:
        try:
            await self.handler(entry_id, fields)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed += 1
            self._last_error[entry_id] = f"{type(exc).__name__}: {exc}"
            log.exception("handler failed on %s entry %s; it stays pending and will be retried", self.stream, entry_id)
        else:
            self.handled += 1
            self._last_error.pop(entry_id, None)
            await self.redis.xack(self.stream, self.group, entry_id)
        finally:
            self._inflight.pop(entry_id, None)
            self._slots.release()

    async def _dead_letter(self, entry_id: str, fields: Fields, deliveries: int) -> None:
        error = self._last_error.pop(entry_id, "unknown (the handler's process died)")
        log.error(
            "entry %s of %s was delivered %d times; moving it to %s (last error: %s)",
            entry_id,
            self.stream,
            deliveries,
            self.dead_stream,
            error,
        )
        if self.on_dead_letter is not None:
            await self.on_dead_letter(entry_id, fields, error)
        record = dict(fields)
        record.update(
            {
                b"dead_source_stream": self.stream.encode(),
                b"dead_source_id": entry_id.encode(),
                b"dead_group": self.group.encode(),
                b"dead_deliveries": str(deliveries).encode(),
                b"dead_error": error.encode(),
            }
        )
        await self.redis.xadd(self.dead_stream, record)
        await self.redis.xack(self.stream, self.group, entry_id)
        self.dead_lettered += 1
        metrics.DEAD_LETTERS.labels(stream=self.stream).inc()

    async def _lost_entry(self, entry_id: str) -> None:
        """A pending entry whose body was trimmed away: acknowledge it and say so."""
        log.error("pending entry %s of %s has no body (trimmed?); acknowledging it as lost", entry_id, self.stream)
        await self.redis.xack(self.stream, self.group, entry_id)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
