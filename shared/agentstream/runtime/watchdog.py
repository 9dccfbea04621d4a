"""The watchdog of waiting turns: a turn whose awaited tool work vanished ends, with a reason.

The agent loop never waits on tools: it publishes a step's tool jobs and lets go, and the
results wake it. If a job vanishes without a result (its entry deleted or trimmed while
pending, acknowledged without a result by hand or by a bug, its stream flushed), nothing would
ever wake the turn, and every later turn of the conversation would queue behind it. So:

- When the agent loop publishes a step's jobs it records where each call's job went
  (``awaited`` in the trace's key hash: turn, call id, stream and entry id of each call of that
  step; the next step's record replaces it, since a turn only ever waits on its latest step) and
  puts the trace in the namespace's *awaiting* set (a sorted set scored by publish time), see
  :func:`record_jobs` (on one Redis server the script that appends a model output and
  publishes its jobs writes the same record:
  :meth:`agentstream.runtime.store.TraceStore.apply`). A look at a trace reads
  that record and the markers of its calls (two HMGETs), never the whole key hash, which grows
  with the conversation.
- Every agent-loop process runs a :class:`Watchdog`: every ``interval_s`` it looks at the traces
  in that set that have waited at least that long. A call without a result whose job is still
  alive (its entry not yet delivered to a group, pending in one, or its call held by a running
  tool worker's run key) is fine; one whose job entry is gone, or was acknowledged by every
  group without a result, has vanished. The running turn of such a trace is ended (under the
  trace's lease, like every ending) with code :data:`LOST_WORK_CODE`, its unanswered calls each
  getting an error result first; the reason names the calls and what happened to their jobs.
- A trace none of whose recorded calls still lacks a result leaves the set; if their turn has
  not ended either, it is woken first (a wake-up hint, never state): the tool worker's own
  wake-up may never have been delivered (its stream refused it on every attempt), and without
  another hint the turn would wait for the conversation's next turn.

- A reply that could not be published because the replies stream itself refused it (a key of
  another type squatting ``<ns>:replies``, an ACL) stays owed: its ending is in the trace, and
  the trace publishes it at its next step, but a conversation with no next step would never get
  it. Such a trace is put in the partition's *owed replies* set (:func:`note_owed_reply`), and
  each round the watchdog hands the traces that have waited there ``interval_s`` to the agent
  loop (``publish_owed``), which publishes what they owe under their lease; a trace leaves the
  set once it owes nothing, so a reply goes out once an operator has deleted the squatting key,
  even after its work entry was dead-lettered.

- A tool call that awaits a person's approval holds nothing: its trace sits in the partition's
  *approvals-due* set (``<ns>:approvals:due``), scored by when its first call is due to be denied
  (:func:`agentstream.runtime.operations.note_approval_due`). Each round the watchdog wakes the
  traces that are due (a wake-up, reason ``approval_due``) and moves their score on by
  ``interval_s`` (``ZADD XX GT``: a step that noted another due time keeps it), so a wake-up that
  is lost is sent again; the woken step denies the calls that are due, and takes the trace out
  of the set once it waits on no approval. A trace that no longer exists leaves the set.

Delegation jobs are not watched here: a delegated call's work is its child trace, which the
delegation service's supervisor ends at its deadline.

Redis references: HMGET, XINFO GROUPS, XPENDING, XRANGE, ZADD, ZRANGEBYSCORE, ZREM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from agentstream.runtime.lua import script
from agentstream.runtime.operations import owed_key, wake_trace
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import Keys, partition_stream

log = logging.getLogger("agentstream.runtime.watchdog")

LOST_WORK_CODE = FailureCode.LOST_WORK
"""The TurnFailed code of a turn whose awaited work vanished."""

AWAITED_FIELD = "awaited"
"""The key-hash field that records the jobs of a trace's latest step (see :func:`record_jobs`)."""

_JOB_PREFIX = "job:"  # per call, as versions before AWAITED_FIELD recorded them (still read)

_FORGET_LUA = script("forget_awaited")  # agentstream/runtime/lua/forget_awaited.lua


