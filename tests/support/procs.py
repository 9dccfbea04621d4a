"""Running services as separate OS processes in tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from agentstream import codec
from agentstream.events import TurnMessage
from agentstream.keys import REPLY_FIELD, TURN_FIELD, Keys

ROOT = Path(__file__).resolve().parents[2]


class Services:
    """Start and stop ``agentstream serve`` processes with one environment."""

    def __init__(self, *, redis_url: str, namespace: str, model_url: str, app: str = "tests.support.apps:app", extra_env: dict[str, str] | None = None, log_dir: Path | None = None):
        self.app = app
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "AGENTSTREAM_NAMESPACE": namespace,
            "OPENAI_BASE_URL": model_url,
            "OPENAI_MODEL": "scripted-model",
            "AGENTSTREAM_BLOCK_MS": "100",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    def start(self, name: str, service: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else subprocess.DEVNULL  # noqa: SIM115
        self._logs.append(out) if self.log_dir else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentstream", "serve", service, "--app", self.app, *args],
            env={**self.env, "AGENTSTREAM_CONSUMER": name, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.procs[name] = proc
        return proc

    def stop(self, name: str, *, kill: bool = False) -> None:
        proc = self.procs.pop(name)
        proc.kill() if kill else proc.terminate()
        proc.wait(timeout=20)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        for f in self._logs:
            f.close()
        self._logs.clear()

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace") if self.log_dir else ""


def publish_turn(client: redis.Redis, keys: Keys, **fields: str) -> None:
    client.xadd(keys.turns, {TURN_FIELD: codec.encode(TurnMessage(**fields))})


def wait_replies(client: redis.Redis, keys: Keys, count: int, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = client.xrange(keys.replies)
        if len(entries) >= count:
            return [codec.decode_reply(fields[REPLY_FIELD]) for _, fields in entries]
        time.sleep(0.05)
    raise AssertionError(f"only {len(client.xrange(keys.replies))} of {count} replies within {timeout_s} s")
