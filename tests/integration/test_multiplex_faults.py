"""The shared connection (agentstream.runtime.multiplex) under faults, on real redis-servers: huge
replies among small ones, a reply that streams in for longer than the socket timeout, Redis
killed and restarted (and loading its data) under load, CLIENT KILL of the shared connection,
callers cancelled in flight and while it connects, error replies beside good ones, two event
loops, TLS, and pipelines through all of it.

Every caller checks that the reply it got is its own: most commands are ``EVAL "return ARGV[1]"``
with a token of their own, so a reply handed to the wrong caller shows. Timeouts here are hang
guards only."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import warnings

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions

from agentstream.runtime.connection import connect
from tests.support.redis_server import RestartableRedis, free_port, single_node_only, start_server, stop_server

pytestmark = single_node_only(
    "the single client's shared connection (a cluster's, one per node: test_cluster_multiplex.py)"
)

TOKEN = "return ARGV[1]"
"""A script that answers its own argument: the reply names the caller it belongs to."""

HANG_S = 60.0
"""The hang guard: no wait in these tests should come near it."""


async def _outcome(awaitable) -> tuple:
    """What a command did: ("value", its reply) or ("raised", the exception's class name, its message)."""
    try:
        return "value", _shape(await awaitable)
    except Exception as exc:
        return "raised", type(exc).__name__, str(exc)


def _shape(value):
    """A reply with any exception in it (an error inside an array) as (class name, message)."""
    if isinstance(value, BaseException):
        return type(value).__name__, str(value)
    return [_shape(v) for v in value] if isinstance(value, list) else value


def _binary() -> str:
    binary = next((b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), None)
    binary = binary or shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    return binary


class _Load:
    """``workers`` tasks that keep commands in flight on ``client`` until stopped, each checking
    that every reply is its own. A worker that meets a lost connection (redis-py's
    ``ConnectionError``/``TimeoutError``) counts it and goes on after 10 ms; any other exception
    ends it (and fails the test at :meth:`finish`)."""

    def __init__(self, client, workers: int = 64, *, pipelines: bool = True) -> None:
        self.client = client
        self.workers = workers
        self.pipelines = pipelines
        self.stopping = False
        self.phase = 0
        self.ok: collections.Counter = collections.Counter()  # phase → replies that were right
        self.errors: collections.Counter = collections.Counter()  # exception type name → count
        self.wrong: list[tuple] = []
        self.tasks: list[asyncio.Task] = []

    def start(self) -> _Load:
        self.tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        return self

    async def _worker(self, i: int) -> None:
        n = 0
        while not self.stopping:
            n += 1
            token = f"w{i}:{n}".encode()
            kind = n % 5 if self.pipelines else 0
            try:
                if kind == 2:  # a pipeline of multiplexed commands
                    pipe = self.client.pipeline(transaction=False)
                    pipe.eval(TOKEN, 0, token).eval(TOKEN, 0, token + b"+").ping()
                    expected, got = [token, token + b"+", True], await pipe.execute()
                elif kind == 3:  # a pipeline with a command that is not multiplexed: a pooled connection
                    pipe = self.client.pipeline(transaction=False)
                    pipe.eval(TOKEN, 0, token).echo(token + b"e")
                    expected, got = [token, token + b"e"], await pipe.execute()
                elif kind == 4:  # a transaction: redis-py's own, on a pooled connection
                    pipe = self.client.pipeline(transaction=True)
                    pipe.eval(TOKEN, 0, token).eval(TOKEN, 0, token + b"x")
                    expected, got = [token, token + b"x"], await pipe.execute()
                else:
                    expected, got = token, await self.client.eval(TOKEN, 0, token)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.01)
                continue
            if got != expected:
                self.wrong.append((expected, got))
            else:
                self.ok[self.phase] += 1

    async def wait_ok(self, phase: int, count: int) -> None:
        """Wait until ``count`` replies of ``phase`` were right."""
        async with asyncio.timeout(HANG_S):
            while self.ok[phase] < count:
                await asyncio.sleep(0.01)

    async def in_flight(self) -> int:
        """Wait until some commands wait for their replies on the shared connection, and return
        how many. Between a batch of replies and the callers' next commands the queue is briefly
        empty: a fault at that instant would test nothing, so the caller faults right after this,
        without awaiting anything else in between."""
        async with asyncio.timeout(HANG_S):
            while not (waiting := len(self.client.connection_pool.shared._waiting)):
                await asyncio.sleep(0)
        return waiting

    async def finish(self) -> None:
        self.stopping = True
        async with asyncio.timeout(HANG_S):  # no caller may hang
            await asyncio.gather(*self.tasks)


