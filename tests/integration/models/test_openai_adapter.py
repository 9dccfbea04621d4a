"""The OpenAI-compatible adapter against a failure-injecting HTTP server (real sockets).

Each failure has a test that fails without its handling: Retry-After honoured, 5xx retried, a
stream cut mid-reply retried under a new attempt id whose deltas replace the dropped ones, a
stream that ends early never taken for a reply, errors inside a stream converted, statuses
classified, the key never recorded.
"""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest
from pydantic import SecretStr

from agentstream.context.request import ChatRequest, ToolDefinition, UserMessage
from agentstream.errors import ModelConfigError, ModelInputRejected, ModelUnanswered
from agentstream.models import build_model
from agentstream.models.endpoints import ModelEndpoint
from agentstream.runtime.deltas import Dropped, PartialReplies
from agentstream.wire.deltas import ListSink
from tests.support.fault_server import FaultServer, Reply, chat, chunk, text_stream

REQUEST = ChatRequest(system="S", messages=(UserMessage(text="Say hello"),), max_output_tokens=64)
SEARCH = ToolDefinition(
    name="search", description="Search.", parameters={"type": "object", "properties": {"q": {"type": "string"}}}
)


class Waits:
    """Records the waits between attempts instead of sleeping (no timed assertions)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def model_for(server: FaultServer, *, stream: bool = False, retries: int = 2, key: str | None = None, **kw):
    endpoint = ModelEndpoint(
        id="fault",
        provider="openai",
        base_url=server.base_url,
        model="fault-model",
        stream=stream,
        api_key=SecretStr(key) if key else None,
        **kw,
    )
    waits = Waits()
    return build_model(endpoint, retries=retries, backoff_s=0.25, sleep=waits), waits


async def test_429_is_retried_after_the_wait_the_server_asked_for():
    with FaultServer(
        [Reply(status=429, body={"error": {"message": "slow down"}}, headers={"retry-after": "3"}), chat("Hello!")]
    ) as server:
        model, waits = model_for(server)
        output = await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert output.content == "Hello!" and output.stop_reason == "stop"
    assert waits.seconds == [3.0]  # Retry-After, not the backoff
    assert len(server.requests) == 2 and server.requests[0].raw == server.requests[1].raw


async def test_an_http_date_retry_after_and_backoff_without_one():
    with FaultServer([Reply(status=503, body={}), Reply(status=502, body={}), chat("ok")]) as server:
        model, waits = model_for(server)
        assert (await model.complete(REQUEST, turn_id="t", step=0)).content == "ok"
        await model.aclose()
    assert len(waits.seconds) == 2 and waits.seconds[0] < waits.seconds[1]  # exponential backoff


async def test_500_is_retried_then_the_call_fails_with_the_status():
    with FaultServer([Reply(status=500, body={"error": {"message": "boom"}})], repeat_last=True) as server:
        model, waits = model_for(server, retries=2)
        with pytest.raises(ModelUnanswered) as info:
            await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert info.value.status_code == 500 and "after 3 attempts" in str(info.value) and "boom" in str(info.value)
    assert len(server.requests) == 3 and len(waits.seconds) == 2


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, ModelInputRejected),
        (413, ModelInputRejected),
        (422, ModelInputRejected),
        (401, ModelConfigError),
        (403, ModelConfigError),
        (404, ModelConfigError),
    ],
)
async def test_input_and_configuration_errors_are_not_retried(status, error):
    with FaultServer(
        [Reply(status=status, body={"error": {"message": f"status {status}"}})], repeat_last=True
    ) as server:
        model, _ = model_for(server)
        with pytest.raises(error):
            await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert len(server.requests) == 1


async def test_a_stream_cut_mid_reply_is_retried_and_the_dropped_attempts_tokens_are_marked():
    full = text_stream("Hel", "lo ", "wor", "ld")
    with FaultServer([Reply(events=full, cut_after=3, cut="reset"), Reply(events=full)]) as server:
        model, _ = model_for(server, stream=True)
        sink = ListSink()
        output = await model.complete(REQUEST, turn_id="t1", step=2, deltas=sink)
        await model.aclose()
    assert output.content == "Hello world" and output.stop_reason == "stop"
    first, second = sink.deltas[0].attempt, sink.deltas[-1].attempt
    assert first != second and output.attempt_id == second
    assert [d.kind for d in sink.deltas if d.attempt == first] == ["start", "text", "text", "abort"]
    assert [d.kind for d in sink.deltas if d.attempt == second][-1] == "end"
    assert all(d.turn_id == "t1" and d.step == 2 for d in sink.deltas)
    # a client following the deltas drops the first attempt and ends with the full text
    partials = PartialReplies()
    changes = [partials.feed(d) for d in sink.deltas]
    assert any(isinstance(c, Dropped) and c.attempt == first for c in changes)
    assert partials.get("t1", 2).text == "Hello world" and partials.get("t1", 2).done
    body = json.loads(server.requests[0].raw)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert output.request_sha256 == hashlib.sha256(server.requests[0].raw).hexdigest()
    assert output.usage.completion_tokens == 4


async def test_a_stream_that_ends_before_the_reply_finished_is_never_a_reply():
    partial = text_stream("Hel", "lo")
    with FaultServer([Reply(events=partial, cut_after=2, cut="eof")], repeat_last=True) as server:
        model, _ = model_for(server, stream=True, retries=1)
        sink = ListSink()
        with pytest.raises(ModelUnanswered, match="ended before the reply finished"):
            await model.complete(REQUEST, turn_id="t", step=0, deltas=sink)
        await model.aclose()
    assert len(server.requests) == 2
    assert [d.kind for d in sink.deltas].count("abort") == 2 and "end" not in [d.kind for d in sink.deltas]


def interrupted_stream(*pieces: str) -> list:
    """What llama.cpp's server (interrupt_requests) sends for a stream another request cut off:
    a role chunk, maybe some text, then ``[DONE]`` with no finish reason."""
    return [chunk({"role": "assistant", "content": ""}), *[chunk({"content": p}) for p in pieces], "[DONE]"]


async def test_a_stream_ended_by_done_without_a_finish_reason_is_retried_not_a_reply():
    with FaultServer(
        [
            Reply(events=interrupted_stream()),
            Reply(events=interrupted_stream("Hel")),
            Reply(events=text_stream("Hello")),
        ]
    ) as server:
        model, _ = model_for(server, stream=True, retries=2)
        sink = ListSink()
        output = await model.complete(REQUEST, turn_id="t", step=0, deltas=sink)
        await model.aclose()
    assert len(server.requests) == 3
    assert output.content == "Hello" and output.stop_reason == "stop"
    assert [d.kind for d in sink.deltas].count("abort") == 2


async def test_streams_always_ended_without_a_finish_reason_fail_the_call_after_bounded_retries():
    with FaultServer([Reply(events=interrupted_stream("Hi"))], repeat_last=True) as server:
        model, _ = model_for(server, stream=True, retries=1)
        sink = ListSink()
        with pytest.raises(ModelUnanswered, match="no finish reason"):
            await model.complete(REQUEST, turn_id="t", step=0, deltas=sink)
        await model.aclose()
    assert len(server.requests) == 2 and "end" not in [d.kind for d in sink.deltas]


async def test_errors_inside_a_stream():
    overloaded = Reply(events=[chunk({"content": "Hi"}), {"error": {"message": "Overloaded", "type": "server_error"}}])
    with FaultServer([overloaded, Reply(events=text_stream("Hi!"))]) as server:
        model, _ = model_for(server, stream=True)
        assert (await model.complete(REQUEST, turn_id="t", step=0)).content == "Hi!"
        await model.aclose()
    # mock-llm's way of sending a 401 to a stream: status 200 and the error as the only event
    bad_key = Reply(
        events=[
            {
                "error": {
                    "message": "Incorrect API key provided.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            }
        ]
    )
    with FaultServer([bad_key], repeat_last=True) as server:
        model, _ = model_for(server, stream=True)
        with pytest.raises(ModelConfigError, match="invalid_api_key|Incorrect API key"):
            await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert len(server.requests) == 1


async def test_the_key_is_sent_and_never_recorded_or_shown():
    key = "sk-test-secret-0000111122223333"
    echo = Reply(status=401, body={"error": {"message": f"Incorrect API key provided: {key}"}})
    with FaultServer([chat("fine"), echo]) as server:
        model, _ = model_for(server, key=key)
        output = await model.complete(REQUEST, turn_id="t", step=0)
        with pytest.raises(ModelConfigError) as info:
            await model.complete(REQUEST, turn_id="t", step=1)
        await model.aclose()
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"
    assert key.encode() not in msgspec.json.encode(output) and key.encode() not in server.requests[0].raw
    assert key not in str(info.value) and "***" in str(info.value)
    assert key not in repr(model.endpoint)


async def test_streamed_parallel_tool_calls_and_a_server_that_does_not_stream():
    events = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_A", "type": "function", "function": {"name": "search", "arguments": ""}}
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_B", "type": "function", "function": {"name": "search", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":"al'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"q":"beta"}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'pha"}'}}]}),
        chunk(finish="tool_calls"),
        "[DONE]",
    ]
    request = ChatRequest(system="S", messages=(UserMessage(text="search both"),), tools=(SEARCH,))
    with FaultServer([Reply(events=events), chat("plain")]) as server:
        model, _ = model_for(server, stream=True)
        sink = ListSink()
        output = await model.complete(request, turn_id="t", step=0, deltas=sink)
        assert [(c.id, c.arguments) for c in output.tool_calls] == [
            ("call_A", '{"q":"alpha"}'),
            ("call_B", '{"q":"beta"}'),
        ]
        partial = PartialReplies()
        for d in sink.deltas:
            partial.feed(d)
        assert {i: c.arguments for i, c in partial.get("t", 0).tool_calls.items()} == {
            0: '{"q":"alpha"}',
            1: '{"q":"beta"}',
        }
        # asked to stream, the server answers with one JSON object: read it whole
        sink = ListSink()
        whole = await model.complete(REQUEST, turn_id="t", step=1, deltas=sink)
        await model.aclose()
    assert whole.content == "plain" and sink.deltas == []  # a whole answer publishes no delta


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_custom_tool_call_is_an_invalid_output_not_a_call_with_no_name(stream):
    from agentstream.errors import InvalidModelOutput

    custom = {"id": "call_c", "type": "custom", "custom": {"name": "shell", "input": "ls"}}
    reply = (
        Reply(events=[chunk({"role": "assistant", "tool_calls": [{"index": 0, **custom}]}), chunk(finish="tool_calls")])
        if stream
        else chat(None, tool_calls=[custom], finish="tool_calls")
    )
    with FaultServer([reply]) as server:
        model, _ = model_for(server, stream=stream, retries=0)
        request = ChatRequest(system="S", messages=(UserMessage(text="list"),), tools=(SEARCH,))
        with pytest.raises(InvalidModelOutput, match="type 'custom'"):
            await model.complete(request, turn_id="t", step=0)
        await model.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_window_miss_from_the_server_is_the_typed_error_with_its_figures(stream):
    from agentstream.errors import ContextWindowExceeded

    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9013 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    with FaultServer([Reply(status=400, body=body)]) as server:
        model, _ = model_for(server, stream=stream)
        with pytest.raises(ContextWindowExceeded) as caught:
            await model.complete(REQUEST, turn_id="t", step=0)
        await model.aclose()
    assert (caught.value.prompt_tokens, caught.value.window_tokens) == (9013, 8192)
    assert len(server.requests) == 1  # not retried as is
