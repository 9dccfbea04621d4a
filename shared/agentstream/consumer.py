"""Consuming a work stream with a consumer group: the delivery guarantees of every service.

A :class:`StreamConsumer` reads one work stream in one consumer group and calls a handler per
entry, several at a time. Its rules:

- An entry is acknowledged (XACK) only after its handler returned: a handler that raises or a
  process that dies leaves the entry pending (field cases C15, C20).
- On start it first drains its own pending entries (XREADGROUP from ``0``), then reads new
  entries (``>``): a restarted process that keeps its consumer name finishes what it left.
- Entries pending on any consumer for longer than ``min_idle_ms`` are claimed in batches
  (XAUTOCLAIM; on Redis ≥ 8.4, XREADGROUP's ``CLAIM`` option instead) and handled again, so a
  dead worker's entries are finished by a live one.
- While a handler runs, its claim is renewed every ``renew_interval_ms`` (XCLAIM JUSTID, which
  counts no delivery), so a live worker's long job is never claimed by another one.
- A handler that raises is retried by the same consumer after a growing delay; one that raises
  :class:`Deferred` is handed the entry again after the delay it asks for, without counting it.
- An entry whose handler started before without success (its process may have died on it) is
  handled alone in its process: no other handler runs beside it, so a poison entry that kills
  its worker takes no innocent entry with it on the next round (C17).
- Deliveries are counted by agentstream itself (:mod:`agentstream.claims`): once per handler
  start, before it runs, so a process killed mid-handler counts, while re-reads, claim renewals
  and deferrals do not (Redis's own ``times_delivered`` counts all of those: field case C17).
  An entry whose handler started ``max_deliveries`` times without success goes to the
  dead-letter stream (payload, attempts, Redis's delivery count, last error) after
  ``on_dead_letter`` has put a failure into its trace; then it is acknowledged.
- A pending entry whose body is gone (trimmed or deleted by someone else while pending: C18)
  is acknowledged, recorded on the dead-letter stream as lost, logged and counted.
- Every ``trim_interval_ms`` the stream is trimmed below what every group acknowledged
  (:mod:`agentstream.trimming`); nothing pending or undelivered is ever trimmed.
- A missing stream or group (Redis restarted without persistence, a flush) is recreated with a
  warning, and a lost connection retried, each after a growing, jittered backoff: never a hot loop.
- When cancelled (the grace period of a shutdown ran out), entries still in hand are released:
  marked long idle, so a live consumer claims them at once, and their attempt is not counted.

Redis references: XREADGROUP, XAUTOCLAIM, XCLAIM, XPENDING
(https://redis.io/docs/latest/develop/data-types/streams/).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentstream import logs, metrics
from agentstream.claims import count_attempt, keep_claims, release_claims, server_version, supports_claim_option
from agentstream.errors import Deferred
from agentstream.keys import attempts_key as default_attempts_key
from agentstream.trimming import trim_acknowledged

if TYPE_CHECKING:
    from agentstream.settings import Settings

log = logging.getLogger("agentstream.consumer")

Fields = dict[bytes, bytes]
Handler = Callable[[str, Fields], Awaitable[None]]
DeadLetterHook = Callable[[str, Fields, str], Awaitable[None]]

_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
_FIRST_BACKOFF_S = 0.1
__all__ = ["ConsumerConfig", "Deferred", "StreamConsumer"]

UNKNOWN_ERROR = "unknown: the handler never returned (its process died or was killed while handling the entry)"


@dataclass(frozen=True)
class ConsumerConfig:
    """How a consumer reads.

    Attributes:
        block_ms: longest wait of one blocking read, in milliseconds.
        batch_size: entries read (or claimed) per call.
        concurrency: entries handled at the same time.
        min_idle_ms: a pending entry idle this long is claimed from its consumer.
        reclaim_interval_ms: how often to look for idle pending entries.
        max_deliveries: handler starts after which an entry is dead-lettered.
        backoff_max_s: the longest wait between retries after a Redis error or a failed
            handler, in seconds.
        retry_delay_s: the wait before a failed handler is retried, in seconds; it doubles with
            each attempt, up to ``backoff_max_s``.
        renew_interval_ms: how often the claims on entries in hand are renewed; None means a
            third of ``min_idle_ms``.
        trim_interval_ms: how often the stream is trimmed below what every group acknowledged;
            0 never trims.
        use_claim_option: use XREADGROUP's ``CLAIM`` option where the server has it (≥ 8.4)
            instead of separate XAUTOCLAIM calls.
    """

    block_ms: int = 2000
    batch_size: int = 32
    concurrency: int = 16
    min_idle_ms: int = 60_000
    reclaim_interval_ms: int = 5_000
    max_deliveries: int = 5
    backoff_max_s: float = 5.0
    retry_delay_s: float = 1.0
    renew_interval_ms: int | None = None
    trim_interval_ms: int = 60_000
    use_claim_option: bool = True

    @property
    def renew_ms(self) -> int:
        """The claim renewal interval in milliseconds."""
        return self.renew_interval_ms if self.renew_interval_ms is not None else max(10, self.min_idle_ms // 3)


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
            moved to the dead-letter stream: it puts the failure into the entry's trace.
        config: read settings.
        attempts_key: the hash of this group's delivery counts (default
            :func:`agentstream.keys.attempts_key`).
        log_ids: ``log_ids(fields)`` → the ids (trace, turn, call) bound to every log line
            made while the entry is handled (default :func:`agentstream.logs.ids_of`).
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
        attempts_key: str | None = None,
        log_ids: Callable[[Fields], dict[str, str]] | None = None,
    ):
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.handler = handler
        self.dead_stream = dead_stream
        self.on_dead_letter = on_dead_letter
        self.config = config or ConsumerConfig()
        self.attempts_key = attempts_key or default_attempts_key(stream, group)
        self.log_ids = log_ids or logs.ids_of
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, tuple[float, Fields]] = {}  # entry → (due time, fields): retries
        self._refunds: dict[str, int] = {}  # entry → counted starts that were not deliveries
        self._interrupted: set[str] = set()  # entries whose handler was cancelled (shutdown)
        self._gate = asyncio.Condition()  # suspects (entries that failed before) run alone
        self._normal_running = 0
        self._isolating = False
        self._claim_option: bool | None = None
        self.handled = 0
        self.failed = 0
        self.deferred = 0
        self.reclaimed = 0
        self.dead_lettered = 0
        self.lost = 0
        self.trimmed = 0
        self.claim_renewals = 0

    # --- group and lifecycle ----------------------------------------------------------------

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

        Cancelling this task (a shutdown's grace period ran out) cancels the handlers in hand
        and releases their entries for another consumer; nothing unfinished is acknowledged.
        """
        loop = asyncio.get_running_loop()
        keeper = asyncio.create_task(self._keep_claims_loop(stop), name=f"claims:{self.stream}")
        backoff_s = _FIRST_BACKOFF_S
        drained_own = False
        need_group = True
        next_reclaim = 0.0
        next_trim = loop.time() + self.config.trim_interval_ms / 1000.0 * random.random()
        try:
            while not stop.is_set():
                try:
                    if need_group:
                        await self.ensure_group()
                        need_group = False
                    if self._claim_option is None:
                        self._claim_option = await self._detect_claim_option()
                    if not drained_own:
                        await self._drain_own_pending(stop)
                        drained_own = True
                    await self._retry_due()
                    now = loop.time()
                    if not self._claim_option and now >= next_reclaim:
                        await self._reclaim(stop)
                        next_reclaim = now + self.config.reclaim_interval_ms / 1000.0
                    if self.config.trim_interval_ms and now >= next_trim:
                        await self._trim()
                        next_trim = now + self.config.trim_interval_ms / 1000.0
                    await self._read_new(stop, block_ms=self._block_for(loop.time()))
                    backoff_s = _FIRST_BACKOFF_S
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
                    await _sleep_or_stop(stop, _jitter(backoff_s))
                    backoff_s = min(backoff_s * 2, self.config.backoff_max_s)
                except _REDIS_DOWN as exc:
                    log.warning("lost Redis on %s (%s); reconnecting in %.1f s", self.stream, exc, backoff_s)
                    await _sleep_or_stop(stop, _jitter(backoff_s))
                    backoff_s = min(backoff_s * 2, self.config.backoff_max_s)
            if self._inflight:
                await asyncio.gather(*self._inflight.values(), return_exceptions=True)
            if self._waiting:
                await self._release(list(self._waiting), refund=False)
        except asyncio.CancelledError:
            for task in list(self._inflight.values()):
                if not task.cancelling():  # not already told (a cancelled gather tells its children)
                    task.cancel()
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
            held = list(self._interrupted)
            await self._release([*held, *self._waiting], refund=True, counted=set(held))
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def run_until_idle(self, *, idle_reads: int = 1) -> None:
        """Handle entries until a read finds nothing ``idle_reads`` times in a row (for tests).

        Failed and deferred entries are not retried here.
        """
        await self.ensure_group()
        stop = asyncio.Event()
        await self._drain_own_pending(stop)
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        empty = 0
        while empty < idle_reads:
            got = await self._read_new(stop, block_ms=50)
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
            empty = 0 if got else empty + 1

    # --- reading ------------------------------------------------------------------------------

    async def _detect_claim_option(self) -> bool:
        if not self.config.use_claim_option:
            return False
        try:
            version = await server_version(self.redis)
        except ResponseError:  # INFO not allowed (ACL): assume an older server
            return False
        usable = supports_claim_option(version)
        log.info(
            "Redis %s on %s: idle entries are claimed with %s",
            ".".join(map(str, version)),
            self.stream,
            "XREADGROUP ... CLAIM" if usable else "XAUTOCLAIM",
        )
        return usable

    def _block_for(self, now: float) -> int:
        """How long the next read may block: until the next retry is due, at most ``block_ms``."""
        if not self._waiting:
            return self.config.block_ms
        due = min(t for t, _ in self._waiting.values())
        return max(1, min(self.config.block_ms, int((due - now) * 1000)))

    async def _drain_own_pending(self, stop: asyncio.Event) -> None:
        """Dispatch every entry pending on this consumer (from a previous run of the process)."""
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
                if not fields:
                    await self._lost_entry(last)
                    continue
                await self._dispatch(last, fields)

    async def _read_new(self, stop: asyncio.Event, block_ms: int | None = None) -> int:
        free = max(1, min(self.config.batch_size, self._slots._value))  # type: ignore[attr-defined]
        reply = await self.redis.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=free,
            block=self.config.block_ms if block_ms is None else block_ms,
            claim_min_idle_time=self.config.min_idle_ms if self._claim_option else None,
        )
        entries = reply[0][1] if reply else []
        unstarted = []
        for entry_id, fields in entries:
            entry = _s(entry_id)
            if stop.is_set():
                unstarted.append(entry)  # not started: give it back at once
                continue
            if not fields:
                await self._lost_entry(entry)
                continue
            await self._dispatch(entry, fields)
        if unstarted:
            await self._release(unstarted, refund=False)
        return len(entries)

    async def _reclaim(self, stop: asyncio.Event) -> None:
        """Claim entries idle on other (dead) consumers, in batches of ``batch_size``."""
        start = "0-0"
        while not stop.is_set():
            reply = await self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                min_idle_time=self.config.min_idle_ms,
                start_id=start,
                count=self.config.batch_size,
            )
            # Redis ≥ 7 replies [next, entries, deleted ids] and drops the deleted ids from the
            # PEL itself; Redis 6.2 replies [next, entries], an entry deleted while pending being
            # nil there (redis-py: (None, None)) and left claimed by us in the PEL, its id unsaid.
            next_start, claimed = _s(reply[0]), reply[1] or []
            deleted = (reply[2] if len(reply) > 2 else None) or []
            for entry_id in deleted:
                await self._lost_entry(_s(entry_id), in_pel=False)
            anonymous = sum(1 for entry_id, _ in claimed if entry_id is None)
            if anonymous:
                await self._lost_own_pending(start, None if next_start == "0-0" else next_start)
            for entry_id, fields in claimed:
                if entry_id is None:
                    continue
                entry = _s(entry_id)
                if entry in self._inflight or entry in self._waiting:
                    continue
                self.reclaimed += 1
                metrics.RECLAIMS.labels(stream=self.stream).inc()
                with logs.bind(**self._log_ids(fields)):
                    log.info("claimed idle entry %s of %s", entry, self.stream)
                if not fields:
                    await self._lost_entry(entry)
                    continue
                await self._dispatch(entry, fields)
            if next_start == "0-0" or not (claimed or deleted):
                return
            start = next_start

    async def _lost_own_pending(self, low: str, high: str | None) -> None:
        """Find and report the bodiless entries pending on this consumer between ``low`` and ``high``.

        For Redis 6.2, whose XAUTOCLAIM claims an entry deleted while pending but replies nil
        in its place: its id is found in this consumer's PEL (XPENDING), its absence by XRANGE.
        """
        held = set(self._inflight) | set(self._waiting)
        cursor = low
        while True:
            rows = await self.redis.xpending_range(
                self.stream, self.group, min=cursor, max=high or "+", count=self.config.batch_size,
                consumername=self.consumer,
            )
            ids = [_s(row["message_id"]) for row in rows]
            candidates = [entry for entry in ids if entry not in held]
            if candidates:
                pipe = self.redis.pipeline(transaction=False)
                for entry in candidates:
                    pipe.xrange(self.stream, min=entry, max=entry, count=1)
                bodies = await pipe.execute()
                for entry, body in zip(candidates, bodies):
                    if not body or not body[0][1]:
                        await self._lost_entry(entry)
            if len(rows) < self.config.batch_size:
                return
            cursor = "(" + ids[-1]

    async def _retry_due(self) -> None:
        """Hand failed and deferred entries whose time has come to their handler again."""
        if not self._waiting:
            return
        now = asyncio.get_running_loop().time()
        due = [entry for entry, (at, _) in self._waiting.items() if at <= now]
        if not due:
            return
        still_ours = await keep_claims(self.redis, self.stream, self.group, self.consumer, due)
        for entry in due:
            _, fields = self._waiting.pop(entry)
            if entry in still_ours:
                await self._dispatch(entry, fields)
            else:
                self._refunds.pop(entry, None)
                log.info("entry %s of %s was taken by another consumer before its retry", entry, self.stream)

    # --- handling -----------------------------------------------------------------------------

    async def _dispatch(self, entry_id: str, fields: Fields) -> None:
        if entry_id in self._inflight or entry_id in self._waiting:
            return
        await self._slots.acquire()
        self._inflight[entry_id] = asyncio.create_task(self._process(entry_id, fields), name=f"entry:{entry_id}")

    async def _process(self, entry_id: str, fields: Fields) -> None:
        # every line logged for this entry (the handler's and the consumer's) names its trace
        with logs.bind(**self._log_ids(fields)):
            await self._process_entry(entry_id, fields)

    def _log_ids(self, fields: Fields) -> dict[str, str]:
        try:
            return self.log_ids(fields)
        except Exception:  # ids for log lines must never stop the work
            return {}

    async def _process_entry(self, entry_id: str, fields: Fields) -> None:
        attempts = 0
        try:
            attempts = await count_attempt(self.redis, self.attempts_key, entry_id, refund=self._refunds.pop(entry_id, 0))
            if attempts > self.config.max_deliveries:
                await self._dead_letter(entry_id, fields, attempts)
                return
            suspect = attempts > 1 and self.config.concurrency > 1
            if suspect:  # not started until it runs alone: a co-runner's crash must not count for it
                await self.redis.hincrby(self.attempts_key, entry_id, -1)
                attempts -= 1
            await self._enter(suspect)
            try:
                if suspect:
                    attempts = await count_attempt(self.redis, self.attempts_key, entry_id)
                outcome = await self._call_handler(entry_id, fields, attempts)
            finally:
                await self._leave(suspect)
            if outcome:
                self.handled += 1
                await self._ack(entry_id)
        except asyncio.CancelledError:
            if attempts:
                self._interrupted.add(entry_id)
            raise
        except Exception as exc:  # Redis failed around the handler (counting, acking, dead-lettering)
            delay = self._retry_delay(max(attempts, 1))
            log.warning("could not finish entry %s of %s (%s); retrying in %.1f s", entry_id, self.stream, exc, delay)
            self._wait(entry_id, fields, delay)
        finally:
            self._inflight.pop(entry_id, None)
            self._slots.release()

    async def _call_handler(self, entry_id: str, fields: Fields, attempts: int) -> bool:
        """Run the handler → True when it succeeded (else the entry waits for a retry)."""
        try:
            await self.handler(entry_id, fields)
        except Deferred as signal:
            self.deferred += 1
            self._refund(entry_id)
            self._wait(entry_id, fields, signal.delay_s)
            return False
        except _REDIS_DOWN as exc:
            # Redis, not the entry, failed: retry without counting the attempt.
            self._refund(entry_id)
            delay = self._retry_delay(attempts)
            log.warning("lost Redis while handling %s of %s (%s); retrying in %.1f s", entry_id, self.stream, exc, delay)
            self._wait(entry_id, fields, delay)
            return False
        except Exception as exc:
            self.failed += 1
            delay = self._retry_delay(attempts)
            log.exception(
                "handler failed on %s entry %s (attempt %d of %d); retrying in %.1f s",
                self.stream, entry_id, attempts, self.config.max_deliveries, delay,
            )
            self._wait(entry_id, fields, delay)
            with contextlib.suppress(Exception):
                await self.redis.hset(self.attempts_key, f"{entry_id}:error", f"{type(exc).__name__}: {exc}"[:2000])
            return False
        return True

    async def _enter(self, suspect: bool) -> None:
        """Wait for the right to run: a suspect waits until it can run alone; others wait while one does."""
        async with self._gate:
            await self._gate.wait_for(lambda: not self._isolating)
            if not suspect:
                self._normal_running += 1
                return
            self._isolating = True
            try:
                await self._gate.wait_for(lambda: self._normal_running == 0)
            except BaseException:
                self._isolating = False
                self._gate.notify_all()
                raise
            log.info("handling an entry of %s that failed before on its own (no other handler beside it)", self.stream)

    async def _leave(self, suspect: bool) -> None:
        async with self._gate:
            if suspect:
                self._isolating = False
            else:
                self._normal_running -= 1
            self._gate.notify_all()

    def _refund(self, entry_id: str) -> None:
        self._refunds[entry_id] = self._refunds.get(entry_id, 0) + 1

    def _wait(self, entry_id: str, fields: Fields, delay_s: float) -> None:
        self._waiting[entry_id] = (asyncio.get_running_loop().time() + max(0.0, delay_s), fields)

    def _retry_delay(self, attempts: int) -> float:
        return min(self.config.retry_delay_s * 2 ** max(0, attempts - 1), self.config.backoff_max_s)

    async def _ack(self, entry_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.hdel(self.attempts_key, entry_id, f"{entry_id}:error")
        await pipe.execute()

    async def _dead_letter(self, entry_id: str, fields: Fields, attempts: int) -> None:
        raw_error = await self.redis.hget(self.attempts_key, f"{entry_id}:error")
        error = _s(raw_error) if raw_error else UNKNOWN_ERROR
        info = await self.redis.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        times_delivered = int(info[0]["times_delivered"]) if info else 0
        log.error(
            "entry %s of %s: its handler started %d times without success (Redis counted %d deliveries); "
            "moving it to %s (last error: %s)",
            entry_id, self.stream, attempts, times_delivered, self.dead_stream, error,
        )
        if self.on_dead_letter is not None:
            await self.on_dead_letter(entry_id, fields, error)
        record = dict(fields)
        record.update(
            {
                b"dead_source_stream": self.stream.encode(),
                b"dead_source_id": entry_id.encode(),
                b"dead_group": self.group.encode(),
                b"dead_deliveries": str(attempts).encode(),
                b"dead_redis_deliveries": str(times_delivered).encode(),
                b"dead_error": error.encode(),
            }
        )
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(self.dead_stream, record)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.hdel(self.attempts_key, entry_id, f"{entry_id}:error")
        await pipe.execute()
        self.dead_lettered += 1
        metrics.DEAD_LETTERS.labels(stream=self.stream).inc()

    async def _lost_entry(self, entry_id: str, *, in_pel: bool = True) -> None:
        """A pending entry whose body is gone (trimmed or deleted while pending): ack and report it."""
        log.error(
            "pending entry %s of %s has no body (trimmed or deleted by someone while pending?); acknowledging "
            "it as lost and recording it on %s. Trim work streams only with MINID below what every group "
            "acknowledged (agentstream.trimming), never with MAXLEN.",
            entry_id, self.stream, self.dead_stream,
        )
        pipe = self.redis.pipeline(transaction=False)
        if in_pel:
            pipe.xack(self.stream, self.group, entry_id)
        pipe.hdel(self.attempts_key, entry_id, f"{entry_id}:error")
        pipe.xadd(
            self.dead_stream,
            {
                b"dead_source_stream": self.stream.encode(),
                b"dead_source_id": entry_id.encode(),
                b"dead_group": self.group.encode(),
                b"dead_error": b"lost: the entry's body was deleted while it was pending",
            },
        )
        await pipe.execute()
        self.lost += 1
        metrics.LOST_ENTRIES.labels(stream=self.stream).inc()

    # --- claims and trimming ------------------------------------------------------------------

    async def _keep_claims_loop(self, stop: asyncio.Event) -> None:
        """Renew the claims on entries in hand, so no other consumer takes a live worker's job."""
        interval_s = self.config.renew_ms / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            held = [*self._inflight, *self._waiting]
            if not held:
                continue
            try:
                kept = await keep_claims(self.redis, self.stream, self.group, self.consumer, held)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the main loop reports Redis trouble; renewal just tries again
                log.debug("could not renew claims on %s: %s", self.stream, exc)
                continue
            self.claim_renewals += len(kept)
            for entry in held:
                if entry in kept:
                    continue
                if entry in self._waiting:
                    self._waiting.pop(entry, None)
                    self._refunds.pop(entry, None)
                elif entry in self._inflight:
                    log.info(
                        "entry %s of %s is no longer pending on %s while its handler runs (acknowledged just now, "
                        "or claimed by another consumer); its effect is recorded once either way",
                        entry, self.stream, self.consumer,
                    )

    async def _release(self, entry_ids: list[str], *, refund: bool, counted: set[str] | None = None) -> None:
        """Give entries in hand back to the group (claimable at once); uncount interrupted attempts."""
        if not entry_ids:
            return
        try:
            released = await release_claims(self.redis, self.stream, self.group, self.consumer, entry_ids)
            if refund and counted:
                pipe = self.redis.pipeline(transaction=False)
                for entry in counted & released:
                    pipe.hincrby(self.attempts_key, entry, -1)
                await pipe.execute()
        except Exception as exc:
            log.warning("could not release %d entries of %s (%s); they are claimed after min_idle_ms", len(entry_ids), self.stream, exc)
            return
        if released:
            log.info("released %d unfinished entries of %s for other consumers", len(released), self.stream)

    async def _trim(self) -> None:
        trimmed = await trim_acknowledged(self.redis, self.stream)
        if trimmed.removed:
            self.trimmed += trimmed.removed
            metrics.TRIMMED_ENTRIES.labels(stream=self.stream).inc(trimmed.removed)
            log.debug("trimmed %d acknowledged entries of %s below %s", trimmed.removed, self.stream, trimmed.threshold)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


def _jitter(seconds: float) -> float:
    """±20 % so that many consumers do not retry in lockstep."""
    return seconds * random.uniform(0.8, 1.2)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def group_consumer(
    redis: aioredis.Redis,
    settings: Settings,
    *,
    stream: str,
    group: str,
    handler: Handler,
    on_dead_letter: DeadLetterHook | None = None,
) -> StreamConsumer:
    """A service's consumer of ``stream`` in ``group``, configured from the settings: this
    process's consumer name, the stream's dead-letter stream, the read and reclaim settings."""
    return StreamConsumer(
        redis,
        stream=stream,
        group=group,
        consumer=settings.consumer,
        handler=handler,
        dead_stream=settings.keys.dead(stream),
        on_dead_letter=on_dead_letter,
        config=settings.consumer_config(),
    )