# 1. huge replies -------------------------------------------------------------------------------


async def test_huge_replies_in_front_of_and_behind_small_ones_each_go_to_their_own_caller(redis_url, keys):
    """A 100 000-entry XRANGE and a 50 MB GET (and the 50 MB SET) issued in one turn with small
    commands before, between and after them: every caller gets its own reply, on one connection."""
    client = connect(redis_url)
    stream, big = f"{keys.namespace}:mux:big-stream", f"{keys.namespace}:mux:big-string"
    value = (bytes(range(256)) * (50 * 4096))[: 50 * 2**20]
    try:
        assert (
            await client.eval(
                "for i = 0, tonumber(ARGV[1]) - 1 do redis.call('XADD', KEYS[1], '*', 'i', i) end "
                "return redis.call('XLEN', KEYS[1])",
                1,
                stream,
                100_000,
            )
            == 100_000
        )
        small = [client.eval(TOKEN, 0, f"before-set:{i}") for i in range(100)]
        got = await asyncio.gather(*small[:50], client.set(big, value), *small[50:])
        assert got[:50] + got[51:] == [f"before-set:{i}".encode() for i in range(100)] and got[50] is True

        def tokens(tag: str, n: int = 100):
            return [client.eval(TOKEN, 0, f"{tag}:{i}") for i in range(n)]

        got = await asyncio.gather(
            *tokens("a"),
            client.xrange(stream),
            *tokens("b"),
            client.get(big),
            *tokens("c"),
            client.get(big),
            client.xrange(stream, count=5),
            *tokens("d"),
        )
        assert got[:100] == [f"a:{i}".encode() for i in range(100)]
        entries = got[100]
        assert len(entries) == 100_000 and [int(fields[b"i"]) for _id, fields in entries] == list(range(100_000))
        assert got[101:201] == [f"b:{i}".encode() for i in range(100)]
        assert got[201] == value
        assert got[202:302] == [f"c:{i}".encode() for i in range(100)]
        assert got[302] == value
        assert got[303] == entries[:5]
        assert got[304:] == [f"d:{i}".encode() for i in range(100)]
        assert client.connection_pool.shared.connects == 1
    finally:
        await client.delete(stream, big)
        await client.aclose()