def awaiting_key(keys: Keys, partition: int = 0) -> str:
    """The sorted set of traces waiting on tool jobs (member trace id, score publish time in ms)
    of one partition (``<ns>:awaiting`` for partition 0, ``<ns>:awaiting:p<k>`` for the others:
    partitioned as the work streams are, so it is no single hot key on a Redis Cluster)."""
    return partition_stream(f"{keys.namespace}:awaiting", partition)


_FORGIVE_LUA = script("forgive_owed")  # agentstream/runtime/lua/forgive_owed.lua


async def record_jobs(
    redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str, jobs: Sequence[tuple[str, str, str]]
) -> None:
    """Record where each job of a step went, ``jobs`` = ``[(call id, stream, entry id)]``, and
    put the trace in the awaiting set (see the module docstring): ``HSET awaited`` with the JSON
    list ``[[turn id, call id, stream, entry id], ...]`` (replacing the previous step's), and
    ``ZADD`` of the trace scored by the time in milliseconds; one round trip."""
    if not jobs:
        return
    record = json.dumps([[turn_id, call_id, stream, entry_id] for call_id, stream, entry_id in jobs])
    pipe = redis.pipeline(transaction=False)
    pipe.hset(keys.trace_keys(trace_id), AWAITED_FIELD, record)
    pipe.zadd(awaiting_key(keys, keys.partition(trace_id)), {trace_id: int(time.time() * 1000)})
    await pipe.execute()


@dataclass(frozen=True)
class Vanished:
    """A call whose job vanished without a result."""

    turn_id: str
    call_id: str
    what: str  # what happened to its job


EndTurn = Callable[[str, str, Sequence[Vanished]], Awaitable[None]]
PublishOwed = Callable[[str], Awaitable[bool]]
"""``await publish_owed(trace_id)`` → True when the trace owes no reply any more (it published
them, or there were none); False to look again next round (its lease was held)."""


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


REPEAT_LOG_ROUNDS = 30
"""While the watchdog's rounds fail with the same error, one ERROR line per this many rounds."""


