"""A window miss through the whole agent loop (issue 34 kind 2): the server refuses a request the
estimate said fits. The call goes out once more, smaller, and the turn goes on; when nothing can
be shed the turn fails ``context_full`` with the figures, and the next turn still gets an answer.
Every call, the one sent again included, rebuilds to its recorded fingerprint. Real Redis, the
agent loop and tool worker in process, the real adapter over HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentstream.context.builder import TRIMMED_NOTE
from agentstream.models.endpoints import load_endpoints
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.events import ModelOutput, TurnFailed
from tests.support import model_apps
from tests.support.fault_server import FaultServer, Reply, call, chat
from tests.support.inprocess import InProcess, events_of, publish, wait_reply

pytestmark = pytest.mark.integration

UNUSED = "http://127.0.0.1:9"


def too_long(prompt: int, window: int) -> Reply:
    """OpenAI's answer to a request over the window (vLLM's reads the same)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} "
        "tokens. Please reduce the length of the messages."
    )
    return Reply(
        status=400,
        body={"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}},
    )


def write_models(path: Path, base_url: str) -> str:
    anthropic = {"provider": "anthropic", "base_url": UNUSED, "api_key_env": "TEST_ANTHROPIC_KEY"}
    entries: dict[str, Any] = {
        "default": {"provider": "openai", "base_url": base_url, "model": "local", "stream": False},
        "claude-a": {**anthropic, "model": "claude-a"},
        "claude-b": {**anthropic, "model": "claude-b"},
        "deepseek": {"provider": "openai", "base_url": UNUSED, "model": "deepseek-v4"},
        "deepseek-plain": {"provider": "openai", "base_url": UNUSED, "model": "deepseek-v4"},
    }
    file = path / "models.yaml"
    file.write_text(json.dumps({"models": entries}))
    return str(file)


@pytest.fixture
async def run(redis_url, namespace, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-test")
    started: list[InProcess] = []

    async def start(base_url: str) -> InProcess:
        env = {"AGENTSTREAM_MODELS_FILE": write_models(tmp_path, base_url), "AGENTSTREAM_MODEL_RETRIES": "0"}
        services = InProcess(model_apps.app, redis_url, namespace, base_url, env=env)
        started.append(services)
        await services.start("loop-and-tools", "agent-loop", "tool-worker")
        return services

    yield start
    for services in started:
        await services.stop_all()


@pytest.fixture(autouse=True)
def _clear_runs():
    model_apps.RUNS.clear()


async def verify(events, services: InProcess) -> list[bool]:
    # the models file is read off the event loop (the services run in it)
    endpoints = await asyncio.to_thread(load_endpoints, services.settings("verify"), require_keys=False)
    return [c.matches for c in rebuild_calls(events, model_apps.app.agent, endpoints=endpoints)]


LONG = "Here is the background, in full: " + "the quick brown fox jumps over the lazy dog. " * 60


async def test_a_refused_call_goes_out_once_more_smaller_and_the_turn_goes_on(run, redis, keys, store, caplog):
    with FaultServer(
        [
            chat(None, tool_calls=[call("call_1", "calculator", '{"expression": "2+2"}')], finish="tool_calls"),
            chat("4"),
            too_long(prompt=5000, window=4096),  # the second turn's call: the server's window is smaller
            chat("6"),
        ]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="miss", turn_id="t1", agent="calc", text=LONG + " What is 2+2?")
        assert (await wait_reply(redis, keys, "t1")).answer == "4"
        await publish(redis, keys, trace_id="miss", turn_id="t2", agent="calc", text="And 3+3?")
        reply = await wait_reply(redis, keys, "t2")
        await services.stop_all()
        refused, sent = server.requests[2], server.requests[3]
    assert reply.status == "ended" and reply.answer == "6"
    assert len(sent.raw) < len(refused.raw)
    messages = sent.json["messages"]
    assert messages[-1] == {"role": "user", "content": "And 3+3?"}
    assert all(LONG not in str(m.get("content")) for m in messages)  # the oldest history was shed
    assert TRIMMED_NOTE in messages[0]["content"]
    events = await events_of(store, "miss")
    last = [e for e in events if isinstance(e, ModelOutput)][-1]
    assert last.attributes == {"window_miss": {"prompt_tokens": 5000, "window_tokens": 4096, "over_by_tokens": None}}
    assert await verify(events, services) == [True, True, True]  # the call sent again rebuilds to its fingerprint
    # the operator is told the endpoint's configured window is larger than its server's
    assert any("window_tokens 8192" in r.getMessage() and "4096" in r.getMessage() for r in caplog.records)


async def test_when_nothing_can_be_shed_the_turn_fails_context_full_and_the_next_turn_answers(run, redis, keys, store):
    with FaultServer(
        [
            too_long(prompt=9000, window=8192),  # the first turn alone is over the server's window
            too_long(prompt=9100, window=8192),  # the next turn still carries it: refused once ...
            chat("Sure: 4."),  # ... and answered once the failed turn's input is shed
        ]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="full", turn_id="t1", agent="calc", text=LONG * 3)
        failed = await wait_reply(redis, keys, "t1")
        await publish(redis, keys, trace_id="full", turn_id="t2", agent="calc", text="Never mind. 2+2?")
        reply = await wait_reply(redis, keys, "t2")
        await services.stop_all()
    assert failed.status == "failed" and failed.code == "context_full"
    assert "prompt 9000" in failed.reason and "window 8192" in failed.reason
    assert reply.status == "ended" and reply.answer == "Sure: 4."
    events = await events_of(store, "full")
    assert [e.code for e in events if isinstance(e, TurnFailed)] == ["context_full"]
    assert all(await verify(events, services))
