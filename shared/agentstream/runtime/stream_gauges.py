"""The stream gauges read from Redis (runtime: Redis commands): the length, pending entries,
consumer lag and live consumers of the streams a service consumes, set on the gauges of
:mod:`agentstream.ops.metrics` every ``AGENTSTREAM_METRICS_INTERVAL_S`` and at a scrape that finds
them older than :data:`agentstream.ops.metrics.FRESH_S`.

Commands: XLEN, XINFO GROUPS and XINFO CONSUMERS per stream (``lag`` needs Redis ≥ 7.0; without
it, an XRANGE after the group's last delivered id, at most
:data:`agentstream.ops.metrics.LAG_COUNT_CAP` entries). Nothing here raises out of a reading: a
stream that cannot be read keeps its previous gauges and is logged at debug.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from agentstream.ops import metrics

log = logging.getLogger("agentstream.ops.metrics")


class StreamObserver:
    """Reads the stream gauges of some streams: every ``interval_s`` (:meth:`run`) and on demand
    when a scrape finds them older than :data:`agentstream.ops.metrics.FRESH_S` (:meth:`refresh`).

    Args:
        redis: an asyncio Redis client.
        streams: the streams a service consumes.
        expected: streams → the consumer group that should consume them although this process
            does not (the tool queues the agent loop publishes to): with no such group yet,
            its lag is the stream's length and it has 0 live consumers.
    """

    def __init__(self, redis, streams: list[str], *, expected: Mapping[str, str] | None = None):
        self.redis = redis
        self.streams = sorted(set(streams) | set(expected or {}))
        self.expected = dict(expected or {})
        self.observed_at = 0.0  # time.monotonic() of the last full reading
        self._lock = asyncio.Lock()

    async def observe(self) -> None:
        async with self._lock:
            await observe_streams_once(self.redis, self.streams, expected=self.expected)
            self.observed_at = time.monotonic()
            metrics.STREAM_OBSERVED.set(time.time())

    async def refresh(self) -> None:
        """Read again if the last reading is older than FRESH_S; never raises, never waits
        more than SCRAPE_REFRESH_TIMEOUT_S (seconds, :mod:`agentstream.ops.metrics`)."""
        if time.monotonic() - self.observed_at < metrics.FRESH_S:
            return
        try:
            await asyncio.wait_for(self.observe(), timeout=metrics.SCRAPE_REFRESH_TIMEOUT_S)
        except Exception as exc:  # a scrape still gets the older reading
            log.debug("stream metrics at scrape failed: %s", exc)

    async def run(self, *, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.observe()
            except Exception as exc:  # metrics never take a service down
                log.debug("stream metrics failed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass


async def observe_streams(redis, streams: list[str], *, interval_s: float = 15.0, stop: asyncio.Event) -> None:
    """Every ``interval_s`` seconds, set the length, pending entries, consumer lag and live
    consumer gauges of each stream's consumer groups (XLEN, XINFO GROUPS, XINFO CONSUMERS;
    ``lag`` needs Redis ≥ 7.0)."""
    await StreamObserver(redis, streams).run(interval_s=interval_s, stop=stop)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def observe_streams_once(redis, streams: list[str], *, expected: Mapping[str, str] | None = None) -> None:
    """One observation of :func:`observe_streams`. Each stream is read on its own: one that
    cannot be read (a key of another type, a failed command) keeps its previous gauges and is
    logged, and the other streams are still read."""
    expected = expected or {}
    for stream in streams:
        try:
            await _observe_stream(redis, stream, expected)
        except Exception as exc:
            log.debug("stream metrics of %s failed: %s", stream, exc)


async def _observe_stream(redis, stream: str, expected: Mapping[str, str]) -> None:
    """The gauges of one stream and its consumer groups (see :func:`observe_streams`)."""
    length = await redis.xlen(stream)
    metrics.STREAM_LENGTH.labels(stream=stream).set(length)
    try:
        groups = await redis.xinfo_groups(stream)
    except Exception:  # the stream does not exist yet
        groups = []
    names = {_text(info["name"]) for info in groups}
    if stream in expected and expected[stream] not in names:
        # nothing has ever consumed it: every entry waits
        metrics.CONSUMER_LAG.labels(stream=stream, group=expected[stream]).set(length)
        metrics.PENDING_ENTRIES.labels(stream=stream, group=expected[stream]).set(0)
        metrics.STREAM_CONSUMERS.labels(stream=stream, group=expected[stream]).set(0)
    for info in groups:
        name = _text(info["name"])
        metrics.PENDING_ENTRIES.labels(stream=stream, group=name).set(info.get("pending", 0) or 0)
        try:
            consumers = await redis.xinfo_consumers(stream, name)
        except Exception:
            consumers = []
        live = sum(1 for c in consumers if int(c.get("idle", metrics.LIVE_IDLE_MS) or 0) < metrics.LIVE_IDLE_MS)
        metrics.STREAM_CONSUMERS.labels(stream=stream, group=name).set(live)
        lag = info.get("lag")
        if lag is None:
            # Redis < 7 has no lag, and 7.x reports none when the group's read counter is
            # unknown (a group made at an id with entries already in the stream): count the
            # entries after the last delivered id instead, up to a cap.
            last = info.get("last-delivered-id") or b"0-0"
            last = last.decode() if isinstance(last, bytes) else last
            lag = len(await redis.xrange(stream, min=f"({last}", max="+", count=metrics.LAG_COUNT_CAP))
        metrics.CONSUMER_LAG.labels(stream=stream, group=name).set(lag)
