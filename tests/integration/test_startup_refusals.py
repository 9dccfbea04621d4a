"""The start-up refusals on real Redis servers: `agentstream serve` exits with one line (code 2)
before it takes any work, when its settings contradict each other, when REDIS_URL's mode (single
Redis or Redis Cluster) is not the server's, or when the pool is too small for the connections the
service holds at once; with a pool of exactly the number it names, every turn is answered."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis as redis_sync

from agentstream.runtime.connection import plain_url
from agentstream.wire.keys import Keys
from tests.support.procs import ROOT, Services, publish_turn, wait_replies
from tests.support.redis_server import local_redis_cluster, local_redis_server, sync_client
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration


def serve(service: str, redis_url: str, namespace: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`agentstream serve <service>` with this environment, which must exit by itself (a refusal)."""
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_MODEL": "m",
        "AGENTSTREAM_LOG_FORMAT": "text",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "agentstream", "serve", service, "--app", "tests.support.apps:app"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused start."""
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def namespace_keys(client, namespace: str) -> list:
    return list(client.scan_iter(match=f"{namespace}:*"))


@pytest.fixture(scope="module")
def single():
    with local_redis_server() as (url, _proc, _dir):
        yield url


@pytest.fixture(scope="module")
def cluster():
    with local_redis_cluster() as url:
        yield url


def test_contradicting_settings_refuse_to_start_on_a_real_redis(single: str, tmp_path: Path) -> None:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    proc = serve("tool-worker", single, ns, tmp_path, AGENTSTREAM_CONSUMER_DELETE_IDLE_MS="3000")
    assert "AGENTSTREAM_CONSUMER_DELETE_IDLE_MS=3000 is below AGENTSTREAM_MIN_IDLE_MS" in refusal(proc)
    client = redis_sync.Redis.from_url(single)
    assert namespace_keys(client, ns) == [], "nothing was created: no group joined, no work taken"


@pytest.mark.slow
def test_a_cluster_node_behind_a_plain_url_refuses_to_start(cluster: str, tmp_path: Path) -> None:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    plain = plain_url(cluster)  # redis://127.0.0.1:<port>, one node of the cluster
    address = plain.partition("://")[2]
    line = refusal(serve("tool-worker", plain, ns, tmp_path))
    assert f"write redis+cluster://{address}" in line, line
    client = sync_client(cluster)
    try:
        assert namespace_keys(client, ns) == []
    finally:
        client.close()
    # the cluster URL starts (it is stopped by the timeout: it would run until SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-m", "agentstream", "serve", "tool-worker", "--app", "tests.support.apps:app"],
            env={**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": cluster, "AGENTSTREAM_NAMESPACE": ns},
            capture_output=True,
            timeout=8,
            cwd=ROOT,
        )


def test_a_single_redis_asked_for_as_a_cluster_refuses_to_start(single: str, tmp_path: Path) -> None:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    address = single.partition("://")[2].rsplit("/", 1)[0]
    line = refusal(serve("tool-worker", single, ns, tmp_path, AGENTSTREAM_REDIS_CLUSTER="true"))
    assert f"write redis://{address}/0" in line and "unset AGENTSTREAM_REDIS_CLUSTER" in line, line


def test_a_pool_too_small_refuses_to_start_with_the_number_needed(single: str, tmp_path: Path) -> None:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    line = refusal(serve("agent-loop", f"{single}?max_connections=3", ns, tmp_path, AGENTSTREAM_PARTITIONS="3"))
    needed = int(re.search(r"at least (\d+)", line).group(1))  # type: ignore[union-attr]
    assert needed > 3 and "max_connections=3 is below" in line and "blocking readers" in line
    assert namespace_keys(redis_sync.Redis.from_url(single), ns) == []


@pytest.mark.slow
def test_a_pool_of_exactly_the_number_needed_answers_every_turn(single: str, tmp_path: Path) -> None:
    """The number the refusal names is enough: 30 turns with two tool calls each, all answered,
    with no 'Too many connections' in any log."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    needs = {}
    for service in ("agent-loop", "tool-worker"):
        line = refusal(serve(service, f"{single}?max_connections=1", ns, tmp_path, AGENTSTREAM_PARTITIONS="2"))
        needs[service] = int(re.search(r"at least (\d+)", line).group(1))  # type: ignore[union-attr]
    client = redis_sync.Redis.from_url(single)
    keys = Keys(ns, 2)
    with ScriptedModelServer(parallel_rule) as model:
        services = Services(
            redis_url=single,
            namespace=ns,
            model_url=model.base_url,
            log_dir=tmp_path,
            extra_env={"AGENTSTREAM_PARTITIONS": "2"},
        )
        try:
            for service, name in (("agent-loop", "loop-1"), ("tool-worker", "tools-1")):
                services.start(name, service, env={"REDIS_URL": f"{single}?max_connections={needs[service]}"})
            for i in range(30):
                publish_turn(
                    client, keys, trace_id=f"p{i}", turn_id=f"t{i}", agent="plan", text=f"do: work(20) work({i})"
                )
            replies = wait_replies(client, keys, 30, timeout_s=120)
            assert sorted(r.turn_id for r in replies) == sorted(f"t{i}" for i in range(30))
            assert all(r.status == "ended" for r in replies), [r for r in replies if r.status != "ended"]
        finally:
            services.stop_all()
        for name in ("loop-1", "tools-1"):
            assert "Too many connections" not in (tmp_path / f"{name}.log").read_text(errors="replace")