class _SlowProxy:
    """A TCP proxy to Redis on loopback: the client's bytes go through at once, Redis's at
    ``chunk`` bytes every ``period_s`` seconds (a steady trickle); none while :attr:`stalled`."""

    def __init__(self, port: int, *, chunk: int = 32 * 1024, period_s: float = 0.025) -> None:
        self.target = port
        self.chunk, self.period_s = chunk, period_s
        self.stalled = False
        self.tasks: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> _SlowProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    def cut(self) -> None:
        """Reset every connection through the proxy (as a network failure would)."""
        for writer in self.writers:
            writer.transport.abort()

    async def _serve(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers += [client_writer, server_writer]
        for task in (
            asyncio.create_task(self._pipe(client_reader, server_writer, slow=False)),
            asyncio.create_task(self._pipe(server_reader, client_writer, slow=True)),
        ):
            self.tasks.add(task)

    async def _pipe(self, reader, writer, *, slow: bool) -> None:
        try:
            while data := await reader.read(self.chunk if slow else 1 << 16):
                while slow and self.stalled:
                    await asyncio.sleep(0.01)
                writer.write(data)
                await writer.drain()
                if slow:
                    await asyncio.sleep(self.period_s)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def _big_value_behind_a_proxy(redis_url: str, key: str):
    """A 4 MB random value stored at ``key`` and a :class:`_SlowProxy` in front of the server →
    (the value, the proxy); the key is deleted afterwards."""
    value = os.urandom(4 * 2**20)
    plain = aioredis.Redis.from_url(redis_url)
    port = int(redis_url.split("?")[0].rsplit(":", 1)[1].split("/")[0])
    try:
        await plain.set(key, value)
        async with _SlowProxy(port) as proxy:
            yield value, proxy
    finally:
        await plain.delete(key)
        await plain.aclose()


@pytest.mark.slow
async def test_a_reply_that_streams_in_for_longer_than_the_socket_timeout_does_not_time_out(redis_url, keys):
    """socket_timeout=1.2 s; a 4 MB reply that comes at ~1.3 MB/s (about 3 s, steadily), with
    small commands behind it: no TimeoutError, every reply right. The control: a proxy that stops
    passing bytes makes the next command time out (the timeout is live)."""
    key = f"{keys.namespace}:mux:trickle"
    async with _big_value_behind_a_proxy(redis_url, key) as (value, proxy):
        client = connect(f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=1.2", block_ms=1000)
        try:
            assert await client.ping()
            started = time.monotonic()
            async with asyncio.timeout(HANG_S):
                got = await asyncio.gather(
                    client.eval(TOKEN, 0, "front"),
                    client.get(key),
                    *(client.eval(TOKEN, 0, f"behind:{i}") for i in range(50)),
                )
            took_s = time.monotonic() - started
            assert got[0] == b"front" and got[1] == value
            assert got[2:] == [f"behind:{i}".encode() for i in range(50)]
            assert took_s > 1.2, f"the reply took {took_s:.2f} s: not longer than the timeout, the test proves nothing"
            assert client.connection_pool.shared.connects == 1
            proxy.stalled = True
            with pytest.raises(redis.exceptions.TimeoutError):
                async with asyncio.timeout(HANG_S):
                    await client.get(key)
        finally:
            await client.aclose()


async def test_a_connection_lost_in_the_middle_of_a_huge_reply_fails_it_and_the_ones_behind_then_reconnects(
    redis_url, keys
):
    """The connection reset while a 4 MB reply trickles in (part of it parsed), with commands
    behind it: each of them raises ConnectionError, none hangs, and the next command gets its
    own reply on a new connection (no byte of the old reply is read as its)."""
    key = f"{keys.namespace}:mux:cut"
    async with _big_value_behind_a_proxy(redis_url, key) as (value, proxy):
        client = connect(f"redis://127.0.0.1:{proxy.port}/0")
        try:
            assert await client.ping()
            waiting = [asyncio.create_task(client.get(key))] + [
                asyncio.create_task(client.eval(TOKEN, 0, f"behind:{i}")) for i in range(20)
            ]
            await asyncio.sleep(0.5)  # about half a megabyte in
            assert not any(task.done() for task in waiting)
            proxy.cut()
            async with asyncio.timeout(HANG_S):
                results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results
            async with asyncio.timeout(HANG_S):
                got = await asyncio.gather(client.eval(TOKEN, 0, "next"), client.exists(key))
            assert got == [b"next", 1]
            assert client.connection_pool.shared.connects == 2
        finally:
            await client.aclose()


# 2. Redis killed and restarted under load ------------------------------------------------------


async def test_redis_killed_and_restarted_under_load_fails_the_waiting_commands_and_the_client_recovers():
    """SIGKILL with ~64 callers in flight (single commands, multiplexed pipelines, a pipeline
    and a transaction through the pool): each caller gets its own reply or a ConnectionError/TimeoutError, none
    hangs, and after the restart on the same port every worker's commands work again."""
    with RestartableRedis(durable=False, binary=_binary()) as server:
        client = connect(server.url)
        load = _Load(client).start()
        in_flight: list[int] = []  # the commands waiting on the shared connection at each kill
        try:
            for _round in range(3):
                await load.wait_ok(load.phase, 500)
                in_flight.append(await load.in_flight())
                server.kill()
                await asyncio.sleep(0.2)  # the commands meanwhile fail (connection refused), none hangs
                server.start()
                load.phase += 1
            await load.wait_ok(load.phase, 2000)
        finally:
            await load.finish()
            await client.aclose()
        assert load.wrong == []
        assert set(load.errors) <= {"ConnectionError", "TimeoutError"} and load.errors["ConnectionError"] > 0
        assert all(load.ok[phase] > 0 for phase in range(4)), load.ok
        assert min(in_flight) > 0, in_flight
        assert client.connection_pool.shared.connects >= 4


async def test_commands_that_meet_redis_loading_its_data_raise_busy_loading_instead_of_returning_it():
    """A Redis that loads its data while the shared connection is up (a replica's full resync;
    here DEBUG RELOAD, 1 ms a key) answers ``-LOADING``: redis-py raises that
    (``BusyLoadingError``, a ``ConnectionError``), as for any lost connection; the shared
    connection must raise it too, not return the exception as the command's value (a GET's
    value, a script's result, an XADD's id). The connection stays up and works once loaded.

    (A restart does not show it: a connection made while Redis loads fails in its handshake.)"""
    with RestartableRedis(
        durable=False,
        binary=_binary(),
        options=("--enable-debug-command", "yes", "--loading-process-events-interval-bytes", "1024"),
    ) as server:
        seed = redis.Redis(host="127.0.0.1", port=server.port)
        try:
            pipe = seed.pipeline(transaction=False)
            for i in range(2000):
                pipe.set(f"k{i}", b"v" * 1024)
            pipe.execute()
        finally:
            seed.close()
        client = connect(server.url)
        admin = aioredis.Redis.from_url(server.url)
        tasks: list[asyncio.Task] = []
        try:
            assert await client.get("k1") == b"v" * 1024
            await admin.config_set("key-load-delay", 1000)
            reload = asyncio.create_task(admin.execute_command("DEBUG", "RELOAD"))
            tasks.append(reload)
            await asyncio.sleep(0.1)  # Redis saves, then loads for ~2 s, answering LOADING meanwhile
            async with asyncio.timeout(HANG_S):
                outcomes = await asyncio.gather(
                    *map(
                        _outcome,
                        (
                            client.get("k1"),
                            client.eval(TOKEN, 0, "t"),
                            client.xadd("s", {"f": "v"}),
                            client.pipeline(transaction=False).get("k1").eval(TOKEN, 0, "p").execute(),
                        ),
                    )
                )
            assert [o[:2] for o in outcomes] == [("raised", "BusyLoadingError")] * 4, outcomes
            async with asyncio.timeout(HANG_S):
                await reload
            assert await client.get("k1") == b"v" * 1024
            assert client.connection_pool.shared.connects == 1
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            await admin.aclose()


# 3. CLIENT KILL of the shared connection -------------------------------------------------------


async def _kill_clients_named(admin, name: str) -> int:
    killed = 0
    for entry in await admin.client_list():
        if entry.get("name") == name:
            killed += await admin.client_kill_filter(_id=entry["id"])
    return killed


async def test_client_kill_of_the_shared_connection_under_load(redis_url):
    """CLIENT KILL (by id, found by the URL's client name) three times under load: as a restart,
    every caller gets its own reply or a ConnectionError, none hangs, and the client goes on."""
    name = f"mux-kill-{uuid.uuid4().hex[:8]}"
    base = redis_url.split("?")[0]
    client = connect(f"{base}?client_name={name}")
    admin = aioredis.Redis.from_url(base)
    load = _Load(client).start()
    in_flight: list[int] = []  # the commands waiting on the shared connection at each kill
    try:
        for _ in range(3):
            await load.wait_ok(load.phase, 500)
            in_flight.append(await load.in_flight())
            assert await _kill_clients_named(admin, name) >= 1
            load.phase += 1
        await load.wait_ok(load.phase, 1000)
    finally:
        await load.finish()
        await client.aclose()
        await admin.aclose()
    assert load.wrong == []
    assert set(load.errors) <= {"ConnectionError", "TimeoutError"} and load.errors["ConnectionError"] > 0
    assert all(load.ok[phase] > 0 for phase in range(4)), load.ok
    assert min(in_flight) > 0, in_flight
    assert client.connection_pool.shared.connects >= 4


# 4. callers cancelled in flight ----------------------------------------------------------------


async def test_callers_cancelled_before_and_after_the_write_leave_the_others_replies_aligned(redis_url):
    """Of 300 commands issued together, every third is cancelled before its write (same turn),
    every third after it (in flight); a slow script in front makes some wait_for timeouts fire
    with replies still to come: the others get their own replies, on the same connection."""
    client = connect(redis_url)
    spin = (
        "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 200000 return ARGV[1]"
    )
    try:
        assert await client.ping()
        slow = asyncio.create_task(client.eval(spin, 0, "slow"))
        tasks = [asyncio.create_task(client.eval(TOKEN, 0, f"t{i}")) for i in range(300)]
        timed = [asyncio.create_task(asyncio.wait_for(client.eval(TOKEN, 0, f"w{i}"), 0.05)) for i in range(20)]
        await asyncio.sleep(0)  # all are queued, not yet written
        for task in tasks[0::3]:
            task.cancel()
        await asyncio.sleep(0.02)  # written, waiting behind the slow script
        for task in tasks[1::3]:
            task.cancel()
        async with asyncio.timeout(HANG_S):
            results = await asyncio.gather(*tasks, return_exceptions=True)
            timed_out = await asyncio.gather(*timed, return_exceptions=True)
            assert await slow == b"slow"
        for i, result in enumerate(results):
            if i % 3 == 2:
                assert result == f"t{i}".encode()
            else:
                assert isinstance(result, asyncio.CancelledError)
        assert all(isinstance(r, asyncio.TimeoutError) for r in timed_out)
        assert await asyncio.gather(*(client.eval(TOKEN, 0, f"after{i}") for i in range(50))) == [
            f"after{i}".encode() for i in range(50)
        ]
        # a pipeline given up halfway through its replies
        pipe = client.pipeline(transaction=False)
        for i in range(50):
            pipe.eval(spin if i == 0 else TOKEN, 0, f"p{i}")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pipe.execute(), 0.05)
        assert await client.eval(TOKEN, 0, "after-pipe") == b"after-pipe"
        assert client.connection_pool.shared.connects == 1
    finally:
        await client.aclose()


async def test_a_caller_cancelled_while_the_shared_connection_connects_does_not_fail_the_others(redis_url):
    """The first caller of a fresh client makes the connection, the others wait for it; that
    caller cancelled (its wait_for timing out) must not fail the others with a ConnectionError:
    Redis is fine, one of them connects instead."""
    client = connect(redis_url)
    try:
        tasks = [asyncio.create_task(client.eval(TOKEN, 0, f"c{i}")) for i in range(20)]
        await asyncio.sleep(0)  # the first is connecting, the others wait for its connection
        assert client.connection_pool.shared._connecting is not None
        tasks[0].cancel()
        async with asyncio.timeout(HANG_S):
            results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert results[1:] == [f"c{i}".encode() for i in range(1, 20)]
    finally:
        await client.aclose()


async def test_a_caller_cancelled_during_the_handshake_leaves_no_socket_open():
    """A connect cut short in the handshake (the server stopped: the TCP connect succeeds, the
    handshake's reply never comes) closes its socket (no ResourceWarning when collected), and the
    next command connects."""
    with RestartableRedis(durable=False, binary=_binary()) as server:
        client = connect(f"{server.url}?client_name=mux-handshake")
        try:
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.get("k"), 0.3)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                gc.collect()
            assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
            assert await client.get("k") is None
        finally:
            await client.aclose()


