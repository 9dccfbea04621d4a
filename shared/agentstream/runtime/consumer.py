"""Consuming a work stream with a consumer group: the delivery guarantees of every service.

A :class:`StreamConsumer` reads one work stream in one consumer group and calls a handler per
entry, several at a time. Its rules:

- An entry is acknowledged (XACK) only after its handler returned: a handler that raises or a
  process that dies leaves the entry pending (field cases C15, C20). A handler whose last write
  is a script may acknowledge its own entry in it, once nothing is left to do
  (:func:`current_delivery`); the consumer then sends no acknowledgement of its own.
- On start it first drains its own pending entries (XREADGROUP from ``0``), then reads new
  entries (``>``): a restarted process that keeps its consumer name finishes what it left.
- Entries pending on any consumer for longer than ``min_idle_ms`` are claimed in batches
  (XAUTOCLAIM; on Redis ≥ 8.4, XREADGROUP's ``CLAIM`` option instead) and handled again, so a
  dead worker's entries are finished by a live one. They go before new entries: a look for idle
  entries that found no free slot takes the next one that frees (:func:`reclaim_owed`), so a
  busy consumer does not fill every freed slot with new entries while a dead one's wait.
- A consumer never takes into its hands (new reads, claims of idle entries, the drain of its
  own pending entries, retries) more entries than it has free handler slots, so no entry waits
  in the process for a slot while its idle time runs out. Every entry in its hands (running,
  waiting to run alone, waiting for a retry) has its claim renewed every ``renew_interval_ms``
  (XCLAIM JUSTID, which counts no delivery), so a live worker's job, however long, is never
  claimed by another one; and just before a handler starts, the consumer confirms that it still
  owns the entry (an entry another consumer claimed meanwhile is left to it, not run). An entry
  read new that starts within half of ``min_idle_ms`` of its read needs no such look: no
  consumer may claim an entry idle for less than ``min_idle_ms``.
- A handler that raises is retried by the same consumer after a growing delay; one that raises
  :class:`Deferred` is handed the entry again after the delay it asks for, without counting it.
- An entry whose handler started twice before without success (its process may have died on it
  twice) is a suspect (:func:`is_suspect`): it runs only beside other suspects, never beside an
  entry that is not one, in a group no bigger than its :func:`group_limit`, which halves with
  each further failed start down to 1 (alone), and is 1 at its last allowed start. So the
  suspects of one kill run half of them at a time, a group that finishes clears its members, and
  a group whose process dies again splits: a poison entry that kills its worker is narrowed down
  in about log2(``concurrency``) crashes (C17), and its innocent companions finish in the groups
  that survive instead of one at a time. One failed start makes no suspect: a process killed
  with 64 handlers running leaves 64 entries that started once, and they run side by side again.
  Running each suspect alone (before) made one ``kill -9`` of a busy worker cost minutes of
  recovery (``bench/chaos.py``). Suspects and the other entries take turns, so neither waits
  for more than one turn of the other. An entry that has to wait for its turn is counted once
  it may start, so a crash while it waits does not count for it (nor is it a suspect for it),
  and a suspect's last start is always alone: no entry is dead-lettered for another's crash.
- Deliveries are counted by agentstream itself (:mod:`agentstream.runtime.claims`): once per handler
  start, before it runs, so a process killed mid-handler counts, while re-reads, claim renewals
  and deferrals do not (Redis's own ``times_delivered`` counts all of those: field case C17).
  The first start of an entry read new is counted by the entry being pending with no count
  (written down at its next start, or as 0 when it is given back unstarted), so the common case,
  an entry that succeeds at once, costs no command for its count.
  An entry whose handler started ``max_deliveries`` times without success goes to the
  dead-letter stream (payload, attempts, Redis's delivery count, last error) after
  ``on_dead_letter`` has put a failure into its trace; then it is acknowledged. The dead-letter
  stream keeps a bounded excerpt of each field and is capped (``MAXLEN ~``; it is no work stream).
- A pending entry whose body is gone (trimmed or deleted by someone else while pending: C18)
  is acknowledged, recorded on the dead-letter stream as lost, logged and counted.
- Consumers of the group idle past ``delete_idle_consumers_ms`` that own no pending entries
  (dead or rescaled pods) are deleted, atomically with the check; one that owns entries never is.
- Every ``trim_interval_ms`` the stream is trimmed below what every group acknowledged
  (:mod:`agentstream.runtime.retention`); nothing pending or undelivered is ever trimmed.
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
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentstream.errors import Deferred
from agentstream.ops import logs, metrics
from agentstream.ops.settings import ConsumerConfig, Settings
from agentstream.runtime.claims import (
    count_attempt,
    delete_idle_consumers,
    keep_claims,
    release_claims,
    server_version,
    set_attempts,
    start_attempt,
    supports_claim_option,
)
from agentstream.runtime.entries import keep_doubled_fields
from agentstream.runtime.lua import script
from agentstream.runtime.retention import trim_acknowledged
from agentstream.wire.checks import excerpt
from agentstream.wire.keys import attempts_key as default_attempts_key

log = logging.getLogger("agentstream.runtime.consumer")

Fields = dict[bytes, bytes]
Handler = Callable[[str, Fields], Awaitable[None]]
DeadLetterHook = Callable[[str, Fields, str], Awaitable[None]]

_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
_FIRST_BACKOFF_S = 0.1
_RECLAIM_CALLS = 20  # XAUTOCLAIM calls per reclaim round at most (each scans 10 x count entries)
__all__ = [
    "ConsumerConfig",
    "Deferred",
    "Delivery",
    "IsolationGate",
    "StreamConsumer",
    "current_delivery",
    "group_consumer",
    "partition_consumers",
]

UNKNOWN_ERROR = "unknown: the handler never returned (its process died or was killed while handling the entry)"


@dataclass
class Delivery:
    """The work entry a handler is handling, for a handler that acknowledges it in its own last
    write (see :func:`current_delivery`).

    Attributes:
        stream: the work stream.
        group: the consumer group.
        attempts_key: the hash of its attempts counters (its fields ``<entry id>`` and
            ``<entry id>:error`` go with the acknowledgement).
        entry_id: the entry's id.
        acknowledged: set by the handler once a write of its own acknowledged the entry (the
            consumer then sends no acknowledgement).
        task: the task that runs the handler (only it sees the delivery).
    """

    stream: str
    group: str
    attempts_key: str
    entry_id: str
    acknowledged: bool = False
    task: asyncio.Task | None = None

    def ack_args(self) -> tuple[str, str, str, str]:
        """``(stream, group, attempts key, entry id)``."""
        return self.stream, self.group, self.attempts_key, self.entry_id


_DELIVERY: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar("agentstream_delivery", default=None)


def current_delivery() -> Delivery | None:
    """The entry the running handler handles, or None outside a handler's own task.

    A handler may acknowledge it in a script that does its last write (the acknowledgement must
    hold only if that write does: the work is then done, nothing after it can fail), then set
    :attr:`Delivery.acknowledged`. Tasks the handler starts see None (they inherit its context
    variables, not its entry): only the handler itself knows when its work is done.
    """
    delivery = _DELIVERY.get()
    if delivery is None or delivery.task is not asyncio.current_task():
        return None
    return delivery


ISOLATE_AFTER_STARTS = 2
"""Failed starts after which an entry is a suspect: it runs only beside other suspects, in a
group that halves with each further failed start (see :func:`group_limit`)."""


def is_suspect(attempts: int, concurrency: int, max_deliveries: int) -> bool:
    """Whether an entry at its ``attempts``-th handler start (this one counted) is a suspect, when
    its consumer runs handlers side by side (``concurrency`` > 1): after
    :data:`ISOLATE_AFTER_STARTS` failed starts, and at its last allowed start (``max_deliveries``)
    after any failed one. A suspect never runs beside an entry that is not one. Pure."""
    if concurrency <= 1 or attempts <= 1:
        return False
    return attempts > ISOLATE_AFTER_STARTS or attempts >= max_deliveries


def group_limit(attempts: int, concurrency: int, max_deliveries: int) -> int:
    """The most handlers that may run in the process (this one included) while an entry runs at
    its ``attempts``-th start (this one counted) → 1 to ``concurrency``. Pure.

    ``concurrency`` for an entry that is no suspect (:func:`is_suspect`); for a suspect, half of
    ``concurrency`` after :data:`ISOLATE_AFTER_STARTS` failed starts, halved again at each further
    one, and 1 (alone) from the start that reaches 1 on and at its last allowed start: the
    suspects of one kill run in groups, and a group whose process dies again runs next in groups
    half as big, so a poison entry is narrowed down in about log2(``concurrency``) crashes while
    the innocent entries beside it finish in the groups that survive. Its last start alone, no
    entry is dead-lettered for a crash beside it.

    Example (``concurrency`` 64, ``max_deliveries`` 10): starts 1 and 2 → 64, 3 → 32, 4 → 16,
    5 → 8, 6 → 4, 7 → 2, 8 to 10 → 1.
    """
    if not is_suspect(attempts, concurrency, max_deliveries):
        return max(1, concurrency)
    if attempts >= max_deliveries:
        return 1
    failed = attempts - 1
    return max(1, concurrency >> (failed - ISOLATE_AFTER_STARTS + 1))


def runs_alone(attempts: int, concurrency: int, max_deliveries: int) -> bool:
    """Whether an entry at its ``attempts``-th start runs with no other handler beside it
    (:func:`group_limit` is 1 while handlers could run side by side). Pure."""
    return concurrency > 1 and group_limit(attempts, concurrency, max_deliveries) == 1


def may_enter(
    limit: int | None,
    normal_running: int,
    suspect_limits: list[int],
    waiting_limits: list[int],
    *,
    normals_waiting: int = 0,
    admitted: bool = False,
) -> bool:
    """Whether a handler may start now in the process (the rule of :class:`IsolationGate`). Pure.

    Args:
        limit: the entry's :func:`group_limit` when it is a suspect, None when it is not.
        normal_running: handlers of entries that are no suspects running now.
        suspect_limits: the group limits of the suspects running now.
        waiting_limits: the group limits of the suspects waiting to start (this one included).
        normals_waiting: entries that are no suspects waiting to start (this one included).
        admitted: the entry was waiting when its kind was given the turn (:func:`next_turn`).

    Entries that are suspects and entries that are not take turns: one kind never runs beside
    the other, and once the other kind waits, only the entries given the turn may still start
    (so neither kind waits for more than one turn of the other). A suspect also keeps its group
    within its own limit and the limit of every suspect in it, and lets a waiting suspect with a
    smaller limit go first (a narrowed-down suspect is not starved by bigger groups).
    """
    if limit is None:
        return not suspect_limits and (not waiting_limits or admitted)
    if normal_running or (normals_waiting and not admitted):
        return False
    size = len(suspect_limits) + 1
    if size > min([limit, *suspect_limits]):
        return False
    return all(other >= limit for other in waiting_limits)


def reclaim_owed(free: int, *, stopping: bool) -> bool:
    """Whether a round of reclaiming idle entries stopped before the end of its scan of the
    pending entries list for want of a free handler slot (``free`` slots left): then its scan
    goes on at the next free slot, before any new entry is read, since idle entries of a dead
    consumer have waited longest. Pure."""
    return free <= 0 and not stopping


NORMAL_TURN = "normal"
SUSPECTS_TURN = "suspects"


def next_turn(running: bool, normals_waiting: int, suspects_waiting: int, last: str) -> str | None:
    """Which kind of entry is given the turn (:data:`NORMAL_TURN` or :data:`SUSPECTS_TURN`), its
    waiting entries all admitted, or None while handlers run or nobody waits. Pure.

    When nothing runs and both kinds wait, the kind that did not have the last turn gets it."""
    if running or not (normals_waiting or suspects_waiting):
        return None
    if normals_waiting and suspects_waiting:
        return SUSPECTS_TURN if last == NORMAL_TURN else NORMAL_TURN
    return NORMAL_TURN if normals_waiting else SUSPECTS_TURN


def suspects_admitted(waiting_limits: list[int]) -> int:
    """How many waiting suspects a suspects' turn admits, the smallest limits first: one group,
    as big as the smallest of their limits allows (the rest wait for the next suspects' turn,
    so the other entries wait for one group, not for every suspect in hand). Pure."""
    return min(len(waiting_limits), min(waiting_limits)) if waiting_limits else 0


@dataclass
class _Waiter:
    limit: int | None  # a suspect's group limit; None: no suspect
    admitted: bool = False


class IsolationGate:
    """Who may run now among the handlers of one process's consumers of one work stream (all its
    partitions), by :func:`may_enter` and :func:`next_turn`: entries that failed twice before
    (suspects) run only beside each other, in groups no bigger than their :func:`group_limit`;
    suspects and the others take turns. Shared by the consumers of a stream's partitions, so a
    suspect in one partition takes no innocent entry of another with it when it kills its worker."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._normal_running = 0
        self._suspects: list[int] = []  # the group limits of the suspects running
        self._waiters: list[_Waiter] = []
        self._last = NORMAL_TURN

    def _may_enter(self, waiter: _Waiter) -> bool:
        waiting_limits = [w.limit for w in self._waiters if w.limit is not None]
        normals_waiting = sum(1 for w in self._waiters if w.limit is None)
        return may_enter(
            waiter.limit,
            self._normal_running,
            self._suspects,
            waiting_limits,
            normals_waiting=normals_waiting,
            admitted=waiter.admitted,
        )

    def _give_turn(self) -> None:
        """When nothing runs, give the turn to a kind: its waiting entries are admitted."""
        normals = sum(1 for w in self._waiters if w.limit is None)
        turn = next_turn(
            bool(self._normal_running or self._suspects), normals, len(self._waiters) - normals, self._last
        )
        if turn is None:
            return
        self._last = turn
        if turn == NORMAL_TURN:
            for w in self._waiters:
                w.admitted = w.admitted or w.limit is None
            return
        suspects = sorted((w for w in self._waiters if w.limit is not None), key=lambda w: w.limit or 0)
        for w in suspects[: suspects_admitted([w.limit or 0 for w in suspects])]:
            w.admitted = True

    def try_enter(self, limit: int | None, stream: str) -> bool:
        """Enter at once when :func:`may_enter` allows it without waiting → whether it did (then
        :meth:`leave` follows; else :meth:`enter` waits for the right)."""
        if not self._may_enter(_Waiter(limit)):
            return False
        self._entered(limit, stream)
        return True

    def _entered(self, limit: int | None, stream: str) -> None:
        if limit is None:
            self._normal_running += 1
            return
        self._suspects.append(limit)
        log.info(
            "handling an entry of %s that failed before beside suspects only (%d running, at most %d)",
            stream,
            len(self._suspects),
            min(self._suspects),
        )

    async def enter(self, limit: int | None, stream: str) -> None:
        """Wait for the right to run: ``limit`` is the entry's group limit when it is a suspect,
        None when it is not (:func:`may_enter`)."""
        async with self._cond:
            waiter = _Waiter(limit)
            self._waiters.append(waiter)
            try:
                self._give_turn()
                await self._cond.wait_for(lambda: self._may_enter(waiter))
                self._entered(limit, stream)
            finally:
                self._waiters.remove(waiter)
                self._give_turn()
                self._cond.notify_all()

    async def leave(self, limit: int | None) -> None:
        if not self._waiters and not self._cond.locked():  # nobody to tell (every handler's end)
            if limit is None:
                self._normal_running -= 1
            else:
                self._suspects.remove(limit)
            return
        async with self._cond:
            if limit is None:
                self._normal_running -= 1
            else:
                self._suspects.remove(limit)
            self._give_turn()
            self._cond.notify_all()


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
            :func:`agentstream.wire.keys.attempts_key`).
        log_ids: ``log_ids(fields)`` → the ids (trace, turn, call) bound to every log line
            made while the entry is handled (default :func:`agentstream.ops.logs.ids_of`).
        gate: the :class:`IsolationGate` shared with the consumers of the stream's other
            partitions in this process (default: a gate of this consumer's own).
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
        gate: IsolationGate | None = None,
    ):
        self.redis = keep_doubled_fields(redis)  # an entry that repeats a field is seen as such
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.handler = handler
        self.dead_stream = dead_stream
        self.on_dead_letter = on_dead_letter
        self.config = config or ConsumerConfig()
        self.attempts_key = attempts_key or default_attempts_key(stream, group)
        # the default counter shares the stream's slot: acknowledging is one script
        self._ack_script = (
            redis.register_script(_ACK_LUA) if self.attempts_key == default_attempts_key(stream, group) else None
        )
        self.log_ids = log_ids or logs.ids_of
        self._slot_freed = asyncio.Event()  # set when a handler finishes (a slot is free again)
        self._reclaim_cursor = "0-0"  # where the scan for idle entries goes on
        self._drain_cursor: str | None = "0"  # where the drain of own pending entries goes on; None: done
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, tuple[float, Fields]] = {}  # entry → (due time, fields): retries
        self._refunds: dict[str, int] = {}  # entry → counted starts that were not deliveries
        self._interrupted: set[str] = set()  # entries whose handler was cancelled (shutdown)
        self._unwritten: set[str] = set()  # entries whose current start is their first, not written down
        self._gate = gate or IsolationGate()  # suspects (entries that failed twice before) run in shrinking groups
        self._acking: tuple[list[str], asyncio.Future[None]] | None = None  # the acks of this turn of the loop
        self._claim_option: bool | None = None
        self.handled = 0
        self.failed = 0
        self.deferred = 0
        self.reclaimed = 0
        self.dead_lettered = 0
        self.lost = 0
        self.trimmed = 0
        self.claim_renewals = 0
        self.consumers_deleted = 0
        self.taken_before_start = 0

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
        keeper = asyncio.create_task(self._keep_claims_loop(stop), name=f"claims:{self.stream}")
        try:
            await self._consume(stop)
            await self._finish_in_hand()
        except asyncio.CancelledError:
            await self._abandon_in_hand()
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _consume(self, stop: asyncio.Event) -> None:
        """Rounds of :meth:`_round` until ``stop`` is set; Redis trouble backs off, growing and
        jittered, and a missing stream or group is recreated."""
        loop = asyncio.get_running_loop()
        rounds = _Rounds(
            next_prune=loop.time() + self.config.prune_interval_s * random.random(),
            next_trim=loop.time() + self.config.trim_interval_ms / 1000.0 * random.random(),
        )
        while not stop.is_set():
            try:
                await self._round(stop, rounds)
                rounds.backoff_s = _FIRST_BACKOFF_S
            except ResponseError as exc:
                if "NOGROUP" in str(exc) or "no longer exists" in str(exc):
                    rounds.need_group = True
                    log.warning(
                        "stream %s or its group %s is gone (Redis restarted without persistence or was "
                        "flushed?); recreating in %.1f s",
                        self.stream,
                        self.group,
                        rounds.backoff_s,
                    )
                else:
                    log.error("Redis error on %s: %s; retrying in %.1f s", self.stream, exc, rounds.backoff_s)
                await self._back_off(stop, rounds)
            except _REDIS_DOWN as exc:
                log.warning("lost Redis on %s (%s); reconnecting in %.1f s", self.stream, exc, rounds.backoff_s)
                await self._back_off(stop, rounds)

    async def _back_off(self, stop: asyncio.Event, rounds: _Rounds) -> None:
        await _sleep_or_stop(stop, _jitter(rounds.backoff_s))
        rounds.backoff_s = min(rounds.backoff_s * 2, self.config.backoff_max_s)

    async def _round(self, stop: asyncio.Event, rounds: _Rounds) -> None:
        """One round: retries due, the drain of own pending entries, idle entries of other
        consumers, housekeeping, then new entries (or a wait for a free slot)."""
        loop = asyncio.get_running_loop()
        if rounds.need_group:
            await self.ensure_group()
            rounds.need_group = False
        if self._claim_option is None:
            self._claim_option = await self._detect_claim_option()
        await self._retry_due()
        if self._drain_cursor is not None:
            await self._drain_own_pending(stop)
        now = loop.time()
        reclaiming = self._drain_cursor is None and not self._claim_option
        if reclaiming and (rounds.reclaim_owed or now >= rounds.next_reclaim):
            rounds.reclaim_owed = await self._reclaim(stop)
            if not rounds.reclaim_owed:
                rounds.next_reclaim = now + self.config.reclaim_interval_ms / 1000.0
        await self._housekeeping(now, rounds)
        if self._drain_cursor is None and not rounds.reclaim_owed:
            await self._read_new(stop, block_ms=self._block_for(loop.time()))
        else:  # draining, or a dead consumer's entries wait for a slot: they go before new ones
            await self._wait_for_slot(self._block_for(loop.time()))

    async def _housekeeping(self, now: float, rounds: _Rounds) -> None:
        """Delete idle consumers and trim the stream when their time has come."""
        if self.config.delete_idle_consumers_ms and now >= rounds.next_prune:
            await self._prune_consumers()
            rounds.next_prune = now + self.config.prune_interval_s
        if self.config.trim_interval_ms and now >= rounds.next_trim:
            await self._trim()
            rounds.next_trim = now + self.config.trim_interval_ms / 1000.0

    async def _finish_in_hand(self) -> None:
        """After ``stop``: wait for the handlers running, give back the entries waiting for a retry."""
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        if self._waiting:
            await self._release(list(self._waiting), refund=False)

    async def _abandon_in_hand(self) -> None:
        """Cancelled: cancel the handlers in hand and release their entries, their interrupted
        starts uncounted, and the entries waiting for a retry."""
        for task in list(self._inflight.values()):
            if not task.cancelling():  # not already told (a cancelled gather tells its children)
                task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        held = list(self._interrupted)
        await self._release([*held, *self._waiting], refund=True, counted=set(held))

    async def run_until_idle(self, *, idle_reads: int = 1) -> None:
        """Handle entries until a read finds nothing ``idle_reads`` times in a row (for tests).

        Failed and deferred entries are not retried here.
        """
        await self.ensure_group()
        stop = asyncio.Event()
        while self._drain_cursor is not None:
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

    def _free(self) -> int:
        """Handler slots free now: how many entries this consumer may take into its hands."""
        return min(self.config.batch_size, self.config.concurrency - len(self._inflight))

    async def _wait_for_slot(self, timeout_ms: int) -> None:
        """Wait until a handler slot is free (at most ``timeout_ms``)."""
        if self._free() > 0:
            return
        self._slot_freed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._slot_freed.wait(), timeout=timeout_ms / 1000.0)

    async def _drain_own_pending(self, stop: asyncio.Event) -> None:
        """Dispatch the next entries pending on this consumer (left by a previous run of the
        process), no more than there are free slots; the drain is done when none are left.

        Entries not yet read stay pending (idle), so another consumer may claim them meanwhile:
        what this one holds is only what it can start.
        """
        free = self._free()
        if stop.is_set() or free <= 0 or self._drain_cursor is None:
            return
        reply = await self.redis.xreadgroup(self.group, self.consumer, {self.stream: self._drain_cursor}, count=free)
        entries = reply[0][1] if reply else []
        if not entries:
            self._drain_cursor = None
            return
        for entry_id, fields in entries:
            entry = self._drain_cursor = _s(entry_id)
            if not fields:
                await self._lost_entry(entry)
                continue
            await self._dispatch(entry, fields)

    async def _read_new(self, stop: asyncio.Event, block_ms: int | None = None) -> int:
        free = self._free()
        if free <= 0:  # never read more than can start: a waiting entry would pass its idle time
            await self._wait_for_slot(self.config.block_ms if block_ms is None else block_ms)
            return 0
        reply = await self.redis.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=free,
            block=self.config.block_ms if block_ms is None else block_ms,
            claim_min_idle_time=self.config.min_idle_ms if self._claim_option else None,
        )
        entries = reply[0][1] if reply else []
        read_at = asyncio.get_running_loop().time()
        # entries read new (not claimed by the CLAIM option) start at once: they are ours
        fresh = None if self._claim_option else read_at
        unstarted = []
        for entry_id, fields in entries:
            entry = _s(entry_id)
            if stop.is_set():
                unstarted.append(entry)  # not started: give it back at once
                continue
            if not fields:
                await self._lost_entry(entry)
                continue
            await self._dispatch(entry, fields, read_at=fresh)
        if unstarted:
            await self._release(unstarted, refund=False, unstarted=True)
        return len(entries)

    async def _reclaim(self, stop: asyncio.Event) -> bool:
        """Claim entries idle on other (dead) consumers, no more at a time than there are free
        slots. The scan goes on through the whole pending entries list (at most
        ``_RECLAIM_CALLS`` calls a round; the next round goes on where this one stopped), so idle
        entries behind many live ones are reached too.

        Returns whether the round stopped for want of a free slot before its scan ended
        (:func:`reclaim_owed`): the next slot that frees then goes to the next round, before any
        new entry, so a dead consumer's entries do not wait behind a busy handler pool."""
        start = self._reclaim_cursor
        calls = 0
        free = self._free()
        while not stop.is_set() and free > 0 and calls < _RECLAIM_CALLS:  # only what can start now
            calls += 1
            reply = await self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                min_idle_time=self.config.min_idle_ms,
                start_id=start,
                count=free,
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
            self._reclaim_cursor = next_start
            if next_start == "0-0":
                return False
            start = next_start
            free = self._free()
        return reclaim_owed(free, stopping=stop.is_set())

    async def _lost_own_pending(self, low: str, high: str | None) -> None:
        """Find and report the bodiless entries pending on this consumer between ``low`` and ``high``.

        For Redis 6.2, whose XAUTOCLAIM claims an entry deleted while pending but replies nil
        in its place: its id is found in this consumer's PEL (XPENDING), its absence by XRANGE.
        """
        held = set(self._inflight) | set(self._waiting)
        cursor = low
        while True:
            rows = await self.redis.xpending_range(
                self.stream,
                self.group,
                min=cursor,
                max=high or "+",
                count=self.config.batch_size,
                consumername=self.consumer,
            )
            ids = [_s(row["message_id"]) for row in rows]
            candidates = [entry for entry in ids if entry not in held]
            if candidates:
                pipe = self.redis.pipeline(transaction=False)
                for entry in candidates:
                    pipe.xrange(self.stream, min=entry, max=entry, count=1)
                bodies = await pipe.execute()
                for entry, body in zip(candidates, bodies, strict=True):
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
        ready = sorted((at, entry) for entry, (at, _) in self._waiting.items() if at <= now)
        due = [entry for _, entry in ready[: max(0, self._free())]]  # the rest wait (and are renewed)
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

    async def _dispatch(self, entry_id: str, fields: Fields, *, read_at: float | None = None) -> None:
        """Start handling an entry just taken into hand (the callers took no more than :meth:`_free`).

        ``read_at``: when the entry was read new (XREADGROUP ``>``, this event loop's clock), or
        None for an entry delivered before (claimed, drained, retried).
        """
        if entry_id in self._inflight or entry_id in self._waiting:
            return
        self._inflight[entry_id] = asyncio.create_task(
            self._process(entry_id, fields, read_at), name=f"entry:{entry_id}"
        )

    async def _process(self, entry_id: str, fields: Fields, read_at: float | None = None) -> None:
        # every line logged for this entry (the handler's and the consumer's) names its trace
        with logs.bind(**self._log_ids(fields)):
            await self._process_entry(entry_id, fields, read_at)

    def _first_start(self, read_at: float | None) -> bool:
        """Whether an entry starts as its first delivery, read new a moment ago: it is ours (no
        consumer may claim an entry idle less than ``min_idle_ms``), and the start is counted by
        the entry's place in the pending entries list, with no command (see
        :func:`agentstream.runtime.claims.start_attempt`)."""
        if read_at is None or self.config.max_deliveries < 1:
            return False
        return asyncio.get_running_loop().time() - read_at < self.config.min_idle_ms / 2000.0

    async def _begin(self, entry_id: str) -> int:
        """Confirm the entry is still ours and count this start → the starts so far, or 0 when it
        is not ours any more (nothing counted)."""
        refund = self._refunds.pop(entry_id, 0)
        self._unwritten.discard(entry_id)
        if self.attempts_key == default_attempts_key(self.stream, self.group):  # one script: same slot
            attempts = await start_attempt(
                self.redis, self.stream, self.attempts_key, self.group, self.consumer, entry_id, refund=refund
            )
        elif await keep_claims(self.redis, self.stream, self.group, self.consumer, [entry_id]):
            attempts = await count_attempt(self.redis, self.attempts_key, entry_id, refund=refund)
        else:
            attempts = 0
        if not attempts:
            self._not_ours(entry_id)
        return attempts

    def _log_ids(self, fields: Fields) -> dict[str, str]:
        try:
            return self.log_ids(fields)
        except Exception:  # ids for log lines must never stop the work
            return {}

    async def _process_entry(self, entry_id: str, fields: Fields, read_at: float | None = None) -> None:
        attempts = 0
        dead_round = False
        try:
            if self._first_start(read_at):
                attempts = 1
                self._unwritten.add(entry_id)
            else:
                attempts = await self._begin(entry_id)
                if not attempts:
                    return
            if attempts > self.config.max_deliveries:
                # this round starts no handler: the entry had its ``max_deliveries`` starts
                # before it, so they are what the dead letter counts (attempts - 1)
                dead_round = True
                await self._dead_letter(entry_id, fields, attempts - 1)
                return
            limit = self._suspect_limit(attempts)
            if not self._gate.try_enter(limit, self.stream):
                # not started until it may run: a crash while it waits must not count for it
                await self._uncount(entry_id)
                attempts = 0
                await self._enter(limit)
                try:
                    attempts = await self._begin(entry_id)
                except BaseException:
                    await self._leave(limit)
                    raise
                if not attempts:
                    await self._leave(limit)
                    return
            try:
                delivery = Delivery(self.stream, self.group, self.attempts_key, entry_id, task=asyncio.current_task())
                outcome = await self._call_handler(entry_id, fields, attempts, delivery)
            finally:
                await self._leave(limit)
            if outcome:
                self.handled += 1
                if delivery.acknowledged:  # by the handler's last write
                    self._unwritten.discard(entry_id)
                else:
                    await self._ack(entry_id)
        except asyncio.CancelledError:
            if attempts:
                self._interrupted.add(entry_id)
            raise
        except Exception as exc:  # Redis failed around the handler (counting, acking, dead-lettering)
            if dead_round:  # the round that failed to dead-letter started nothing: not a delivery
                self._refund(entry_id)
            delay = self._retry_delay(max(attempts, 1))
            log.warning("could not finish entry %s of %s (%s); retrying in %.1f s", entry_id, self.stream, exc, delay)
            self._wait(entry_id, fields, delay)
        finally:
            self._inflight.pop(entry_id, None)
            self._slot_freed.set()

    def _not_ours(self, entry_id: str) -> None:
        """An entry another consumer claimed before its handler started: left to it, not run."""
        self.taken_before_start += 1
        log.info(
            "entry %s of %s is no longer pending on %s (claimed by another consumer, or acknowledged); "
            "not started here",
            entry_id,
            self.stream,
            self.consumer,
        )

    async def _call_handler(self, entry_id: str, fields: Fields, attempts: int, delivery: Delivery) -> bool:
        """Run the handler → True when it succeeded (else the entry waits for a retry); it sees
        ``delivery`` as :func:`current_delivery`."""
        in_flight = metrics.HANDLERS_IN_FLIGHT.labels(service=metrics.service_of_group(self.group), stream=self.stream)
        in_flight.inc()
        bound = _DELIVERY.set(delivery)
        try:
            try:
                await self.handler(entry_id, fields)
            finally:
                _DELIVERY.reset(bound)
                in_flight.dec()
        except Deferred as signal:
            self.deferred += 1
            self._refund(entry_id)
            self._wait(entry_id, fields, signal.delay_s)
            return False
        except _REDIS_DOWN as exc:
            # Redis, not the entry, failed: retry without counting the attempt.
            self._refund(entry_id)
            delay = self._retry_delay(attempts)
            log.warning(
                "lost Redis while handling %s of %s (%s); retrying in %.1f s", entry_id, self.stream, exc, delay
            )
            self._wait(entry_id, fields, delay)
            return False
        except (Exception, SystemExit) as exc:  # any failure of any kind counts toward the dead letter
            self.failed += 1
            delay = self._retry_delay(attempts)
            then = (
                f"retrying in {delay:.1f} s"
                if attempts < self.config.max_deliveries
                else f"the last: it moves to the dead-letter stream in {delay:.1f} s"
            )
            log.exception(
                "handler failed on %s entry %s (attempt %d of %d); %s",
                self.stream,
                entry_id,
                attempts,
                self.config.max_deliveries,
                then,
            )
            self._wait(entry_id, fields, delay)
            with contextlib.suppress(Exception):
                await self.redis.hset(self.attempts_key, f"{entry_id}:error", f"{type(exc).__name__}: {exc}"[:2000])
            return False
        return True

    async def _uncount(self, entry_id: str) -> None:
        """Take back the start just counted for an entry that waits before it starts."""
        if entry_id in self._unwritten:  # its one start was not written down: now none
            self._unwritten.discard(entry_id)
            await self.redis.hset(self.attempts_key, entry_id, 0)
        else:
            await self.redis.hincrby(self.attempts_key, entry_id, -1)

    def _suspect_limit(self, attempts: int) -> int | None:
        """The group limit of an entry at its ``attempts``-th start when it is a suspect, else None."""
        cfg = self.config
        if not is_suspect(attempts, cfg.concurrency, cfg.max_deliveries):
            return None
        return group_limit(attempts, cfg.concurrency, cfg.max_deliveries)

    async def _enter(self, limit: int | None) -> None:
        await self._gate.enter(limit, self.stream)

    async def _leave(self, limit: int | None) -> None:
        await self._gate.leave(limit)

    def _refund(self, entry_id: str) -> None:
        self._refunds[entry_id] = self._refunds.get(entry_id, 0) + 1

    def _wait(self, entry_id: str, fields: Fields, delay_s: float) -> None:
        self._waiting[entry_id] = (asyncio.get_running_loop().time() + max(0.0, delay_s), fields)

    def _retry_delay(self, attempts: int) -> float:
        return min(self.config.retry_delay_s * 2 ** max(0, attempts - 1), self.config.backoff_max_s)

    async def _ack(self, entry_id: str) -> None:
        """Acknowledge a handled entry and drop its counters; returns once that ran (raises what
        the command raised).

        The entries whose handlers finish in the same turn of the event loop are acknowledged
        together, in one command (under load many do): the first waits one turn for the others.
        """
        self._unwritten.discard(entry_id)
        batch = self._acking
        if batch is not None:  # an ack waits for this turn of the loop to end: go with it
            batch[0].append(entry_id)
            try:
                await asyncio.shield(batch[1])
            except _AckAbandoned:  # its task was cancelled before the command ran
                await self._ack_ids([entry_id])
            return
        ids = [entry_id]
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acking = batch = (ids, done)
        failure: BaseException | None = None
        try:
            await asyncio.sleep(0)  # the handlers finishing now join `ids`
            self._acking = None
            await self._ack_ids(ids)
        except Exception as exc:
            failure = exc
            raise
        except BaseException:
            failure = _AckAbandoned()
            raise
        finally:
            if self._acking is batch:
                self._acking = None
            if len(ids) == 1:
                done.cancel()  # nobody joined: nobody waits for it
            elif failure is not None:
                done.set_exception(failure)
            else:
                done.set_result(None)

    async def _ack_ids(self, ids: list[str]) -> None:
        for start in range(0, len(ids), ACK_BATCH):
            chunk = ids[start : start + ACK_BATCH]
            if self._ack_script is not None:  # the counter shares the stream's slot: one command
                await self._ack_script(keys=[self.stream, self.attempts_key], args=[self.group, *chunk])
                continue
            pipe = self.redis.pipeline(transaction=False)
            pipe.xack(self.stream, self.group, *chunk)
            pipe.hdel(self.attempts_key, *(field for entry_id in chunk for field in (entry_id, f"{entry_id}:error")))
            await pipe.execute()

    async def _dead_letter(self, entry_id: str, fields: Fields, attempts: int) -> None:
        """Move an entry whose handler started ``attempts`` times without success (its
        ``max_deliveries``) to the dead-letter stream, with ``dead_deliveries`` = ``attempts``."""
        raw_error = await self.redis.hget(self.attempts_key, f"{entry_id}:error")
        error = _s(raw_error) if raw_error else UNKNOWN_ERROR
        info = await self.redis.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        times_delivered = int(info[0]["times_delivered"]) if info else 0
        log.error(
            "entry %s of %s: its handler started %d times without success (Redis counted %d deliveries); "
            "moving it to %s (last error: %s)",
            entry_id,
            self.stream,
            attempts,
            times_delivered,
            self.dead_stream,
            error,
        )
        hook_error = ""
        if self.on_dead_letter is not None:
            try:
                await self.on_dead_letter(entry_id, fields, error)
            except _REDIS_DOWN:
                raise  # Redis, not the entry: the entry is dead-lettered on a later round
            except Exception as exc:  # whatever the payload does to the hook, the entry still moves
                hook_error = f"{type(exc).__name__}: {exc}"[:2000]
                log.exception(
                    "the dead-letter hook of %s failed on entry %s; moving the entry to %s anyway",
                    self.stream,
                    entry_id,
                    self.dead_stream,
                )
        record = {name: excerpt(value, self.config.excerpt_bytes) for name, value in fields.items()}
        record.update(
            {
                b"dead_source_stream": self.stream.encode(),
                b"dead_source_id": entry_id.encode(),
                b"dead_group": self.group.encode(),
                b"dead_deliveries": str(attempts).encode(),
                b"dead_redis_deliveries": str(times_delivered).encode(),
                b"dead_error": excerpt(error, max(self.config.excerpt_bytes, 512)),
            }
        )
        if hook_error:
            record[b"dead_hook_error"] = hook_error.encode()
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(self.dead_stream, record, maxlen=self.config.dead_maxlen, approximate=True)
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
            "acknowledged (agentstream.runtime.retention), never with MAXLEN.",
            entry_id,
            self.stream,
            self.dead_stream,
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
            maxlen=self.config.dead_maxlen,
            approximate=True,
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
                        entry,
                        self.stream,
                        self.consumer,
                    )

    async def _release(
        self, entry_ids: list[str], *, refund: bool, counted: set[str] | None = None, unstarted: bool = False
    ) -> None:
        """Give entries in hand back to the group (claimable at once); uncount interrupted attempts
        (``counted`` with ``refund``), and write 0 starts for entries read new but never started
        (``unstarted``: an entry without a count is taken to have started once)."""
        if not entry_ids:
            return
        try:
            released = await release_claims(self.redis, self.stream, self.group, self.consumer, entry_ids)
            if unstarted:
                await set_attempts(self.redis, self.attempts_key, {entry: 0 for entry in released})
            if refund and counted:
                pipe = self.redis.pipeline(transaction=False)
                for entry in counted & released:
                    if entry in self._unwritten:  # its one start was not written down: now none
                        pipe.hset(self.attempts_key, entry, 0)
                    else:
                        pipe.hincrby(self.attempts_key, entry, -1)
                await pipe.execute()
        except Exception as exc:
            log.warning(
                "could not release %d entries of %s (%s); they are claimed after min_idle_ms",
                len(entry_ids),
                self.stream,
                exc,
            )
            return
        if released:
            log.info("released %d unfinished entries of %s for other consumers", len(released), self.stream)

    async def _prune_consumers(self) -> None:
        """Delete the group's consumers idle past the threshold that own no pending entries."""
        deleted = await delete_idle_consumers(
            self.redis, self.stream, self.group, idle_ms=self.config.delete_idle_consumers_ms, keep=self.consumer
        )
        for name in deleted:
            self.consumers_deleted += 1
            log.info(
                "deleted consumer %s of group %s on %s: idle over %d ms and owning no pending entries",
                name,
                self.group,
                self.stream,
                self.config.delete_idle_consumers_ms,
            )

    async def _trim(self) -> None:
        trimmed = await trim_acknowledged(self.redis, self.stream)
        if trimmed.removed:
            self.trimmed += trimmed.removed
            metrics.TRIMMED_ENTRIES.labels(stream=self.stream).inc(trimmed.removed)
            log.debug("trimmed %d acknowledged entries of %s below %s", trimmed.removed, self.stream, trimmed.threshold)


