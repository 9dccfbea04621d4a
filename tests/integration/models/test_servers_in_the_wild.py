"""The whole tool loop through the OpenAI-compatible servers people run locally (issue 34): each
fixture answers in the server's documented format, streamed and not, and a turn that calls two
tools and then answers must run both tools with their own arguments, end with the answer and
rebuild to the same request fingerprints. Real Redis, the agent loop and tool worker in process,
the real adapter over HTTP.

The formats, from each server's documentation and its OpenAI-compatible handlers:

- Ollama (``/v1/chat/completions``, docs/openai.md): every streamed call arrives whole in one
  chunk under ``index: 0`` with its own id, the finish reason of a call is ``stop`` or
  ``tool_calls``, ``system_fingerprint: fp_ollama``;
- vLLM with a tool parser (``--enable-auto-tool-choice --tool-call-parser hermes``): OpenAI's
  form, the first piece of a call carries id, type and name with empty arguments, then argument
  pieces under the call's index; ``reasoning_content`` when a reasoning parser runs;
- vLLM without a tool parser: the model's call as text in ``content`` (Hermes' ``<tool_call>``
  tags), finish ``stop``: recovered only with ``quirks.tool_calls_in_text``;
- LM Studio (``/v1/chat/completions``): OpenAI's form, ids on the first piece only, a ``stats``
  object and ``system_fingerprint`` in whole responses;
- LiteLLM's proxy: OpenAI's form with every field present, ``null`` where unset (``id: null``,
  ``name: null`` in argument pieces, ``function_call: null``), and a final usage chunk.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentstream.models.endpoints import load_endpoints
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.events import ModelOutput, ToolOutput
from tests.support import model_apps
from tests.support.fault_server import FaultServer, Reply
from tests.support.inprocess import InProcess, events_of, publish, wait_reply

pytestmark = pytest.mark.integration

CALLS = [("call_a1", "calculator", '{"expression": "6*7"}'), ("call_b2", "get_time", "{}")]
ANSWER = "6*7 is 42 and it is 12:00."
USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}


def _response(message: dict[str, Any], finish: str, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1733500000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": USAGE,
        **extra,
    }


def _chunk(delta: dict[str, Any], finish: str | None, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1733500000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def _whole_calls(model: str, finish: str, **extra: Any) -> Reply:
    calls = [
        {"id": i, "index": n, "type": "function", "function": {"name": name, "arguments": args}}
        for n, (i, name, args) in enumerate(CALLS)
    ]
    return Reply(body=_response({"role": "assistant", "content": "", "tool_calls": calls}, finish, model, **extra))


def _whole_text(model: str, text: str, **extra: Any) -> Reply:
    return Reply(body=_response({"role": "assistant", "content": text}, "stop", model, **extra))


def _text_events(model: str, text: str, **extra: Any) -> list[Any]:
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    events: list[Any] = [_chunk({"role": "assistant", "content": ""}, None, model, **extra)]
    events += [_chunk({"content": p}, None, model, **extra) for p in pieces]
    events += [_chunk({}, "stop", model, **extra), {**_chunk({}, None, model), "choices": [], "usage": USAGE}, "[DONE]"]
    return events


# --- each server's formats ----------------------------------------------------------------------


def ollama(stream: bool) -> list[Reply]:
    model, extra = "llama3.2", {"system_fingerprint": "fp_ollama"}
    if not stream:
        return [_whole_calls(model, "tool_calls", **extra), _whole_text(model, ANSWER, **extra)]
    events: list[Any] = [
        _chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": i, "index": 0, "type": "function", "function": {"name": n, "arguments": a}}],
            },
            None,
            model,
            **extra,
        )
        for i, n, a in CALLS
    ]
    events += [_chunk({"role": "assistant", "content": ""}, "stop", model, **extra), "[DONE]"]
    return [Reply(events=events), Reply(events=_text_events(model, ANSWER, **extra))]


def vllm(stream: bool) -> list[Reply]:
    model = "Qwen/Qwen2.5-7B-Instruct"
    if not stream:
        return [_whole_calls(model, "tool_calls"), _whole_text(model, ANSWER)]
    events: list[Any] = [_chunk({"role": "assistant", "content": ""}, None, model)]
    for n, (i, name, args) in enumerate(CALLS):
        events.append(
            _chunk(
                {
                    "tool_calls": [
                        {"id": i, "type": "function", "index": n, "function": {"name": name, "arguments": ""}}
                    ]
                },
                None,
                model,
            )
        )
        for k in range(0, len(args), 5):
            events.append(
                _chunk({"tool_calls": [{"index": n, "function": {"arguments": args[k : k + 5]}}]}, None, model)
            )
    events += [_chunk({}, "tool_calls", model), {**_chunk({}, None, model), "choices": [], "usage": USAGE}, "[DONE]"]
    return [Reply(events=events), Reply(events=_text_events(model, ANSWER))]


HERMES_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'


def vllm_without_parser(stream: bool) -> list[Reply]:
    model = "Qwen/Qwen2.5-7B-Instruct"
    if not stream:
        return [_whole_text(model, HERMES_CALL), _whole_text(model, "6*7 is 42.")]
    return [Reply(events=_text_events(model, HERMES_CALL)), Reply(events=_text_events(model, "6*7 is 42."))]


def lm_studio(stream: bool) -> list[Reply]:
    model = "qwen2.5-7b-instruct"
    extra = {"system_fingerprint": "qwen2.5-7b-instruct"}
    stats = {"stats": {"tokens_per_second": 41.2, "time_to_first_token": 0.12, "stop_reason": "eosFound"}}
    if not stream:
        return [_whole_calls(model, "tool_calls", **extra, **stats), _whole_text(model, ANSWER, **extra, **stats)]
    events: list[Any] = []
    for n, (i, name, args) in enumerate(CALLS):
        first = {"index": n, "id": i, "type": "function", "function": {"name": name, "arguments": ""}}
        events.append(_chunk({"role": "assistant", "tool_calls": [first]}, None, model, **extra))
        for k in range(0, len(args), 4):
            piece = {"index": n, "type": "function", "function": {"arguments": args[k : k + 4]}}
            events.append(_chunk({"role": "assistant", "tool_calls": [piece]}, None, model, **extra))
    events += [_chunk({}, "tool_calls", model, **extra), "[DONE]"]
    return [Reply(events=events), Reply(events=_text_events(model, ANSWER, **extra))]


def litellm(stream: bool) -> list[Reply]:
    model = "ollama/llama3.2"
    if not stream:
        return [_whole_calls(model, "tool_calls"), _whole_text(model, ANSWER)]
    events: list[Any] = []
    for n, (i, name, args) in enumerate(CALLS):
        for k, piece in enumerate([""] + [args[j : j + 6] for j in range(0, len(args), 6)]):
            call = {
                "id": i if k == 0 else None,
                "function": {"arguments": piece, "name": name if k == 0 else None},
                "type": "function",
                "index": n,
            }
            delta = {"content": None, "role": "assistant", "function_call": None, "tool_calls": [call], "audio": None}
            events.append(_chunk(delta, None, model, provider_specific_fields=None))
    events += [
        _chunk({"content": None, "role": None, "function_call": None, "tool_calls": None}, "tool_calls", model),
        {**_chunk({}, None, model), "choices": [], "usage": USAGE},
        "[DONE]",
    ]
    return [Reply(events=events), Reply(events=_text_events(model, ANSWER))]


SERVERS = {
    "ollama": (ollama, {}),
    "vllm": (vllm, {}),
    "vllm_without_parser": (vllm_without_parser, {"tool_calls_in_text": True}),
    "lm_studio": (lm_studio, {}),
    "litellm": (litellm, {}),
}


UNUSED = "http://127.0.0.1:9"


def write_models(path: Path, base_url: str, *, stream: bool, quirks: dict[str, Any]) -> str:
    """A models file: ``default`` is the server under test; the app's other endpoints point nowhere."""
    anthropic = {"provider": "anthropic", "base_url": UNUSED, "api_key_env": "TEST_ANTHROPIC_KEY"}
    entries = {
        "default": {"provider": "openai", "base_url": base_url, "model": "local", "stream": stream, "quirks": quirks},
        "claude-a": {**anthropic, "model": "claude-a"},
        "claude-b": {**anthropic, "model": "claude-b"},
        "deepseek": {"provider": "openai", "base_url": UNUSED, "model": "deepseek-v4"},
        "deepseek-plain": {"provider": "openai", "base_url": UNUSED, "model": "deepseek-v4"},
    }
    file = path / "models.yaml"
    file.write_text(json.dumps({"models": entries}))  # JSON is YAML
    return str(file)