# 5. error replies beside good ones -------------------------------------------------------------


async def _batch(client, key: str) -> list:
    """One turn's commands: good ones and every kind of error reply, each beside the others →
    each one's :func:`_outcome`."""
    return await asyncio.gather(
        *map(
            _outcome,
            (
                client.eval(TOKEN, 0, "ok0"),
                client.hget(key, "f"),  # WRONGTYPE
                client.eval(TOKEN, 0, "ok1"),
                client.eval("return redis.call('NOSUCHCOMMAND')", 0),  # a script's error: unknown command
                client.eval("return syntax error here", 0),  # a script that does not compile
                client.incr(key),  # ERR value is not an integer
                client.eval(TOKEN, 0, "ok2"),
                client.evalsha("0" * 40, 0),  # NOSCRIPT
                client.eval("return redis.error_reply('MYERR custom')", 0),
                client.execute_command("NOSUCHCOMMAND", "x"),  # not multiplexed: a pooled connection
                client.xadd(key, {"f": "v"}),  # WRONGTYPE
                client.eval("return redis.error_reply('READONLY fake')", 0),
                client.eval("return redis.error_reply('LOADING fake')", 0),  # redis-py: BusyLoadingError, raised
                client.eval("return redis.error_reply('NOAUTH fake')", 0),  # redis-py: AuthenticationError, raised
                client.eval(TOKEN, 0, "ok3"),
                client.eval("return {1, redis.error_reply('NESTED x'), 'y'}", 0),  # an error inside an array
                client.eval(
                    "return {redis.error_reply('LOADING first'), 'y'}", 0
                ),  # redis-py: raised (first in an array)
            ),
        )
    )


