"""The detector of blocking calls in the event loop (tests/support/blocking.py, autouse here):
a sync call made in a coroutine while the package's code runs it (``time.sleep``, a file read, a
sync Redis client) is caught, also when the package catches the error it raises (a consumer's
handler that fails is retried, not raised); the same call in a thread is not. Real Redis; the
package's own stream consumer runs the handlers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis as redis_sync

from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer

pytestmark = pytest.mark.integration


def _sleep() -> None:
    time.sleep(0.01)


def _read_file() -> None:
    Path(__file__).read_bytes()


def consumer_of(redis, keys, handler) -> StreamConsumer:
    stream = f"{keys.namespace}:work"
    return StreamConsumer(
        redis,
        stream=stream,
        group="g",
        consumer="w1",
        handler=handler,
        dead_stream=keys.dead(stream),
        config=ConsumerConfig(block_ms=50, min_idle_ms=60_000, retry_delay_s=3600),
    )


async def handle_one(redis, keys, handler) -> StreamConsumer:
    consumer = consumer_of(redis, keys, handler)
    await consumer.ensure_group()
    await redis.xadd(consumer.stream, {b"x": b"1"})
    await consumer.run_until_idle()
    return consumer


@pytest.mark.parametrize(
    ("call", "caught"),
    [
        ("time.sleep", "time.sleep"),
        ("file read", "io.BufferedReader.read"),
        ("sync Redis", "socket.socket.sendall"),
    ],
)
async def test_a_blocking_call_in_a_handler_coroutine_is_caught_though_the_consumer_catches_its_error(
    redis, redis_url, keys, blocking_calls, call, caught
):
    sync_redis = redis_sync.Redis.from_url(redis_url)
    sync_redis.ping()  # connected here, by the test (not counted): the handler's call sends on the socket
    blocking = {"time.sleep": _sleep, "file read": _read_file, "sync Redis": sync_redis.ping}[call]

    async def handler(entry_id, fields):
        blocking()

    try:
        consumer = await handle_one(redis, keys, handler)
    finally:
        sync_redis.close()
    seen = blocking_calls.take()  # taken, so the fixture does not fail this test for them
    assert caught in {function for function, _ in seen}, seen
    assert "blocking()" in seen[0][1]  # the stack names where the call was made
    # the error was raised in the handler: the consumer took it for a failure and left the entry pending
    assert consumer.failed == 1 and consumer.handled == 0
    assert (await redis.xpending(consumer.stream, "g"))["pending"] == 1


async def test_the_same_call_in_a_thread_is_not_a_blocking_call_in_the_loop(redis, keys, blocking_calls):
    async def handler(entry_id, fields):
        await asyncio.to_thread(_sleep)
        await asyncio.to_thread(_read_file)

    consumer = await handle_one(redis, keys, handler)
    assert blocking_calls.seen == []
    assert consumer.handled == 1 and consumer.failed == 0
