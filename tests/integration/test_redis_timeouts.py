"""The client's socket timeout is always longer than the longest blocking read (real Redis).

redis-py's own default socket timeout is 5 s: with ``AGENTSTREAM_BLOCK_MS`` above it, every idle
blocking read would end in a socket timeout, a reconnect and a warning. The block here (6 s) is
above that default.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from agentstream.errors import ConfigError
from agentstream.ops.settings import Settings
from agentstream.runtime.connection import SOCKET_TIMEOUT_MARGIN_S, connect, socket_timeout_s
from tests.support.redis_server import single_node_only

pytestmark = pytest.mark.integration

BLOCK_MS = 6000


@single_node_only(
    "it compares with a plain redis-py client of one server and follows one connection by CLIENT ID "
    "(a cluster client's commands go to several nodes); the next test covers the long block on a cluster"
)
@pytest.mark.slow
async def test_a_read_blocking_longer_than_redis_pys_default_timeout_ends_empty_on_the_same_connection(redis_url, keys):
    client = connect(redis_url, block_ms=BLOCK_MS)
    plain = aioredis.Redis.from_url(redis_url)  # redis-py's defaults: what the services had before
    stream = f"{keys.namespace}:idle"
    try:
        before = await client.client_id()

        async def ours():
            start = time.monotonic()
            reply = await client.xread({stream: "$"}, block=BLOCK_MS)
            return reply, time.monotonic() - start

        async def theirs():
            with pytest.raises(redis.exceptions.TimeoutError):
                await plain.xread({stream: "$"}, block=BLOCK_MS)

        (reply, waited), _ = await asyncio.gather(ours(), theirs())
        assert not reply and waited >= BLOCK_MS / 1000 - 0.2  # the server's empty reply, after the whole block
        assert await client.client_id() == before  # no timeout, no reconnect in between
    finally:
        await client.aclose()
        await plain.aclose()


@pytest.mark.slow
async def test_an_entry_added_during_a_long_block_is_read_by_that_block(redis_url, keys):
    client = connect(redis_url, block_ms=BLOCK_MS)
    writer = connect(redis_url)
    stream = f"{keys.namespace}:late"
    try:

        async def add_later():
            await asyncio.sleep(5.5)  # after redis-py's default timeout would have fired
            await writer.xadd(stream, {"cancel": "x"})

        task = asyncio.create_task(add_later())
        reply = await client.xread({stream: "$"}, block=BLOCK_MS)
        await task
        assert reply and reply[0][1][0][1] == {b"cancel": b"x"}
    finally:
        await client.aclose()
        await writer.aclose()


def test_the_timeout_follows_the_block_setting():
    settings = Settings(_env_file=None, block_ms=30_000)
    assert socket_timeout_s(settings.block_ms) == 30.0 + SOCKET_TIMEOUT_MARGIN_S
    assert socket_timeout_s(100) == 1.0 + SOCKET_TIMEOUT_MARGIN_S  # the fixed 1 s reads (cancel, follow) count too


def test_a_url_whose_socket_timeout_is_shorter_than_the_block_is_refused_at_startup(redis_url):
    with pytest.raises(ConfigError, match=r"socket_timeout=2 s.*AGENTSTREAM_BLOCK_MS"):
        connect(f"{redis_url}?socket_timeout=2", block_ms=BLOCK_MS)
    connect(f"{redis_url}?socket_timeout=10", block_ms=BLOCK_MS)  # longer than the block: taken as is


def test_every_kind_of_connection_sends_the_lean_way():
    """TCP, TLS, unix-socket and cluster-node connections all send with the lean write path
    (one task and one timer fewer per command than redis-py's own)."""
    from agentstream.runtime.connection import LeanConnection, LeanSSLConnection, LeanUnixConnection

    assert connect("redis://127.0.0.1:9/0").connection_pool.connection_class is LeanConnection
    assert connect("rediss://127.0.0.1:9/0").connection_pool.connection_class is LeanSSLConnection
    assert connect("unix:///tmp/agentstream-nowhere.sock").connection_pool.connection_class is LeanUnixConnection
    cluster = connect("redis+cluster://127.0.0.1:9/0")
    assert {type(n).__name__ for n in cluster.nodes_manager.startup_nodes.values()} == {"ClusterNode"}
    assert all(n.connection_class is LeanConnection for n in cluster.nodes_manager.startup_nodes.values())
    assert cluster.nodes_manager.connection_kwargs["connection_class"] is LeanConnection  # nodes found later


@pytest.mark.slow
async def test_a_write_to_a_redis_that_stopped_reading_times_out_and_the_connection_recovers():
    """The socket timeout still bounds a write that cannot drain (the lean path arms it only
    then): a command too big for the socket buffers, sent to a stopped Redis, fails with
    redis-py's TimeoutError after about the timeout, and the client works once Redis is back."""
    import os
    import signal

    from tests.support.redis_server import RestartableRedis

    with RestartableRedis() as server:
        client = connect(f"{server.url}?socket_timeout=2.5")
        try:
            assert await client.ping()
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                start = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError, match="writing"):
                    await client.set("big", b"x" * (64 * 1024 * 1024))
                waited = time.monotonic() - start
                assert 2.0 <= waited < 10.0
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert await client.set("small", b"y")
            assert await client.get("small") == b"y"
        finally:
            await client.aclose()


@single_node_only("it kills the client's connections by CLIENT KILL on one server")
async def test_a_command_whose_connection_is_killed_raises_once_and_the_next_one_reconnects(redis_url, keys):
    """A command is sent once (see connect()): one whose connection dies raises the connection
    error at once, instead of being repeated beneath its caller (a repeated append recorded a
    tool result twice), and the next command connects again. redis-py 8 would retry it three
    times by default."""
    client = connect(redis_url, block_ms=2000)
    admin = aioredis.Redis.from_url(redis_url)
    stream = f"{keys.namespace}:killed"
    try:
        await client.client_setname("retry-probe")

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            for entry in await admin.client_list():
                if entry.get("name") == "retry-probe":
                    await admin.client_kill_filter(_id=entry["id"])

        killer = asyncio.create_task(kill_soon())
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.xread({stream: "$"}, block=1500)  # killed mid-block
        assert time.monotonic() - started < 1.4  # raised when killed, not read again
        await killer
        assert await client.ping()  # a new connection
        assert await client.xadd(stream, {b"k": b"v"})
        assert len(await client.xrange(stream)) == 1  # sent once
    finally:
        await client.aclose()
        await admin.aclose()