async def test_error_replies_beside_good_ones_are_each_their_callers_and_as_redis_py_gives_them(
    redis_url, keys, monkeypatch
):
    """The same batch on the shared connection and through redis-py's pool (multiplexing off):
    each position has the same outcome (the same value, or the same exception raised, not returned)."""
    key = f"{keys.namespace}:mux:str"
    client = connect(redis_url)
    monkeypatch.setenv("AGENTSTREAM_REDIS_MULTIPLEX", "0")
    pooled = connect(redis_url)
    monkeypatch.delenv("AGENTSTREAM_REDIS_MULTIPLEX")

    try:
        assert pooled.connection_pool.shared is None and client.connection_pool.shared is not None
        await client.set(key, b"text")
        muxed, plain = await _batch(client, key), await _batch(pooled, key)
        assert [muxed[i] for i in (0, 2, 6, 14)] == [
            ("value", b"ok0"),
            ("value", b"ok1"),
            ("value", b"ok2"),
            ("value", b"ok3"),
        ]
        assert muxed[12] == ("raised", "BusyLoadingError", "fake") and muxed[13] == (
            "raised",
            "AuthenticationError",
            "fake",
        )
        assert muxed == plain
        assert muxed[16] == ("raised", "BusyLoadingError", "first")

        async def pipeline_outcome(c) -> tuple:
            pipe = c.pipeline(transaction=False)
            pipe.eval(TOKEN, 0, "p0").eval("return redis.error_reply('LOADING p')", 0).eval(TOKEN, 0, "p1")
            return await _outcome(pipe.execute(raise_on_error=False))

        assert await pipeline_outcome(client) == await pipeline_outcome(pooled) == ("raised", "BusyLoadingError", "p")
        assert await client.eval(TOKEN, 0, "after") == b"after"
        # a pipeline with the same error replies: each in its place
        pipe = client.pipeline(transaction=False)
        pipe.eval(TOKEN, 0, "p0").hget(key, "f").eval("return redis.call('NOSUCHCOMMAND')", 0).eval(TOKEN, 0, "p1")
        got = await pipe.execute(raise_on_error=False)
        assert got[0] == b"p0" and got[3] == b"p1"
        assert "WRONGTYPE" in str(got[1]) and "Unknown Redis command" in str(got[2])
    finally:
        await client.delete(key)
        await client.aclose()
        await pooled.aclose()


