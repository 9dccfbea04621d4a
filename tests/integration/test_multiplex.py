"""The shared connection (agentstream.runtime.multiplex) on a real Redis: commands issued together
leave in one write and each caller gets its own reply; a caller that stops waiting, an error
reply, a lost connection and a blocking read on the same client leave the others' replies right."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from agentstream.runtime.connection import connect
from agentstream.runtime.multiplex import MultiplexedPipeline
from tests.support.redis_server import single_node_only
from tests.support.shared_connections import count_writes

pytestmark = single_node_only(
    "the single client's shared connection (a cluster's, one per node: test_cluster_multiplex.py)"
)


async def test_commands_issued_together_leave_in_one_write_and_each_caller_gets_its_own_reply(redis_url, keys):
    client = connect(redis_url)
    try:
        shared = client.connection_pool.shared
        assert shared is not None
        await client.ping()
        writes = count_writes(shared)
        names = [f"{keys.namespace}:mux:{i}" for i in range(200)]
        assert all(await asyncio.gather(*(client.set(name, str(i).encode()) for i, name in enumerate(names))))
        assert len(writes) == 1  # 200 commands, one write
        got = await asyncio.gather(
            *(client.get(name) for name in names), client.hget(names[0], "f"), return_exceptions=True
        )
        assert got[:200] == [str(i).encode() for i in range(200)]
        assert isinstance(got[200], redis.exceptions.ResponseError) and "WRONGTYPE" in str(
            got[200]
        )  # an error reply stays its own
        # a pipeline goes out with what else is queued in the same turn of the event loop
        pipe = client.pipeline(transaction=False)
        assert isinstance(pipe, MultiplexedPipeline)
        pipe.get(names[1])
        pipe.hget(names[1], "f")
        before = len(writes)
        replies, alone = await asyncio.gather(pipe.execute(raise_on_error=False), client.get(names[2]))
        assert replies[0] == b"1" and isinstance(replies[1], redis.exceptions.ResponseError) and alone == b"2"
        assert len(writes) == before + 1
        with pytest.raises(redis.exceptions.ResponseError, match=r"Command # 2 \(HGET"):  # redis-py's message
            await client.pipeline(transaction=False).get(names[1]).hget(names[1], "f").execute()
        # a transaction is redis-py's own (a connection of the pool, MULTI/EXEC)
        assert await client.pipeline(transaction=True).incr(f"{keys.namespace}:mux:n").incr(
            f"{keys.namespace}:mux:n"
        ).execute() == [1, 2]
        assert shared.connects == 1
    finally:
        await client.aclose()


async def test_a_pipeline_with_an_argument_redis_has_no_form_for_sends_none_of_its_commands(redis_url, keys):
    client = connect(redis_url)
    try:
        await client.ping()
        with pytest.raises(redis.exceptions.DataError):
            await (
                client.pipeline(transaction=False)
                .set(f"{keys.namespace}:a", b"1")
                .set(f"{keys.namespace}:b", None)
                .execute()
            )
        assert await client.get(f"{keys.namespace}:a") is None  # as redis-py's pipeline: nothing of it ran
    finally:
        await client.aclose()


async def test_a_caller_that_stops_waiting_does_not_shift_the_replies_of_the_others(redis_url, keys):
    client = connect(redis_url)
    key = f"{keys.namespace}:mux:slow"
    try:
        await client.set(key, b"v")
        slow = asyncio.create_task(
            client.eval(  # about 0.3 s of Lua, then a reply nobody waits for
                "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
                "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 300000 return 'late'",
                0,
            )
        )
        await asyncio.sleep(0.05)
        after = [asyncio.create_task(client.incr(f"{key}:{i}")) for i in range(20)]
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await asyncio.gather(*after) == [1] * 20
        assert await client.get(key) == b"v"
        assert client.connection_pool.shared.connects == 1  # no reconnect was needed
    finally:
        await client.aclose()


async def test_a_lost_shared_connection_fails_its_waiting_commands_once_and_the_next_one_reconnects():
    import os
    import signal

    from tests.support.redis_server import RestartableRedis

    with RestartableRedis() as server:
        client = connect(server.url)
        try:
            assert await client.set("k", b"0")
            os.kill(server.proc.pid, signal.SIGSTOP)  # the commands below wait for replies that never come
            waiting = [asyncio.create_task(client.incr("k")) for _ in range(5)]
            await asyncio.sleep(0.2)
            assert not any(task.done() for task in waiting)
            server.kill()  # the connection is reset under them
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results
            server.restart()
            for _ in range(50):  # the next command connects again
                try:
                    assert await client.set("k", b"1")
                    break
                except redis.exceptions.ConnectionError:
                    await asyncio.sleep(0.1)
            assert await client.incr("k") == 2
            assert client.connection_pool.shared.connects >= 2
        finally:
            await client.aclose()


async def test_a_blocking_read_takes_a_connection_of_its_own(redis_url, keys):
    client = connect(redis_url, block_ms=2000)
    stream = f"{keys.namespace}:mux:stream"
    try:
        blocked = asyncio.create_task(client.xread({stream: "$"}, block=1500))
        await asyncio.sleep(0.1)
        assert await client.xadd(stream, {b"k": b"v"})  # on the shared connection, while the read blocks
        got = await blocked
        assert got and got[0][1][0][1] == {b"k": b"v"}
        # a read without BLOCK is multiplexed; NOSCRIPT reloads the script as redis-py does
        assert len(await client.xread({stream: "0"})) == 1
        script = client.register_script("return redis.call('XLEN', KEYS[1])")
        assert await script(keys=[stream]) == 1
        await client.script_flush()
        assert await script(keys=[stream]) == 1
    finally:
        await client.aclose()


async def test_a_raw_blocking_read_in_any_case_keeps_off_the_shared_connection(redis_url, keys):
    """Redis reads XREAD's options in any case: ``block`` as much as ``BLOCK`` blocks, and such a
    read on the shared connection would hold every command behind it for its block time."""
    client = connect(redis_url, block_ms=2000)
    stream = f"{keys.namespace}:mux:raw-block"
    try:
        await client.ping()  # the shared connection is up
        for token in ("block", b"Block"):
            waiting = int((await client.info("clients"))["blocked_clients"])
            blocked = asyncio.create_task(client.execute_command("XREAD", token, 1500, "STREAMS", stream, "$"))
            # the read is in Redis before the write (a fixed sleep lost that race on a loaded machine)
            for _ in range(200):
                if int((await client.info("clients"))["blocked_clients"]) > waiting:
                    break
                await asyncio.sleep(0.005)
            # behind the read, were it on the shared connection, this would wait the 1.5 s out and
            # find the read already answered by an entry written after it
            assert await asyncio.wait_for(client.xadd(stream, {b"k": b"v"}), 1.0)
            got = await blocked
            assert got and got[0][1][0][1] == {b"k": b"v"}
    finally:
        await client.aclose()


async def test_the_shared_connection_can_be_turned_off(redis_url, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_REDIS_MULTIPLEX", "0")
    client = connect(redis_url)
    try:
        assert client.connection_pool.shared is None
        assert await client.ping()
        assert not isinstance(client.pipeline(transaction=False), MultiplexedPipeline)
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_the_socket_timeout_counts_from_when_a_command_starts_waiting(redis_url, keys):
    """A reply is awaited for the socket timeout from the moment its command is written (or the
    last reply came), not from an earlier command's: a command sent after an idle second still
    has its whole timeout; one whose reply is later than the timeout raises TimeoutError."""
    client = connect(f"{redis_url}{'&' if '?' in redis_url else '?'}socket_timeout=1.2", block_ms=1000)
    spin = (
        "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > tonumber(ARGV[1]) return 1"
    )
    try:
        assert await client.ping()
        await asyncio.sleep(0.9)  # the timer armed by the PING is still pending
        assert await client.eval(spin, 0, 600_000) == 1  # 0.6 s of Lua: within its own 1.2 s
        with pytest.raises(redis.exceptions.TimeoutError, match="reading"):
            await client.eval(spin, 0, 1_800_000)
        await asyncio.sleep(0.8)  # the script ends; the next command connects again
        assert await client.ping()
        assert client.connection_pool.shared.connects == 2
    finally:
        await client.aclose()


async def test_the_shared_connection_takes_the_urls_database_and_client_name_and_refuses_bad_arguments(redis_url, keys):
    """Made from the pool's settings: a URL's database and client name hold on the shared
    connection too; an argument Redis has no form for raises redis-py's DataError and leaves the
    connection as it was; a RESP3 URL is not multiplexed."""
    base = redis_url.split("?")[0].rsplit("/", 1)[0]
    client = connect(f"{base}/7?client_name=mux-named")
    plain = aioredis.Redis.from_url(f"{base}/7")
    other = aioredis.Redis.from_url(f"{base}/0")
    key = f"{keys.namespace}:mux:db"
    try:
        assert await client.set(key, b"in 7")
        assert client.connection_pool.shared.connects == 1
        assert await plain.get(key) == b"in 7" and await other.get(key) is None
        names = [entry.get("name") for entry in await plain.client_list() if entry.get("cmd") in ("set", "evalsha")]
        assert "mux-named" in names
        with pytest.raises(redis.exceptions.DataError):
            await client.set(key, None)  # type: ignore[arg-type]
        assert await client.get(key) == b"in 7"
        assert client.connection_pool.shared.connects == 1
    finally:
        await plain.delete(key)
        await client.aclose()
        await plain.aclose()
        await other.aclose()
    resp3 = connect(f"{base}/0?protocol=3")
    try:
        assert resp3.connection_pool.shared is None
    finally:
        await resp3.aclose()
