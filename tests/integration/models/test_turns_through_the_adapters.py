"""Malformed model output as data, through the whole agent loop (real Redis, in process) and the
real adapters over HTTP: each failure of field cases C10, C11, C12, C14 and a provider switch (C08)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentstream.models.endpoints import load_endpoints
from agentstream.runtime.deltas import PartialReplies, decode_delta
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.events import ModelOutput, ToolOutput, TurnEnded, TurnFailed
from agentstream.wire.keys import DELTA_FIELD
from tests.support import anthropic_api as api
from tests.support import model_apps
from tests.support.fault_server import FaultServer, Recorded, Reply, call, chat, text_stream
from tests.support.inprocess import InProcess, events_of, publish, wait_reply

pytestmark = pytest.mark.integration

UNUSED = "http://127.0.0.1:9"


def write_models(path: Path, **urls: str) -> str:
    """A models file with every endpoint the test app names (unused ones point nowhere)."""
    entries = {
        "claude-a": {
            "provider": "anthropic",
            "base_url": urls.get("anthropic", UNUSED),
            "model": "claude-a",
            "api_key_env": "TEST_ANTHROPIC_KEY",
            "thinking_budget_tokens": 1024,
            "stream": True,
        },
        "claude-b": {
            "provider": "anthropic",
            "base_url": urls.get("anthropic", UNUSED),
            "model": "claude-b",
            "api_key_env": "TEST_ANTHROPIC_KEY",
            "thinking_budget_tokens": 1024,
            "stream": False,
        },
        "deepseek": {"provider": "openai", "base_url": urls.get("deepseek", UNUSED), "model": "deepseek-v4"},
        "deepseek-plain": {"provider": "openai", "base_url": urls.get("deepseek", UNUSED), "model": "deepseek-v4"},
    }
    file = path / "models.yaml"
    file.write_text(json.dumps({"models": entries}))  # JSON is YAML
    return str(file)


@pytest.fixture
async def run(redis_url, namespace, tmp_path, monkeypatch):
    """Start an in-process agent loop + tool worker on model servers; returns an async starter."""
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", api.API_KEY)
    started: list[InProcess] = []

    async def start(openai_url: str, *, stream: bool = False, **urls: str) -> InProcess:
        env = {
            "AGENTSTREAM_MODELS_FILE": write_models(tmp_path, **urls),
            "AGENTSTREAM_MODEL_RETRIES": "2",
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps({"stream": stream}),
        }
        services = InProcess(model_apps.app, redis_url, namespace, openai_url, env=env)
        started.append(services)
        await services.start("loop-and-tools", "agent-loop", "tool-worker")
        return services

    yield start
    for services in started:
        await services.stop_all()


@pytest.fixture(autouse=True)
def _clear_runs():
    model_apps.RUNS.clear()


async def stop(services: InProcess) -> None:
    await services.stop_all()


async def verify(events, services: InProcess):
    # the models file is read off the event loop (the services run in it)
    endpoints = await asyncio.to_thread(load_endpoints, services.settings("verify"), require_keys=False)
    return [c.matches for c in rebuild_calls(events, model_apps.app.agent, endpoints=endpoints)]


async def test_c11_malformed_arguments_are_kept_answered_with_an_error_and_replayed_verbatim(run, redis, keys, store):
    bad = '{"expression": "2+2"'  # not valid JSON
    with FaultServer(
        [
            chat(None, tool_calls=[call("call_1", "calculator", bad)], finish="tool_calls"),
            chat("Sorry, I sent broken arguments."),
        ]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="c11", turn_id="t1", agent="calc", text="What is 2+2?")
        reply = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert reply.status == "ended"
    events = await events_of(store, "c11")
    output = next(e for e in events if isinstance(e, ModelOutput))
    assert output.tool_calls[0].arguments == bad  # stored as the exact string
    result = next(e for e in events if isinstance(e, ToolOutput))
    assert result.error == "invalid_arguments" and "not valid JSON" in result.text
    assert "calculator" not in model_apps.RUNS  # never run with {} or a guess
    second = server.bodies()[1]["messages"]
    assert second[2]["tool_calls"][0]["function"]["arguments"] == bad  # replayed verbatim
    assert second[3]["role"] == "tool" and "not valid JSON" in second[3]["content"]
    assert await verify(events, services) == [True, True]


async def test_unknown_tool_gets_an_error_listing_the_tools_and_its_sibling_still_runs(run, redis, keys, store):
    calls = [call("call_1", "calculator", '{"expression": "6*7"}'), call("call_2", "weather", '{"city": "Oslo"}')]
    with FaultServer(
        [chat(None, tool_calls=calls, finish="tool_calls"), chat("42, and I have no weather tool.")]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="unknown", turn_id="t1", agent="calc", text="6*7 and the weather?")
        reply = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert reply.status == "ended"
    results = {e.call_id: e for e in await events_of(store, "unknown") if isinstance(e, ToolOutput)}
    assert results["call_1"].text == "42" and results["call_1"].error is None
    assert results["call_2"].error == "unknown_tool" and "calculator, get_time, write_file" in results["call_2"].text
    tool_messages = [m for m in server.bodies()[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2"]


@pytest.mark.parametrize("finish", ["length", "tool_calls"])
async def test_c12_a_call_cut_off_by_the_token_limit_is_not_run(run, redis, keys, store, finish):
    cut = call("call_1", "write_file", '{"path":"a.txt","content":"hello wor')
    with FaultServer(
        [
            chat(
                None,
                tool_calls=[cut],
                finish=finish,
                usage={"prompt_tokens": 10, "completion_tokens": 300, "total_tokens": 310},
            ),
            chat("I will write a shorter file."),
        ]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id=f"c12{finish}", turn_id="t1", agent="calc", text="Write a.txt")
        reply = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert reply.status == "ended" and "write_file" not in model_apps.RUNS
    events = await events_of(store, f"c12{finish}")
    assert next(e for e in events if isinstance(e, ModelOutput)).stop_reason == "length"
    (result,) = [e for e in events if isinstance(e, ToolOutput)]
    assert result.call_id == "call_1" and result.error == "cut_off"
    assert "cut off" in [m for m in server.bodies()[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert not await redis.xlen(keys.tools("default"))  # no job was ever published


async def test_c12_empty_arguments_run_a_tool_without_parameters(run, redis, keys, store):
    with FaultServer(
        [chat(None, tool_calls=[call("call_2", "get_time", "")], finish="tool_calls"), chat("It is noon.")]
    ) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="c12c", turn_id="t1", agent="calc", text="Time?")
        reply = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert reply.status == "ended" and model_apps.RUNS == ["get_time"]
    (result,) = [e for e in await events_of(store, "c12c") if isinstance(e, ToolOutput)]
    assert result.text == "12:00" and result.error is None


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (chat(None, finish="content_filter"), "content_filter"),
        (chat(None, refusal="I can't help with that."), "refusal"),
        (chat("partial", finish="eos_token"), "unknown"),
    ],
)
async def test_c14_refusal_filter_and_unknown_stops_end_the_turn_without_a_retry(run, redis, keys, store, reply, code):
    with FaultServer([reply], repeat_last=True) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id=f"c14{code}", turn_id="t1", agent="calc", text="Do the forbidden thing.")
        got = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert got.status == "failed" and got.code == code
    if code == "refusal":
        assert "I can't help with that." in got.reason
    assert len(server.requests) == 1
    events = await events_of(store, f"c14{code}")
    assert isinstance(events[-1], TurnFailed) and not any(isinstance(e, TurnEnded) for e in events)


async def test_c14_an_empty_reply_after_a_tool_result_is_retried_once_then_fails_clearly(run, redis, keys, store):
    script = [
        chat(None, tool_calls=[call("call_1", "calculator", '{"expression": "1+1"}')], finish="tool_calls"),
        chat("", usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
        chat(None),
    ]
    with FaultServer(script) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="c14c", turn_id="t1", agent="calc", text="1+1?")
        got = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert got.status == "failed" and got.code == "empty_reply" and "2 times" in got.reason
    assert len(server.requests) == 3
    with FaultServer([chat(""), chat("Two.")]) as server:
        services = await run(server.base_url)
        await publish(redis, keys, trace_id="c14c2", turn_id="t2", agent="calc", text="1+1?")
        got = await wait_reply(redis, keys, "t2")
        await stop(services)
    assert got.status == "ended" and got.answer == "Two."


async def test_a_streamed_turn_publishes_its_tokens_and_a_cut_attempt_is_dropped(run, redis, keys, store):
    full = text_stream("The ", "answer ", "is ", "4.")
    with FaultServer([Reply(events=full, cut_after=3), Reply(events=full)]) as server:
        services = await run(server.base_url, stream=True)
        await publish(redis, keys, trace_id="streamed", turn_id="t1", agent="calc", text="2+2?")
        got = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert got.status == "ended" and got.answer == "The answer is 4."
    deltas = [decode_delta(f[DELTA_FIELD]) for _, f in await redis.xrange(keys.deltas("streamed"))]
    output = next(e for e in await events_of(store, "streamed") if isinstance(e, ModelOutput))
    aborted = {d.attempt for d in deltas if d.kind == "abort"}
    assert len(aborted) == 1 and output.attempt_id not in aborted and output.endpoint == "default"
    partial = PartialReplies()
    for d in deltas:
        partial.feed(d)
    assert partial.get("t1", 0).text == "The answer is 4." and partial.dropped[0].attempt in aborted
    assert 0 < await redis.ttl(keys.deltas("streamed")) <= 600  # short-lived


def deepseek_rule(recorded: Recorded) -> Reply:
    """A server that, like DeepSeek's thinking mode, wants reasoning_content back on tool turns (C10)."""
    messages = recorded.json["messages"]
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls") and "reasoning_content" not in m:
            return Reply(
                status=400,
                body={
                    "error": {
                        "message": "The `reasoning_content` in the thinking mode must be passed back to the API.",
                        "type": "invalid_request_error",
                    }
                },
            )
    if messages[-1]["role"] == "user":
        return chat(
            "",
            tool_calls=[call("call_1", "lookup", '{"q": "oslo"}')],
            finish="tool_calls",
            reasoning="Need the lookup tool.",
        )
    return chat("Oslo is 42.", reasoning="Done.")