# 6. two event loops ----------------------------------------------------------------------------


def test_one_client_used_from_two_event_loops_in_turn(redis_url):
    """asyncio.run twice with the same client (the second after the first ended with commands
    still in flight), then two live loops alternately: each run gets its own replies, none hangs."""
    client = connect(redis_url)

    async def tokens(tag: str) -> list:
        async with asyncio.timeout(HANG_S):
            return await asyncio.gather(*(client.eval(TOKEN, 0, f"{tag}:{i}") for i in range(200)))

    async def leave_in_flight() -> None:
        assert await tokens("first") == [f"first:{i}".encode() for i in range(200)]
        for i in range(50):  # still waiting when asyncio.run cancels them
            asyncio.get_running_loop().create_task(client.eval(TOKEN, 0, f"left:{i}"))
        await asyncio.sleep(0)

    asyncio.run(leave_in_flight())
    assert asyncio.run(tokens("second")) == [f"second:{i}".encode() for i in range(200)]
    one, two = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        for round_ in range(3):
            for name, loop in (("one", one), ("two", two)):
                tag = f"{name}{round_}"
                assert loop.run_until_complete(tokens(tag)) == [f"{tag}:{i}".encode() for i in range(200)]
        two.run_until_complete(client.aclose())
    finally:
        for loop in (one, two):
            loop.run_until_complete(asyncio.sleep(0.05))  # the callbacks a switch of loops left there
            loop.close()


