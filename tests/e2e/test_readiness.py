"""Readiness and liveness mean what they say, and a startup failure that cannot heal says so in
one line (issue 11, item 6). Services as separate OS processes, a Redis of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
import redis as redis_sync

from tests.support.procs import ROOT, Services
from tests.support.redis_server import free_port, local_redis_server

pytestmark = pytest.mark.e2e


@pytest.fixture
def private_redis():
    with local_redis_server() as (url, _proc, _dir):
        yield url


def probe(port: int, path: str, deadline_s: float = 30.0) -> httpx.Response:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=3)
        except httpx.TransportError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def wait_status(port: int, path: str, status: int, deadline_s: float = 30.0) -> httpx.Response:
    end = time.monotonic() + deadline_s
    while True:
        answer = probe(port, path, deadline_s)
        if answer.status_code == status or time.monotonic() > end:
            return answer
        time.sleep(0.2)


async def test_readiness_needs_every_consumer_group_and_every_consumer_running(redis_url, namespace):
    import asyncio

    from agentstream.runtime.connection import connect
    from agentstream.runtime.consumer import StreamConsumer
    from agentstream.runtime.runner import Readiness

    client = connect(redis_url)

    async def idle(entry_id, fields):
        return None

    consumer = StreamConsumer(
        client, stream=f"{namespace}:work", group="g", consumer="c1", handler=idle, dead_stream=f"{namespace}:dead"
    )
    stop = asyncio.Event()
    readiness = Readiness([consumer], stop)
    try:
        ok, why = await readiness.check()
        assert not ok and "Redis" in why  # no stream, no group yet
        await consumer.ensure_group()
        assert await readiness.check() == (True, "ready")
        await client.xgroup_destroy(f"{namespace}:work", "g")
        ok, why = await readiness.check()
        assert not ok and "consumer group 'g'" in why and "missing" in why
        await consumer.ensure_group()
        finished = asyncio.create_task(asyncio.sleep(0), name="consume:work")
        await finished
        readiness.tasks = [finished]
        assert readiness() == (False, "stopped: consume:work")
        stop.set()
        assert readiness() == (False, "stopping")
    finally:
        await client.delete(f"{namespace}:work")
        await client.aclose()


def test_a_service_that_cannot_authenticate_is_live_but_never_ready(private_redis, namespace, scripted_model, tmp_path):
    admin = redis_sync.Redis.from_url(private_redis)
    admin.execute_command("ACL", "SETUSER", "svc", "on", ">right-password", "~*", "&*", "+@all")
    host = private_redis.split("://", 1)[1]
    port = free_port()
    wrong = Services(
        redis_url=f"redis://svc:wrong-password@{host}",
        namespace=namespace,
        model_url=scripted_model.base_url,
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_METRICS_PORT": str(port)},
    )
    try:
        wrong.start("loop-wrong", "agent-loop")
        assert probe(port, "/healthz").status_code == 200  # the process and its loop answer
        time.sleep(3)  # time enough to have been ready, had it authenticated
        ready = probe(port, "/readyz")
        assert ready.status_code == 503, ready.text
        assert "not ready" in ready.text and ("WRONGPASS" in ready.text or "Authentication" in ready.text), ready.text
        assert "wrong-password" not in ready.text
    finally:
        wrong.stop_all()
    right = Services(
        redis_url=f"redis://svc:right-password@{host}",
        namespace=namespace,
        model_url=scripted_model.base_url,
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_METRICS_PORT": str(port)},
    )
    try:
        right.start("loop-right", "agent-loop")
        ready = wait_status(port, "/readyz", 200)
        assert ready.status_code == 200 and ready.text == "ready\n", ready.text
    finally:
        right.stop_all()
        admin.close()


@pytest.mark.parametrize(
    "args, env, expected",
    [
        (["--app", "tests.support.apps:app"], {"REDIS_URL": "redis//127.0.0.1:1"}, "is not a Redis URL"),
        (["--app", "tests.support.no_such_module:app"], {}, "cannot import app module"),
        (
            ["--app", "tests.support.broken_app:app"],
            {},
            "failed to import: RuntimeError: this app module is broken on purpose",
        ),
        (["--app", "tests.support.apps:app"], {"AGENTSTREAM_MAX_TURN_BYTES": "lots"}, "MAX_TURN_BYTES"),
    ],
    ids=["bad-redis-url", "no-app-module", "broken-app-module", "bad-setting"],
)
def test_an_unhealable_startup_failure_exits_non_zero_with_one_line(redis_url, args, env, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "serve", "agent-loop", *args],
        env={
            **os.environ,
            "REDIS_URL": redis_url,
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "OPENAI_MODEL": "m",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0, output
    assert len(output.splitlines()) == 1 and output.startswith("error: ") and expected in output, output
    assert "Traceback" not in output