@pytest.fixture
async def run(redis_url, namespace, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-test")
    started: list[InProcess] = []

    async def start(base_url: str, *, stream: bool, quirks: dict[str, Any]) -> InProcess:
        env = {
            "AGENTSTREAM_MODELS_FILE": write_models(tmp_path, base_url, stream=stream, quirks=quirks),
            "AGENTSTREAM_MODEL_RETRIES": "0",
        }
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


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("server", list(SERVERS))
async def test_the_tool_loop_runs_through_each_servers_format(run, redis, keys, store, server, stream):
    replies, quirks = SERVERS[server]
    trace = f"{server}-{stream}"
    with FaultServer(replies(stream)) as fake:
        services = await run(fake.base_url, stream=stream, quirks=quirks)
        await publish(redis, keys, trace_id=trace, turn_id="t1", agent="calc", text="6*7, and the time?")
        reply = await wait_reply(redis, keys, "t1")
        await services.stop_all()
        second = fake.bodies()[1]["messages"]
    events = await events_of(store, trace)
    results = {e.call_id: e for e in events if isinstance(e, ToolOutput)}
    first = next(e for e in events if isinstance(e, ModelOutput))
    if server == "vllm_without_parser":  # one call, recovered from the reply's text and recorded so
        assert reply.status == "ended" and reply.answer == "6*7 is 42."
        (call,) = first.tool_calls
        assert (call.name, json.loads(call.arguments)) == ("calculator", {"expression": "6*7"})
        assert first.content == "" and "recovered from the reply's text" in (first.stop_detail or "")
        assert results[call.id].text == "42" and model_apps.RUNS == ["calculator"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    else:
        assert reply.status == "ended" and reply.answer == ANSWER, reply
        assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == CALLS
        assert (results["call_a1"].text, results["call_b2"].text) == ("42", "12:00")
        assert sorted(model_apps.RUNS) == ["calculator", "get_time"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
        assert [c["function"]["arguments"] for c in second[2]["tool_calls"]] == [a for _, _, a in CALLS]
    assert all(await verify(events, services))


def _text_calls_count(recovered: str) -> float:
    value = REGISTRY.get_sample_value(
        "agentstream_model_text_tool_calls_total", {"endpoint": "default", "recovered": recovered}
    )
    return value or 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_without_the_setting_a_call_left_as_text_is_not_delivered_without_a_warning(
    run, redis, keys, store, stream, caplog
):
    before = _text_calls_count("false")
    with FaultServer(vllm_without_parser(stream)[:1]) as fake:
        services = await run(fake.base_url, stream=stream, quirks={})
        await publish(redis, keys, trace_id=f"plain-{stream}", turn_id="t1", agent="calc", text="6*7?")
        reply = await wait_reply(redis, keys, "t1")
        await services.stop_all()
    assert reply.status == "ended" and reply.answer == HERMES_CALL  # not run without the setting ...
    assert model_apps.RUNS == []
    assert _text_calls_count("false") == before + 1  # ... but counted, and logged for the operator
    assert any("tool_calls_in_text" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
