"""Running services as separate OS processes in tests."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from agentstream.wire import codec
from agentstream.wire.events import Event, TurnMessage
from agentstream.wire.keys import REPLY_FIELD, TURN_FIELD, Keys
from tests.support.redis_server import kill_left_running

ROOT = Path(__file__).resolve().parents[2]

_started: set[subprocess.Popen] = set()
"""The service processes :class:`Services` started and has not stopped."""


@atexit.register
def _kill_started_services() -> None:
    """At interpreter exit: SIGKILL every service process still running (a teardown cut short,
    e.g. by a second Ctrl-C, left it) and reap it."""
    kill_left_running(_started)


class Services:
    """Start and stop ``agentstream serve`` processes with one environment.

    Each runs in a session of its own, like the test Redis servers
    (:func:`tests.support.redis_server.start_server`): a terminal's Ctrl-C stops pytest, and the
    fixture's teardown (:meth:`stop_all`) stops the services, before the session's Redis stops;
    what a teardown cut short leaves running is killed when the interpreter exits."""

    def __init__(
        self,
        *,
        redis_url: str,
        namespace: str,
        model_url: str,
        app: str = "tests.support.apps:app",
        extra_env: dict[str, str] | None = None,
        log_dir: Path | None = None,
    ):
        self.app = app
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "AGENTSTREAM_NAMESPACE": namespace,
            "OPENAI_BASE_URL": model_url,
            "OPENAI_MODEL": "scripted-model",
            "AGENTSTREAM_BLOCK_MS": "100",
            "AGENTSTREAM_TRIM_INTERVAL_MS": "0",  # work streams keep what tests read back (see inprocess.FAST)
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    def start(self, name: str, service: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else subprocess.DEVNULL
        self._logs.append(out) if self.log_dir else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentstream", "serve", service, "--app", self.app, *args],
            env={**self.env, "AGENTSTREAM_CONSUMER": name, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            start_new_session=True,
        )
        _started.add(proc)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, *, kill: bool = False) -> None:
        """SIGTERM (or with ``kill``, SIGKILL) one service and wait for it, 20 s at most.

        Raises:
            subprocess.TimeoutExpired: it was still running after 20 s (it is SIGKILLed first).
        """
        proc = self.procs.pop(name)
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            _started.discard(proc)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every service at once, then wait for each (SIGKILL past ``timeout_s`` seconds):
        none is left running, whichever of them is slow to drain."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _started.discard(proc)
        for f in self._logs:
            f.close()
        self._logs.clear()

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace") if self.log_dir else ""


def publish_turn(client: redis.Redis, keys: Keys, **fields: str) -> None:
    client.xadd(keys.turns_for(fields["trace_id"]), {TURN_FIELD: codec.encode(TurnMessage(**fields))})


def wait_replies(client: redis.Redis, keys: Keys, count: int, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = client.xrange(keys.replies)
        if len(entries) >= count:
            return [codec.decode_reply(fields[REPLY_FIELD]) for _, fields in entries]
        time.sleep(0.05)
    raise AssertionError(f"only {len(client.xrange(keys.replies))} of {count} replies within {timeout_s} s")


def trace_events(
    client: redis.Redis, keys: Keys, trace_id: str, *, trace_codec: codec.TraceCodec = codec.DEFAULT_CODEC
) -> list[Event]:
    """A trace's events read with a plain client (``trace_codec``: an app's, for its own types)."""
    return [e for _, e in trace_codec.decode_entries(client.xrange(keys.trace(trace_id)), trace_id=trace_id)]


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    """Poll ``predicate()`` every 50 ms until it returns something truthy → that value;
    AssertionError naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def request_bodies(model) -> list[dict]:
    """The JSON bodies a scripted model server received, in order."""
    import json

    return [json.loads(raw) for raw in model.requests]