class Watchdog:
    """Ends turns whose awaited tool work vanished (see the module docstring).

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        end_turn: ``await end_turn(trace_id, turn_id, vanished)``: ends the turn (the agent
            loop's :meth:`~agentstream.agent_loop.loop.AgentLoop.end_lost_work`).
        interval_s: how often to look, and how long a trace waits before it is looked at.
        batch: traces looked at per round at most.
        partition: the partition whose awaiting set it watches (the agent loop runs one
            watchdog per partition).
    """

    connections = (0, 0)
    """No blocking read and no handler: it looks every ``interval_s`` (for the start-up check of the
    pool, :func:`agentstream.runtime.runner.runner_connections`)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        end_turn: EndTurn,
        *,
        interval_s: float = 10.0,
        batch: int = 200,
        partition: int = 0,
        publish_owed: PublishOwed | None = None,
    ):
        self.redis = redis
        self.keys = keys
        self.stream = awaiting_key(keys, partition)  # what service.run_consumers names this runner by
        self.partition = partition
        self.owed = owed_key(keys, partition)
        self.publish_owed = publish_owed
        self._forgive = redis.register_script(_FORGIVE_LUA) if publish_owed is not None else None
        self.stream_gauges = False  # a sorted set, not a stream: no stream gauges for it
        self.end_turn = end_turn
        self.interval_s = interval_s
        self.batch = batch
        self.ended = 0
        self.failed_rounds = 0  # rounds in a row that failed with the same error
        self._failure = ""

    async def run(self, stop: asyncio.Event) -> None:
        """Look every ``interval_s`` (jittered) until ``stop`` is set; errors are logged, never raised.

        A round that fails is logged with its traceback; while the next rounds fail with the same
        error (a key of another type under the awaiting set's name stays until an operator deletes
        it), one ERROR line every :data:`REPEAT_LOG_ROUNDS` rounds says so, and the first round that
        succeeds again says how many failed.
        """
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s * random.uniform(0.8, 1.2))
                return
            except TimeoutError:
                pass
            await self.round()

    async def round(self) -> None:
        """One round of :meth:`run`: :meth:`check_once`, its failure logged (not raised)."""
        try:
            await self.check_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if text != self._failure:
                self._failure, self.failed_rounds = text, 1
                log.exception("the watchdog's round failed; trying again in %.1f s", self.interval_s)
                return
            self.failed_rounds += 1
            if self.failed_rounds % REPEAT_LOG_ROUNDS == 0:
                log.error(
                    "the watchdog's rounds still fail (%s): %d in a row; trying again every %.1f s",
                    text,
                    self.failed_rounds,
                    self.interval_s,
                )
            return
        if self._failure:
            log.info("the watchdog's round succeeded again after %d failed rounds", self.failed_rounds)
            self._failure, self.failed_rounds = "", 0

    async def check_once(self) -> int:
        """One round → how many turns it ended (the owed replies published too, see the module docstring)."""
        horizon_ms = int((time.time() - self.interval_s) * 1000)
        rows = cast(
            "list[tuple[bytes, float]]",
            await self.redis.zrangebyscore(self.stream, "-inf", horizon_ms, start=0, num=self.batch, withscores=True),
        )
        ended = 0
        for member, score in rows:
            trace_id = _s(member)
            try:
                ended += await self._check(trace_id, score)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the watchdog could not check trace %s", trace_id)
        if self.publish_owed is not None:
            await self._publish_owed(horizon_ms)
        await self.wake_due_approvals()
        return ended

    async def wake_due_approvals(self, now_ms: int | None = None) -> int:
        """Wake the traces of this partition whose calls awaiting approval are due (at ``now_ms``,
        Unix ms; default now) → how many were woken (see the module docstring)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        due_key = self.keys.approvals_due(self.partition)
        rows = cast("list[bytes]", await self.redis.zrangebyscore(due_key, "-inf", now_ms, start=0, num=self.batch))
        woken = 0
        for member in rows:
            trace_id = _s(member)
            if not await self.redis.exists(self.keys.trace(trace_id)):
                await self.redis.zrem(due_key, trace_id)  # deleted by retention: nothing waits
                continue
            await wake_trace(self.redis, self.keys, trace_id, "approval_due")
            # looked at again in a round unless the step notes its own due time (GT keeps a later one)
            await self.redis.zadd(due_key, {trace_id: now_ms + int(self.interval_s * 1000)}, xx=True, gt=True)
            woken += 1
        return woken

    async def _publish_owed(self, horizon_ms: int) -> None:
        """Hand each trace that has owed a refused reply for ``interval_s`` to ``publish_owed``;
        one that owes nothing now leaves the set."""
        assert self.publish_owed is not None
        rows = cast(
            "list[tuple[bytes, float]]",
            await self.redis.zrangebyscore(self.owed, "-inf", horizon_ms, start=0, num=self.batch, withscores=True),
        )
        for member, score in rows:
            trace_id = _s(member)
            try:
                done = await self.publish_owed(trace_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # still refused (reported on the errors stream), or Redis away: next round
                log.info(
                    "trace %s still owes a reply (%s: %s); trying again in %.1f s",
                    trace_id,
                    type(exc).__name__,
                    exc,
                    self.interval_s,
                )
                continue
            if done and self._forgive is not None:
                await self._forgive(keys=[self.owed], args=[trace_id, int(score)])

    async def _recorded(self, trace_id: str) -> dict[str, tuple[str, str, str]]:
        """The calls recorded for the trace's latest step → ``{call id: (turn id, stream, entry
        id)}`` (one HMGET; a trace recorded by an older version: its ``job:`` fields, by HSCAN)."""
        key = self.keys.trace_keys(trace_id)
        (record,) = await self.redis.hmget(key, [AWAITED_FIELD])
        recorded: dict[str, tuple[str, str, str]] = {}
        if record is not None:
            try:
                for turn_id, call_id, stream, entry_id in json.loads(record):
                    recorded[str(call_id)] = (str(turn_id), str(stream), str(entry_id))
            except (ValueError, TypeError):
                log.warning("trace %s: unreadable %r record in its key hash; not watched", trace_id, AWAITED_FIELD)
            return recorded
        async for field, value in self.redis.hscan_iter(key, match=f"{_JOB_PREFIX}*", count=500):
            try:
                turn_id, stream, entry_id = json.loads(value)
            except (ValueError, TypeError):
                continue
            recorded[_s(field)[len(_JOB_PREFIX) :]] = (str(turn_id), str(stream), str(entry_id))
        return recorded

    async def _check(self, trace_id: str, score: float) -> int:
        recorded = await self._recorded(trace_id)
        turns = sorted({turn_id for turn_id, _, _ in recorded.values()})
        fields = [f"{kind}:{call_id}" for call_id in recorded for kind in ("result", "claim")]
        fields += [f"{kind}:{turn_id}" for turn_id in turns for kind in ("end", "cancel")]
        values = await self.redis.hmget(self.keys.trace_keys(trace_id), fields) if fields else []
        hashed = {field: _s(value) for field, value in zip(fields, values, strict=True) if value is not None}
        waiting: dict[str, tuple[str, str, str]] = {}
        for call_id, (turn_id, stream, entry_id) in recorded.items():
            if f"result:{call_id}" in hashed or f"end:{turn_id}" in hashed or f"cancel:{turn_id}" in hashed:
                continue
            waiting[call_id] = (turn_id, stream, entry_id)
        if not waiting:
            stalled = sorted(t for t in turns if f"end:{t}" not in hashed and f"cancel:{t}" not in hashed)
            if stalled:  # every result is in, yet the turn did not end: its wake-up may never have come
                log.info(
                    "trace %s: every result of turn %s is in but the turn has not ended (it has waited at least "
                    "%.1f s); waking it (its wake-up was lost, or its next step is still running)",
                    trace_id,
                    stalled[0],
                    self.interval_s,
                )
                await wake_trace(self.redis, self.keys, trace_id, "watchdog")  # raises: it stays for the next round
            await self.redis.eval(_FORGET_LUA, 1, self.stream, trace_id, score)
            return 0
        vanished = []
        for call_id, (turn_id, stream, entry_id) in waiting.items():
            if stream in self.keys.partitions_of(self.keys.delegations):
                continue  # a child trace's work: the delegation supervisor's deadline covers it
            holder = hashed.get(f"claim:{call_id}", "")
            if holder and holder != f"{stream}/{entry_id}" and "/" in holder:
                stream, entry_id = holder.rsplit("/", 1)  # the job that owns the call
            if await self.redis.exists(f"{self.keys.trace(trace_id)}:run:{call_id}"):
                continue  # a tool worker runs it now
            what = await self._job_gone(stream, entry_id)
            if what and not await self.redis.hexists(self.keys.trace_keys(trace_id), f"result:{call_id}"):
                vanished.append(Vanished(turn_id, call_id, f"its job {stream}/{entry_id} {what}"))
        if not vanished:
            return 0
        by_turn: dict[str, list[Vanished]] = {}
        for v in vanished:
            by_turn.setdefault(v.turn_id, []).append(v)
        for turn_id, lost in by_turn.items():
            log.warning(
                "trace %s: turn %s waits on work that vanished (%s); ending it",
                trace_id,
                turn_id,
                "; ".join(f"call {v.call_id}: {v.what}" for v in lost),
            )
            await self.end_turn(trace_id, turn_id, lost)
            self.ended += 1
        return len(by_turn)

    async def _job_gone(self, stream: str, entry_id: str) -> str:
        """What happened to a job entry that can no longer bring a result → a description, or
        ``""`` while it still can (undelivered to some group, or pending in one)."""
        if not await self.redis.xrange(stream, min=entry_id, max=entry_id, count=1):
            return "was deleted or trimmed before it was handled"
        try:
            groups = await self.redis.xinfo_groups(stream)
        except ResponseError:
            return ""
        if not groups:
            return ""  # no worker has read the stream yet: its group will start at 0
        for group in groups:
            name = _s(group["name"])
            if _id_tuple(entry_id) > _id_tuple(_s(group["last-delivered-id"])):
                return ""  # not yet delivered to this group
            if await self.redis.xpending_range(stream, name, min=entry_id, max=entry_id, count=1):
                return ""  # pending: a worker has it, or will claim it
        return "was acknowledged without a result"