# 7. TLS ----------------------------------------------------------------------------------------


def _tls_supported(binary: str) -> bool:
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return True  # try it
    return "libssl" in out


@pytest.fixture
def tls_redis():
    """A redis-server speaking only TLS (a self-signed certificate for 127.0.0.1) → (port, CA file)."""
    binary = _binary()
    if shutil.which("openssl") is None or not _tls_supported(binary):
        pytest.skip("openssl or a TLS-enabled redis-server is missing")
    folder = tempfile.mkdtemp(prefix="agentstream-test-tls-")
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    proc = start_server(
        [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder,
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            cert,
            "--tls-auth-clients",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=cert)
        end = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise
                time.sleep(0.05)
            finally:
                client.close()
        yield port, cert
    finally:
        stop_server(proc)
        shutil.rmtree(folder, ignore_errors=True)


async def test_the_shared_connection_over_tls(tls_redis):
    """rediss:// with the CA in the URL (ssl_ca_certs, ssl_cert_reqs=required): concurrent commands,
    a 5 MB reply among them and a pipeline each get their own reply; CLIENT KILL under load
    reconnects over TLS."""
    port, ca = tls_redis
    name = f"mux-tls-{uuid.uuid4().hex[:6]}"
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required&client_name={name}"
    client = connect(url)
    admin = aioredis.Redis.from_url(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    value = os.urandom(5 * 2**20)
    try:
        shared = client.connection_pool.shared
        assert shared is not None
        assert await client.set("big", value)
        got = await asyncio.gather(
            *(client.eval(TOKEN, 0, f"a{i}") for i in range(100)),
            client.get("big"),
            *(client.eval(TOKEN, 0, f"b{i}") for i in range(100)),
        )
        assert got[:100] == [f"a{i}".encode() for i in range(100)] and got[100] == value
        assert got[101:] == [f"b{i}".encode() for i in range(100)]
        assert await client.pipeline(transaction=False).eval(TOKEN, 0, "p").get("big").execute() == [b"p", value]
        assert shared.connects == 1
        assert "ssl" in type(shared._writer.transport).__name__.lower()
        load = _Load(client, workers=32).start()
        try:
            for _ in range(2):
                await load.wait_ok(load.phase, 300)
                assert await _kill_clients_named(admin, name) >= 1
                load.phase += 1
            await load.wait_ok(load.phase, 300)
        finally:
            await load.finish()
        assert load.wrong == [] and set(load.errors) <= {"ConnectionError", "TimeoutError"}
        assert shared.connects >= 3
    finally:
        await client.aclose()
        await admin.aclose()
