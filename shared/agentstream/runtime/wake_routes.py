"""An agent-loop process's own wake-up streams: sticky wake-ups, and their hand-over when it goes.

The rules are :mod:`agentstream.steps.wake_routes`'s; this module runs them on Redis. For each
partition of ``<ns>:wake``, an agent-loop process (its consumer name the *owner*) runs one
:class:`OwnWakeups`:

- it beats: one script (``lua/beat_wake_owner.lua``) creates its stream
  ``<wake partition>:to:{<wake partition>}:<owner>`` and the group on it when missing, sets its expiry in the
  partition's owners set ``<wake partition>:owners:{<wake partition>}`` to now + ``ttl_ms`` and returns the owners
  whose expiry passed; every ``beat_ms`` (jittered);
- it reads its stream in the agent loop's group with a :class:`~agentstream.runtime.consumer.StreamConsumer`
  of its own (every delivery guarantee of a work stream: a kill between read and handled leaves
  the entry pending in its stream, handed over with the rest below);
- at each beat it hands over the stream of every stale owner (a process killed, or cut off from
  Redis longer than ``ttl_ms``) to the shared stream, one script per batch
  (``lua/hand_over_wakes.lua``): what that owner's group had not acknowledged is added anew to the
  shared stream, then its stream and its entry in the set are deleted;
- when the service stops gracefully it leaves the set first (wake-ups sent from then on go to the
  shared stream), lets its consumer finish what it holds, then hands its own stream over. Killed
  (or cancelled without a stop), it hands nothing over: its expiry passes and a live agent loop
  does it.

A wake-up is a hint: one that reaches the shared stream instead costs a fold of the conversation
on another process, never a step; a wake-up lost anyway (a stream deleted by hand) is the
watchdog's (:mod:`agentstream.runtime.watchdog`).

Redis references: XGROUP CREATE, ZADD, ZRANGEBYSCORE, XINFO GROUPS, XPENDING, XRANGE, XADD, XACK,
XDEL, DEL, ZREM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

import redis.asyncio as aioredis

from agentstream.ops.settings import Settings
from agentstream.runtime.consumer import DeadLetterHook, Handler, IsolationGate, StreamConsumer
from agentstream.runtime.lua import script
from agentstream.steps.wake_routes import Liveness, liveness
from agentstream.wire.keys import AGENT_LOOP_GROUP, Keys, attempts_key, owner_problem, partition_stream

log = logging.getLogger("agentstream.runtime.wake_routes")

_BEAT_LUA = script("beat_wake_owner")  # agentstream/runtime/lua/beat_wake_owner.lua
_HAND_OVER_LUA = script("hand_over_wakes")  # agentstream/runtime/lua/hand_over_wakes.lua

HAND_OVER_BATCH = 500
"""The most entries one hand-over script moves (it is called again while more are left)."""
STALE_PER_BEAT = 16
"""The most stale owners one beat returns (the rest at the next beats)."""


class OwnWakeups:
    """One agent-loop process's own wake-up stream of one partition (see the module docstring).

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        partition: the partition of ``<ns>:wake``.
        owner: this process's consumer name (a name :func:`agentstream.wire.keys.owner_problem`
            allows; the jobs the process publishes name it as their ``wake_to``).
        consumer: the consumer of :attr:`stream` in the agent loop's group (its handler: the
            agent loop's ``on_wake``); run and stopped by this runner.
        liveness: the owner's ``ttl_ms`` and ``beat_ms``
            (:func:`agentstream.steps.wake_routes.liveness`).
        group: the agent loop's consumer group.

    Raises:
        ConfigError: ``owner`` may not name a stream (:meth:`Keys.wake_owned`).
    """

    stream_gauges = False  # one stream per process: no gauges of their own (the shared stream has them)

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        partition: int,
        owner: str,
        consumer: StreamConsumer,
        liveness: Liveness,
        *,
        group: str = AGENT_LOOP_GROUP,
    ):
        self.redis = redis
        self.keys = keys
        self.partition = partition
        self.owner = owner
        self._group = group
        self.owners = keys.wake_owners(partition)
        self.stream = keys.wake_owned(partition, owner)
        self.shared = partition_stream(keys.wake, partition)
        self.consumer = consumer
        self.liveness = liveness
        self.connections = (1, consumer.config.concurrency)  # its consumer's (the start-up check of the pool)
        self._beat = redis.register_script(_BEAT_LUA)
        self._hand_over = redis.register_script(_HAND_OVER_LUA)
        self.handed_over = 0  # wake-ups moved from gone owners' streams (this one's own at its stop included)
        self.failed_beats = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Beat and read until ``stop`` is set, then leave the owners set, let the consumer
        finish what it holds and hand the rest over. Cancelled (a kill, or the grace period ran
        out before the stop finished), the consumer gives back what it holds and, unless
        ``stop`` was set, nothing is handed over: the owner's expiry passes and another process
        does it.

        Raises:
            Exception: what stopped the consumer (the service then stops, as for any consumer).
        """
        reading = asyncio.Event()
        task: asyncio.Task | None = None
        try:
            while not stop.is_set() and not await self.beat():  # its stream and group exist before it reads
                await _sleep_or_stop(stop, self.liveness.beat_ms / 1000.0)
            task = asyncio.create_task(self.consumer.run(reading), name=f"consume:{self.stream}")
            while not stop.is_set() and not task.done():
                await _first_of(stop, task, self.liveness.beat_ms / 1000.0 * random.uniform(0.8, 1.0))
                if not stop.is_set() and not task.done():
                    await self.beat()
            if task.done():
                task.result()  # the consumer's error stops the service
            if not stop.is_set():
                return
            await self._leave()
            reading.set()
            await task
        finally:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if stop.is_set():
                with contextlib.suppress(Exception):
                    await self.hand_over(self.owner, own=True)

    async def beat(self) -> bool:
        """Say this owner is alive and hand over the stale owners' streams → whether the beat
        went through (a failure is logged, never raised)."""
        try:
            stale = await self._beat(
                keys=[self.owners, self.stream],
                args=[self.owner, self.liveness.ttl_ms, self._group, STALE_PER_BEAT],
            )
            for raw in stale:
                gone = raw.decode() if isinstance(raw, bytes) else raw
                if gone == self.owner:
                    continue
                if owner_problem(gone) is not None:  # not written by an agent loop: no stream to hand over
                    await self.redis.zrem(self.owners, raw)
                    continue
                await self.hand_over(gone)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed_beats += 1
            log.warning(
                "could not say that %s is alive on %s (%s: %s); trying again in %.1f s",
                self.owner,
                self.owners,
                type(exc).__name__,
                exc,
                self.liveness.beat_ms / 1000.0,
            )
            return False
        return True

    async def hand_over(self, owner: str, *, own: bool = False) -> int:
        """Move the wake-ups ``owner``'s group has not acknowledged to the shared stream and
        forget the owner (``own``: this process's own at its stop; else only while ``owner``'s
        expiry has passed) → the wake-ups moved.

        Raises:
            ConfigError: ``owner`` may not name a stream (a name that some other writer put in
                the owners set).
            redis.exceptions.RedisError: as redis-py raises it.
        """
        stream = self.keys.wake_owned(self.partition, owner)
        moved = 0
        while True:
            count, state = await self._hand_over(
                keys=[self.owners, stream, self.shared, attempts_key(stream, self._group)],
                args=[owner, self._group, HAND_OVER_BATCH, "1" if own else "0"],
            )
            moved += int(count)
            if int(state) != 0:
                break
        self.handed_over += moved
        if moved:
            log.info(
                "handed %d wake-ups of %s over to %s (%s)",
                moved,
                stream,
                self.shared,
                "this process stops" if own else "its owner stopped beating: gone",
            )
        return moved

    async def _leave(self) -> None:
        """Leave the owners set: wake-ups sent from now on go to the shared stream."""
        with contextlib.suppress(Exception):
            await self.redis.zrem(self.owners, self.owner)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def _first_of(stop: asyncio.Event, task: asyncio.Task, seconds: float) -> None:
    """Wait until ``stop`` is set, ``task`` ends or ``seconds`` passed."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([waiter, task], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def own_wakeups(
    redis: aioredis.Redis,
    settings: Settings,
    handler: Callable[[str], Handler],
    on_dead_letter: DeadLetterHook | None = None,
) -> list[OwnWakeups]:
    """The :class:`OwnWakeups` of every partition of ``<ns>:wake`` for this process's consumer
    name (``settings.consumer``), each with its consumer in the agent loop's group → none when
    that name may not name a stream (:func:`agentstream.wire.keys.owner_problem`; its jobs then
    name no owner).

    Args:
        handler: a function of the stream's name that returns its handler (the agent loop's
            ``on_wake``, told the stream).
        on_dead_letter: the hook of a wake-up that failed on every delivery (it goes to the
            shared partition's dead-letter stream).
    """
    owner = settings.consumer
    if owner_problem(owner) is not None:
        return []
    keys = settings.keys
    timing = liveness(settings.min_idle_ms, settings.lease_ttl_ms)
    gate = IsolationGate()
    runners = []
    for partition in range(keys.partitions):
        stream = keys.wake_owned(partition, owner)
        consumer = StreamConsumer(
            redis,
            stream=stream,
            group=AGENT_LOOP_GROUP,
            consumer=owner,
            handler=handler(stream),
            dead_stream=keys.dead(partition_stream(keys.wake, partition)),
            on_dead_letter=on_dead_letter,
            config=settings.consumer_config(),
            gate=gate,
        )
        runners.append(OwnWakeups(redis, keys, partition, owner, consumer, timing))
    return runners
