"""The stream gauges on a real Redis: one key that cannot be read as a stream (another type,
as the watchdog's sorted set is) never keeps the other streams' gauges stale."""

from __future__ import annotations

import pytest

from agentstream.ops import metrics
from agentstream.runtime import stream_gauges

pytestmark = pytest.mark.integration


def gauge(metric, **labels) -> float:
    return metric.labels(**labels)._value.get()


async def test_a_key_of_another_type_does_not_blank_the_other_streams(redis, namespace):
    first, zset, last = f"{namespace}:g-first", f"{namespace}:g-zset", f"{namespace}:g-last"
    await redis.zadd(zset, {"trace-1": 1})
    await redis.xadd(first, {"x": "1"})
    for _ in range(3):
        await redis.xadd(last, {"x": "1"})
    await stream_gauges.observe_streams_once(redis, [first, zset, last])  # sorted: first, last, zset
    assert gauge(metrics.STREAM_LENGTH, stream=first) == 1
    assert gauge(metrics.STREAM_LENGTH, stream=last) == 3
    await stream_gauges.observe_streams_once(redis, [zset, first, last])  # the bad key first
    await redis.xadd(last, {"x": "1"})
    await stream_gauges.observe_streams_once(redis, [zset, first, last])
    assert gauge(metrics.STREAM_LENGTH, stream=last) == 4


def test_the_watchdog_is_not_given_stream_gauges():
    from agentstream.runtime.watchdog import Watchdog
    from agentstream.wire.keys import Keys

    async def end_turn(*_):
        return None

    assert Watchdog(None, Keys("ns"), end_turn).stream_gauges is False
