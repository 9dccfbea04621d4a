"""The per-trace delta stream on real Redis: capped, expiring, followed beside the trace; and
``agentstream ask`` printing a reply's tokens as they arrive (services as OS processes)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from agentstream.cli.watch import watch_turn
from agentstream.runtime.connection import connect
from agentstream.runtime.deltas import Delta, RedisDeltaSink, follow, last_entry_id
from agentstream.wire.events import ModelOutput, TurnEnded, TurnInput
from tests.support.fault_server import FaultServer, Reply, text_stream
from tests.support.procs import ROOT, Services
from tests.support.redis_server import sync_client

pytestmark = pytest.mark.integration


async def test_the_sink_caps_and_expires_the_stream(redis, keys):
    sink = RedisDeltaSink(redis, keys, "capped", maxlen=20, ttl_s=120)
    await sink.emit(Delta(kind="start", turn_id="t", attempt="a"))
    for i in range(600):
        await sink.emit(Delta(kind="text", turn_id="t", attempt="a", text=f"{i} "))
    await sink.emit(Delta(kind="end", turn_id="t", attempt="a", stop_reason="stop"))
    assert await redis.xlen(keys.deltas("capped")) < 300  # MAXLEN ~ trims whole nodes
    assert 0 < await redis.ttl(keys.deltas("capped")) <= 120


async def test_a_redis_failure_never_breaks_the_model_call(keys):
    dead = connect("redis://127.0.0.1:9/0")
    try:
        sink = RedisDeltaSink(dead, keys, "x")
        await sink.emit(Delta(kind="start"))  # logged once, not raised
        await sink.emit(Delta(kind="text", text="a"))
    finally:
        await dead.aclose()


async def test_follow_interleaves_events_and_deltas_in_arrival_order(redis, keys, store):
    sink = RedisDeltaSink(redis, keys, "f")
    await store.append("f", TurnInput(turn_id="t1", agent="a", text="hi"))
    await sink.emit(Delta(kind="start", turn_id="t1", attempt="a1"))
    await sink.emit(Delta(kind="text", turn_id="t1", attempt="a1", text="Hel"))
    await sink.emit(Delta(kind="text", turn_id="other", attempt="x", text="zzz"))
    await sink.emit(Delta(kind="text", turn_id="t1", attempt="a1", text="lo"))
    await sink.emit(Delta(kind="end", turn_id="t1", attempt="a1", stop_reason="stop"))
    await store.append("f", ModelOutput(turn_id="t1", step=0, content="Hello", attempt_id="a1"))
    await store.append("f", TurnEnded(turn_id="t1", answer="Hello"))
    seen = []
    stop = asyncio.Event()
    async for item in follow(redis, keys, "f", block_ms=50, stop=stop, accept=lambda d: d.turn_id == "t1"):
        seen.append(type(item.event).__name__ if item.event else f"{item.delta.kind}:{item.delta.text}")
        if isinstance(item.event, TurnEnded):
            stop.set()
    assert seen[-2:] == ["ModelOutput", "TurnEnded"] and "TurnInput" in seen
    assert [s for s in seen if ":" in s] == ["start:", "text:Hel", "text:lo", "end:"]
    assert await last_entry_id(redis, keys.deltas("f")) != "0-0"
    assert await last_entry_id(redis, keys.deltas("missing")) == "0-0"


async def test_the_printer_shows_tokens_drops_a_failed_attempt_and_shows_the_steps(redis, keys, store):
    sink = RedisDeltaSink(redis, keys, "p")
    lines: list[str] = []

    def echo(text: str = "", nl: bool = True) -> None:
        lines.append(text + ("\n" if nl else ""))

    for delta in [
        Delta(kind="start", turn_id="t1", attempt="a1"),
        Delta(kind="text", turn_id="t1", attempt="a1", text="The ans"),
        Delta(kind="abort", turn_id="t1", attempt="a1", reason="RemoteProtocolError: cut"),
        Delta(kind="start", turn_id="t1", attempt="a2"),
        Delta(kind="text", turn_id="t1", attempt="a2", text="The answer\nis 4."),
        Delta(kind="end", turn_id="t1", attempt="a2", stop_reason="stop"),
    ]:
        await sink.emit(delta)
    await store.append("p", ModelOutput(turn_id="t1", step=0, content="The answer\nis 4.", attempt_id="a2"))
    await store.append("p", TurnEnded(turn_id="t1", answer="The answer\nis 4."))
    ending = await asyncio.wait_for(
        watch_turn(
            redis,
            keys,
            "p",
            "t1",
            after="0-0",
            deltas_after="0-0",
            echo=echo,
            describe=lambda e: f"<{type(e).__name__}>",
        ),
        timeout=30,
    )
    out = "".join(lines)
    assert isinstance(ending, TurnEnded)
    assert out == (
        "  ▸ The ans\n"
        "  ↺ attempt a1 of model call 0 failed (RemoteProtocolError: cut); its partial output above is dropped, retrying\n"
        "  ▸ The answer\n    is 4.\n<ModelOutput>\n<TurnEnded>\n"
    )


@pytest.mark.e2e
def test_agentstream_ask_prints_the_tokens_as_they_arrive(redis_url, namespace, tmp_path):
    stream = Reply(events=text_stream("Four", " is", " the", " answer."))
    with FaultServer([stream]) as server:
        services = Services(
            redis_url=redis_url,
            namespace=namespace,
            model_url=server.base_url,
            log_dir=tmp_path,
            extra_env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": true}'},
        )
        try:
            services.start("loop", "agent-loop")
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "agentstream",
                    "ask",
                    "What is 2+2? Answer in words.",
                    "--agent",
                    "calc",
                    "--trace-id",
                    "ask1",
                ],
                env=services.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            services.stop_all()
    assert proc.returncode == 0, proc.stdout + proc.stderr + services.log("loop")
    lines = proc.stdout.splitlines()
    assert "  ▸ Four is the answer." in lines
    assert lines.index("  ▸ Four is the answer.") < next(
        i for i, line in enumerate(lines) if line.startswith("· model call 0")
    )
    assert "✓ answer: Four is the answer." in lines
    assert server.requests[0].json["stream"] is True
    client = sync_client(redis_url)
    try:
        assert client.xlen(f"{namespace}:trace:{{ask1}}:deltas") >= 6
    finally:
        client.close()