_ACK_LUA = script("ack")  # agentstream/runtime/lua/ack.lua

ACK_BATCH = 1000
"""The most entries acknowledged by one command (Lua's ``unpack`` takes a few thousand values)."""


@dataclass
class _Rounds:
    """What :meth:`StreamConsumer.run`'s rounds carry from one to the next (event loop clock, s)."""

    next_prune: float
    next_trim: float
    next_reclaim: float = 0.0
    reclaim_owed: bool = False  # a reclaim stopped for want of a slot: idle entries go before new ones
    need_group: bool = True
    backoff_s: float = _FIRST_BACKOFF_S


class _AckAbandoned(Exception):
    """The task acknowledging a batch of entries was cancelled before its command ran."""


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
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
    gate: IsolationGate | None = None,
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
        gate=gate,
    )


def partition_consumers(
    redis: aioredis.Redis,
    settings: Settings,
    *,
    stream: str,
    group: str,
    handler: Handler | Callable[[str], Handler],
    on_dead_letter: DeadLetterHook | None = None,
    per_stream: bool = False,
) -> list[StreamConsumer]:
    """A service's consumers of every partition of work stream ``stream`` (its partition-0
    name; ``AGENTSTREAM_PARTITIONS`` of them, see :mod:`agentstream.wire.keys`), one per partition,
    each as :func:`group_consumer` makes it, sharing one :class:`IsolationGate`.

    Args:
        handler: the handler of every partition, or, with ``per_stream``, a function of the
            partition's stream name that returns its handler.
    """
    gate = IsolationGate()
    return [
        group_consumer(
            redis,
            settings,
            stream=name,
            group=group,
            handler=handler(name) if per_stream else handler,  # type: ignore[call-arg,arg-type]
            on_dead_letter=on_dead_letter,
            gate=gate,
        )
        for name in settings.keys.partitions_of(stream)
    ]
