"""Consumer groups on a real Redis: ack after success, reclaim, own pending, dead letters, self-healing."""

import asyncio

import pytest

from agentstream.consumer import ConsumerConfig, StreamConsumer

pytestmark = pytest.mark.integration


def make(redis, keys, name, handler, **config):
    return StreamConsumer(
        redis, stream=f"{keys.namespace}:work", group="g", consumer=name, handler=handler,
        dead_stream=keys.dead(f"{keys.namespace}:work"),
        config=ConsumerConfig(block_ms=50, min_idle_ms=config.pop("min_idle_ms", 200), reclaim_interval_ms=50, **config),
    )


async def run_for(consumer, seconds):
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_failed_handler_leaves_entry_pending_and_another_consumer_reclaims_it(redis, keys):
    # C20 / C15: ack only after success; a live worker claims what a dead one left.
    stream = f"{keys.namespace}:work"
    seen = []

    async def failing(entry_id, fields):
        raise RuntimeError("boom")

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    c1 = make(redis, keys, "w1", failing)
    await c1.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await c1.run_until_idle()
    assert (await redis.xpending(stream, "g"))["pending"] == 1
    c2 = make(redis, keys, "w2", ok)
    await run_for(c2, 0.6)
    assert seen == [b"1"] and c2.reclaimed == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_restarted_consumer_drains_its_own_pending_first(redis, keys):
    stream = f"{keys.namespace}:work"
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)  # delivered, then the process "died"
    seen = []

    async def ok(entry_id, fields):
        seen.append(entry_id)

    again = make(redis, keys, "w1", ok, min_idle_ms=3_600_000)
    await again.run_until_idle()
    assert len(seen) == 1 and (await redis.xpending(stream, "g"))["pending"] == 0


async def test_poison_entry_goes_to_the_dead_letter_stream_and_others_flow(redis, keys):
    # C17: after N deliveries the entry moves to the dead-letter stream; it never blocks others.
    stream = f"{keys.namespace}:work"
    dead_seen = []

    async def handler(entry_id, fields):
        if fields[b"x"] == b"poison":
            raise ValueError("cannot handle")

    async def on_dead(entry_id, fields, error):
        dead_seen.append((fields[b"x"], error))

    c = make(redis, keys, "w1", handler, min_idle_ms=10, max_deliveries=3)
    c.on_dead_letter = on_dead
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"poison"})
    await redis.xadd(stream, {b"x": b"fine"})
    await run_for(c, 1.5)
    assert dead_seen == [(b"poison", "ValueError: cannot handle")]
    dead = await redis.xrange(keys.dead(stream))
    assert len(dead) == 1 and dead[0][1][b"dead_deliveries"] == b"4" and dead[0][1][b"x"] == b"poison"
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert c.handled == 1


async def test_group_deleted_under_a_running_consumer_is_recreated(redis, keys, caplog):
    stream = f"{keys.namespace}:work"
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    c = make(redis, keys, "w1", ok)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    await asyncio.sleep(0.2)
    await redis.delete(stream)  # a flush / a restart without persistence
    await asyncio.sleep(0.3)
    await redis.xadd(stream, {b"x": b"after"})
    for _ in range(50):
        if seen:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert seen == [b"after"]
    assert any("recreating" in r.getMessage() for r in caplog.records)


async def test_group_created_before_entries_delivers_existing_entries(redis, keys):
    # C20: the group starts at 0, reads use '>': entries published before any worker are delivered.
    stream = f"{keys.namespace}:work"
    await redis.xadd(stream, {b"x": b"early"})
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    await make(redis, keys, "w1", ok).run_until_idle()
    assert seen == [b"early"]