@pytest.mark.parametrize(("agent", "status"), [("deep", "ended"), ("deep-plain", "failed")])
async def test_c10_reasoning_content_goes_back_to_the_server_that_needs_it(run, redis, keys, store, agent, status):
    with FaultServer(rule=deepseek_rule) as server:
        services = await run(UNUSED + "/v1", deepseek=server.base_url)
        await publish(redis, keys, trace_id=f"c10{agent}", turn_id="t1", agent=agent, text="Weather in Oslo?")
        got = await wait_reply(redis, keys, "t1")
        await stop(services)
    assert got.status == status, got.reason  # without the policy's replay the server refuses the second call
    events = await events_of(store, f"c10{agent}")
    first = next(e for e in events if isinstance(e, ModelOutput))
    assert first.reasoning == "Need the lookup tool." and first.model == "deepseek-v4"
    if status == "failed":
        assert got.code == "model_error" and "reasoning_content" in got.reason


def anthropic_rule(recorded: Recorded) -> Reply:
    """The documented-shape Messages API stand-in: validates, then answers per model."""
    body = recorded.json
    problem = api.validate(body, recorded.headers)
    if problem is not None:
        return Reply(status=400, body=api.error("invalid_request_error", problem))
    model = body["model"]
    last = body["messages"][-1]["content"]
    if last[0]["type"] == "tool_result":
        content = [{"type": "text", "text": f"{model} says: {last[0]['content']}"}]
        stop_reason = "end_turn"
    else:
        content = [
            api.thinking(model, f"{model} plans a lookup.\n"),
            {
                "type": "tool_use",
                "id": f"toolu_{len(body['messages'])}_{model.replace('-', '')}",
                "name": "lookup",
                "input": {"q": model},
            },
        ]
        stop_reason = "tool_use"
    if body.get("stream"):
        return Reply(events=api.stream_events(model, content, stop_reason))
    return Reply(body=api.message(model, content, stop_reason))


