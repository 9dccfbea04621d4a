"""Trimming work streams only below what every consumer group acknowledged (C18)."""

import asyncio

import pytest

from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer
from agentstream.runtime.retention import trim_acknowledged

pytestmark = pytest.mark.integration


async def ids(redis, stream):
    return [e[0].decode() for e in await redis.xrange(stream)]


async def test_nothing_pending_or_undelivered_is_trimmed_across_groups(redis, keys):
    stream = f"{keys.namespace}:work"
    await redis.xgroup_create(stream, "a", id="0", mkstream=True)
    await redis.xgroup_create(stream, "b", id="0")
    for i in range(1, 7):
        await redis.xadd(stream, {b"n": str(i).encode()}, id=f"{i}-0")
    # group a: 1..4 delivered, 1,2,4 acked, 3 pending; 5,6 undelivered
    await redis.xreadgroup("a", "c", {stream: ">"}, count=4)
    await redis.xack(stream, "a", "1-0", "2-0", "4-0")
    # group b: 1..6 delivered, all acked but 5
    await redis.xreadgroup("b", "c", {stream: ">"})
    await redis.xack(stream, "b", "1-0", "2-0", "3-0", "4-0", "6-0")
    trimmed = await trim_acknowledged(redis, stream)
    assert trimmed.removed == 2 and trimmed.threshold == "3-0"  # a's pending 3-0 is the floor
    assert await ids(redis, stream) == ["3-0", "4-0", "5-0", "6-0"]
    await redis.xack(stream, "a", "3-0")
    await trim_acknowledged(redis, stream)
    assert await ids(redis, stream) == ["5-0", "6-0"]  # a never got 5, 6; b still holds 5
    await redis.xreadgroup("a", "c", {stream: ">"})
    await redis.xack(stream, "a", "5-0", "6-0")
    await redis.xack(stream, "b", "5-0")
    await trim_acknowledged(redis, stream)
    assert await ids(redis, stream) == []


async def test_a_stream_without_groups_is_never_trimmed(redis, keys):
    stream = f"{keys.namespace}:replies"
    for _ in range(3):
        await redis.xadd(stream, {b"x": b"1"})
    assert (await trim_acknowledged(redis, stream)).removed == 0
    assert await redis.xlen(stream) == 3
    assert (await trim_acknowledged(redis, f"{keys.namespace}:missing")).threshold is None


async def test_c18_the_trim_that_maxlen_would_do_keeps_the_pending_entry(redis, keys):
    # C18's input, with agentstream's trim instead of MAXLEN 1: 1-0 is pending, so it stays.
    stream = f"{keys.namespace}:s"
    await redis.xgroup_create(stream, "workers", id="$", mkstream=True)
    await redis.xadd(stream, {b"ev": b"e1"}, id="1-0")
    await redis.xreadgroup("workers", "w1", {stream: ">"})
    await redis.xadd(stream, {b"ev": b"e2"}, id="2-0")
    await trim_acknowledged(redis, stream)
    reread = await redis.xreadgroup("workers", "w1", {stream: "0"})
    assert reread[0][1][0] == (b"1-0", {b"ev": b"e1"})  # body intact, not nil


async def test_consumers_trim_what_they_acknowledged_as_they_run(redis, keys):
    stream = f"{keys.namespace}:work"
    seen = []

    async def ok(entry_id, fields):
        seen.append(entry_id)

    c = StreamConsumer(
        redis,
        stream=stream,
        group="g",
        consumer="w1",
        handler=ok,
        dead_stream=keys.dead(stream),
        config=ConsumerConfig(block_ms=50, trim_interval_ms=100),
    )
    await c.ensure_group()
    for i in range(5):
        await redis.xadd(stream, {b"n": str(i).encode()})
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    for _ in range(60):
        await asyncio.sleep(0.05)
        if len(seen) == 5 and await redis.xlen(stream) == 0:
            break
    stop.set()
    await asyncio.wait_for(task, 5)
    assert len(seen) == 5 and await redis.xlen(stream) == 0 and c.trimmed == 5