def test_the_gateway_needs_a_connection_per_stream_it_may_hold(single: str, tmp_path: Path) -> None:
    """An event stream or a long-poll holds a blocking read: the gateway's pool must hold
    AGENTSTREAM_GATEWAY_MAX_STREAMS of them (more are refused with 429) and its shared connection."""
    from tests.support.gateway import KEYS_DOCUMENT

    ns = f"t-{uuid.uuid4().hex[:8]}"
    gateway = {"AGENTSTREAM_GATEWAY_KEYS": KEYS_DOCUMENT, "AGENTSTREAM_GATEWAY_PORT": "0"}
    line = refusal(serve("gateway", f"{single}?max_connections=100", ns, tmp_path, **gateway))
    assert "below the 257 connections" in line and "256 blocking readers" in line, line
    fewer = refusal(
        serve("gateway", f"{single}?max_connections=10", ns, tmp_path, AGENTSTREAM_GATEWAY_MAX_STREAMS="20", **gateway)
    )
    assert "at least 21" in fewer, fewer


async def test_a_full_pool_at_run_time_delays_work_and_loses_none(single: str, caplog) -> None:
    """Past the start-up check a pool can still be full for a while (a reader of the app's own,
    another blocking read in the process): the consumer's reads then fail with 'Too many
    connections', it backs off (no hot loop), and once a connection is free every entry is handled
    exactly once."""
    import asyncio
    import logging

    from agentstream.runtime.connection import connect
    from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer

    ns = f"t-{uuid.uuid4().hex[:8]}"
    client = connect(f"{single}?max_connections=2", block_ms=50)  # two pooled connections (and the shared one)
    stream = f"{ns}:work"
    handled: list[bytes] = []

    async def handler(entry_id, fields):
        await client.incr(f"{ns}:count")  # on the shared connection: works while the pool is full
        handled.append(fields[b"n"])

    consumer = StreamConsumer(
        client,
        stream=stream,
        group="g",
        consumer="w1",
        handler=handler,
        dead_stream=f"{ns}:dead:{stream}",
        config=ConsumerConfig(block_ms=50, retry_delay_s=0.05, reclaim_interval_ms=50, trim_interval_ms=0),
    )
    await consumer.ensure_group()
    for n in range(20):
        await client.xadd(stream, {b"n": str(n).encode()})
    caplog.set_level(logging.WARNING, logger="agentstream")
    stop = asyncio.Event()
    try:
        hogs = [asyncio.create_task(client.xread({f"{ns}:idle": "$"}, block=2000)) for _ in range(2)]
        await asyncio.sleep(0.1)  # the hogs hold the pool's connections
        task = asyncio.create_task(consumer.run(stop))
        assert await asyncio.gather(*hogs) == [[], []]  # they held the pool's connections for 2 s
        while len(handled) < 20:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        await client.aclose()
    assert sorted(handled, key=int) == [str(n).encode() for n in range(20)], "each entry once"
    lost = [r for r in caplog.records if "Too many connections" in r.getMessage()]
    assert lost, "the consumer met the full pool"
    assert len(lost) <= 8, f"{len(lost)} retries in 2 s: the consumer backs off, it does not spin"