def gpt_rule(recorded: Recorded) -> Reply:
    if recorded.json["messages"][-1]["role"] == "tool":
        return chat("gpt says done.", reasoning="short plan")
    return chat(
        None, tool_calls=[call(f"call_{len(recorded.json['messages'])}", "lookup", '{"q": "gpt"}')], finish="tool_calls"
    )


async def test_c08_a_conversation_switches_provider_and_model_and_goes_on(run, redis, keys, store):
    with FaultServer(rule=anthropic_rule) as anthropic, FaultServer(rule=gpt_rule) as openai:
        services = await run(openai.base_url, anthropic=anthropic.url)
        for n, agent in enumerate(["claude-a", "gpt", "claude-b", "claude-a"], start=1):
            await publish(redis, keys, trace_id="switch", turn_id=f"t{n}", agent=agent, text=f"turn {n}")
            got = await wait_reply(redis, keys, f"t{n}")
            assert got.status == "ended", got.reason
        await stop(services)
    bodies = [r.json for r in anthropic.requests]
    assert all(api.validate(b, {"x-api-key": api.API_KEY, "anthropic-version": "x"}) is None for b in bodies)
    thinking_of = [
        [blk for m in b["messages"] if m["role"] == "assistant" for blk in m["content"] if blk["type"] == "thinking"]
        for b in bodies
    ]
    to_b = [t for b, t in zip(bodies, thinking_of, strict=True) if b["model"] == "claude-b"]
    assert to_b[0] == []  # turn 3's first call: claude-a's blocks are never sent to claude-b
    assert all(blk["signature"] == api.sign("claude-b", blk["thinking"]) for t in to_b for blk in t)  # only its own
    last_a = thinking_of[-1]
    assert last_a and all(
        blk["signature"] == api.sign("claude-a", blk["thinking"]) for blk in last_a
    )  # claude-a's own, verbatim
    assert "short plan" not in json.dumps(bodies)  # gpt's reasoning never leaks into Anthropic requests
    assert not any("thinking" in json.dumps(m) for b in openai.bodies() for m in b["messages"])
    events = await events_of(store, "switch")
    assert all(await verify(events, services))
