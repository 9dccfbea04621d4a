"""Against a server nobody here wrote: the npm package ``@dwmkerr/mock-llm``.

A two-turn tool loop through the agent loop (real Redis, in process): the model asks for the
calculator, the tool worker runs it, the model answers from the result; then a second turn in
the same conversation. Streaming a text reply, and mock-llm's error inside a stream.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agentstream.context.request import ChatRequest, UserMessage
from agentstream.errors import ModelConfigError
from agentstream.models import build_model
from agentstream.models.endpoints import ModelEndpoint, Quirks, load_endpoints
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.deltas import ListSink
from agentstream.wire.events import ModelOutput, ToolOutput
from tests.support import model_apps
from tests.support.inprocess import InProcess, events_of, publish, wait_reply
from tests.support.mock_llm import MockLLM, MockLLMUnavailable

pytestmark = pytest.mark.integration

RULES = """
streaming:
  chunkSize: 4
  chunkIntervalMs: 1
rules:
  - path: "/v1/chat/completions"
    match: "body.messages[-1].role == 'user'"
    response:
      status: 200
      content: |
        {
          "id": "chatcmpl-{{timestamp}}",
          "object": "chat.completion",
          "model": "{{jmes request body.model}}",
          "choices": [{
            "index": 0,
            "message": {
              "role": "assistant",
              "content": null,
              "tool_calls": [{"id": "call_{{timestamp}}", "type": "function",
                              "function": {"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}"}}]
            },
            "finish_reason": "tool_calls"
          }]
        }
  - path: "/v1/chat/completions"
    match: "body.messages[-1].role == 'tool'"
    response:
      status: 200
      content: |
        {
          "id": "chatcmpl-{{timestamp}}",
          "object": "chat.completion",
          "model": "{{jmes request body.model}}",
          "choices": [{"index": 0,
                       "message": {"role": "assistant",
                                   "content": "The result is {{jmes request body.messages[-1].content}}."},
                       "finish_reason": "stop"}]
        }
  - path: "/v1/chat/completions"
    match: "body.messages[-1].content == 'stream me'"
    response:
      status: 200
      content: |
        {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "Streaming through mock-llm works."}}]}
  - path: "/v1/chat/completions"
    match: "body.messages[-1].content == 'bad key'"
    response:
      status: 401
      content: |
        {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                   "param": null, "code": "invalid_api_key"}}
"""


@pytest.fixture
def mock_llm(tmp_path):
    config = tmp_path / "mock-llm.yaml"
    config.write_text(RULES)
    try:
        with MockLLM(config) as server:
            yield server
    except MockLLMUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
async def test_a_two_turn_tool_loop_on_mock_llm(mock_llm, redis_url, namespace, redis, keys, store, tmp_path):
    options = {"stream": True, "quirks": {"stream_tools": "never"}}  # mock-llm answers 500 to a streamed tool call
    services = InProcess(
        model_apps.app,
        redis_url,
        namespace,
        mock_llm.base_url,
        env={
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(options),
            "AGENTSTREAM_MODEL_RETRIES": "1",
            "AGENTSTREAM_MODELS_FILE": str(_models_file(tmp_path)),
        },
    )
    await services.start("mock", "agent-loop", "tool-worker")
    try:
        for n in (1, 2):
            await publish(redis, keys, trace_id="mock", turn_id=f"t{n}", agent="calc", text=f"What is 6*7? ({n})")
            reply = await wait_reply(redis, keys, f"t{n}")
            assert reply.status == "ended", reply.reason + mock_llm.log()[-2000:]
            assert reply.answer == "The result is 42."
    finally:
        await services.stop_all()
    events = await events_of(store, "mock")
    outputs = [e for e in events if isinstance(e, ModelOutput)]
    assert [o.stop_reason for o in outputs] == ["tool_calls", "stop", "tool_calls", "stop"]
    assert [e.text for e in events if isinstance(e, ToolOutput)] == ["42", "42"]
    endpoints = await asyncio.to_thread(load_endpoints, services.settings("verify"), require_keys=False)
    assert all(c.matches for c in rebuild_calls(events, model_apps.app.agent, endpoints=endpoints))


def _models_file(tmp_path):
    # the test app names these endpoints; this test calls none of them
    file = tmp_path / "models.yaml"
    unused = {"base_url": "http://127.0.0.1:9"}
    file.write_text(
        json.dumps(
            {
                "models": {
                    "claude-a": {"provider": "anthropic", "model": "a", **unused},
                    "claude-b": {"provider": "anthropic", "model": "b", **unused},
                    "deepseek": {"provider": "openai", "model": "d", "base_url": "http://127.0.0.1:9"},
                    "deepseek-plain": {"provider": "openai", "model": "d", "base_url": "http://127.0.0.1:9"},
                }
            }
        )
    )
    return file


async def test_streaming_and_a_stream_error_on_mock_llm(mock_llm):
    model = build_model(
        ModelEndpoint(
            id="mock",
            provider="openai",
            base_url=mock_llm.base_url,
            model="m",
            stream=True,
            quirks=Quirks(stream_usage=False),
        ),
        retries=0,
    )
    sink = ListSink()
    output = await model.complete(
        ChatRequest(system="S", messages=(UserMessage(text="stream me"),)), turn_id="t", step=0, deltas=sink
    )
    assert output.content == "Streaming through mock-llm works." and output.stop_reason == "stop"
    texts = [d.text for d in sink.deltas if d.kind == "text"]
    assert len(texts) > 3 and "".join(texts) == output.content  # chunks of 4 characters
    with pytest.raises(ModelConfigError, match="invalid_api_key|Incorrect API key"):
        await model.complete(ChatRequest(system="S", messages=(UserMessage(text="bad key"),)), turn_id="t", step=1)
    await model.aclose()
