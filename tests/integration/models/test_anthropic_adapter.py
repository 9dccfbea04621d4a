"""The Anthropic Messages adapter against recorded request/response pairs in the documented shapes.

The server is a stand-in that checks requests as the Messages API does (tests/support/anthropic_api.py):
a thinking block sent back edited, unsigned or to another model is refused with HTTP 400, as is
an empty assistant message or a tool turn continued without its thinking.
"""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from agentstream.context.request import AssistantMessage, ChatRequest, ToolDefinition, ToolResultMessage, UserMessage
from agentstream.errors import ModelConfigError, ModelInputRejected, ModelUnanswered
from agentstream.models import build_model
from agentstream.models.endpoints import ModelEndpoint
from agentstream.wire.deltas import ListSink
from agentstream.wire.events import ToolCall
from tests.support import anthropic_api as api
from tests.support.fault_server import FaultServer, Reply

MODEL = "claude-sonnet-4-5"
WEATHER = ToolDefinition(
    name="get_weather",
    description="Get the current weather in a given location",
    parameters={"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
)
THOUGHT = api.thinking(MODEL, "The user asks about Paris. I should call get_weather with location Paris.\n")
TOOL_USE = {
    "type": "tool_use",
    "id": "toolu_01A09q90qw90lq917835lq9",
    "name": "get_weather",
    "input": {"location": "Paris"},
}

# the recorded first request, exactly as the adapter must send it
RECORDED_REQUEST_1 = {
    "model": MODEL,
    "max_tokens": 1024 + 2048,
    "system": "You answer weather questions.",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "What's the weather in Paris?"}]}],
    "tools": [
        {
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "input_schema": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        }
    ],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 2048},
}
RECORDED_RESPONSE_1 = api.message(
    MODEL, [THOUGHT, {"type": "text", "text": "I'll check the weather in Paris."}, TOOL_USE], "tool_use"
)
RECORDED_RESPONSE_2 = api.message(MODEL, [{"type": "text", "text": "It is 18°C and cloudy in Paris."}], "end_turn")


def model_for(
    server: FaultServer, *, stream: bool = False, budget: int | None = 2048, key: str = api.API_KEY, retries: int = 2
):
    endpoint = ModelEndpoint(
        id="claude",
        provider="anthropic",
        base_url=server.url,
        model=MODEL,
        api_key=SecretStr(key),
        stream=stream,
        thinking_budget_tokens=budget,
    )

    async def no_wait(_s: float) -> None:
        return None

    return build_model(endpoint, retries=retries, backoff_s=0.01, sleep=no_wait)


def first_request() -> ChatRequest:
    return ChatRequest(
        system="You answer weather questions.",
        messages=(UserMessage(text="What's the weather in Paris?"),),
        tools=(WEATHER,),
        max_output_tokens=1024,
        temperature=0.0,
    )


def continued(output) -> ChatRequest:
    asst = AssistantMessage(
        content=output.content,
        tool_calls=output.tool_calls,
        reasoning=output.reasoning,
        provider=output.provider,
        model=output.model,
        replay_blocks=output.replay_blocks,
    )
    result = ToolResultMessage(call_id=output.tool_calls[0].id, name="get_weather", text="18C, cloudy")
    return ChatRequest(
        system="You answer weather questions.",
        messages=(*first_request().messages, asst, result),
        tools=(WEATHER,),
        max_output_tokens=1024,
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_recorded_tool_turn_with_thinking(stream):
    replies = [Reply(body=RECORDED_RESPONSE_1), Reply(body=RECORDED_RESPONSE_2)]
    if stream:
        replies = [
            Reply(events=api.stream_events(MODEL, RECORDED_RESPONSE_1["content"], "tool_use")),
            Reply(events=api.stream_events(MODEL, RECORDED_RESPONSE_2["content"], "end_turn")),
        ]
    fake = api.FakeMessagesAPI(replies)
    with FaultServer(rule=fake) as server:
        model = model_for(server, stream=stream)
        sink = ListSink()
        first = await model.complete(first_request(), turn_id="t", step=0, deltas=sink)
        second = await model.complete(continued(first), turn_id="t", step=1)
        await model.aclose()
    assert fake.refusals == []
    sent = server.requests[0]
    assert (
        sent.path == "/v1/messages"
        and sent.headers["x-api-key"] == api.API_KEY
        and sent.headers["anthropic-version"] == "2023-06-01"
    )
    expected = dict(RECORDED_REQUEST_1, stream=True) if stream else RECORDED_REQUEST_1
    assert sent.json == expected and list(sent.json) == list(expected)
    assert first.stop_reason == "tool_calls" and first.tool_calls == (
        ToolCall(id=TOOL_USE["id"], name="get_weather", arguments='{"location":"Paris"}'),
    )
    assert first.replay_blocks == (THOUGHT,) and first.provider == "anthropic" and first.model == MODEL
    # the thinking block went back byte for byte, first in its message, beside its tool_use
    again = server.requests[1]
    assert json.dumps(THOUGHT).encode().replace(b": ", b":").replace(b", ", b",") in again.raw
    assert (
        again.json["messages"][1]["content"][0] == THOUGHT
        and again.json["messages"][2]["content"][0]["type"] == "tool_result"
    )
    assert second.content == "It is 18°C and cloudy in Paris." and second.stop_reason == "stop"
    if stream:
        assert "".join(d.text for d in sink.deltas if d.kind == "reasoning") == THOUGHT["thinking"]
        assert [d.kind for d in sink.deltas][0] == "start" and sink.deltas[-1].kind == "end"


async def test_c07_a_stream_cut_mid_thinking_is_retried_and_never_recorded():
    events = api.stream_events(MODEL, RECORDED_RESPONSE_1["content"], "tool_use")
    fake = api.FakeMessagesAPI([Reply(events=events, cut_after=6), Reply(events=events)])
    with FaultServer(rule=fake) as server:
        model = model_for(server, stream=True)
        sink = ListSink()
        output = await model.complete(first_request(), turn_id="t", step=0, deltas=sink)
        await model.aclose()
    aborted = {d.attempt for d in sink.deltas if d.kind == "abort"}
    assert len(aborted) == 1 and output.attempt_id not in aborted
    assert output.replay_blocks == (THOUGHT,)  # the complete attempt's block, signed
    # every attempt cut: the call fails; no partial output exists to be replayed
    fake = api.FakeMessagesAPI([Reply(events=events, cut_after=6)] * 3)
    with FaultServer(rule=fake) as server:
        model = model_for(server, stream=True)
        with pytest.raises(ModelUnanswered):
            await model.complete(first_request(), turn_id="t", step=0)
        await model.aclose()


async def test_c06_a_refused_signature_is_not_sent_again_the_call_goes_on_without_thinking():
    edited = dict(THOUGHT, thinking=THOUGHT["thinking"].rstrip("\n"))  # re-serialised: trailing newline lost
    history = AssistantMessage(
        provider="anthropic",
        model=MODEL,
        replay_blocks=(edited,),
        tool_calls=(ToolCall(id=TOOL_USE["id"], name="get_weather", arguments='{"location":"Paris"}'),),
    )
    request = ChatRequest(
        system="You answer weather questions.",
        tools=(WEATHER,),
        max_output_tokens=1024,
        messages=(
            UserMessage(text="What's the weather in Paris?"),
            history,
            ToolResultMessage(call_id=TOOL_USE["id"], name="get_weather", text="18C"),
        ),
    )
    fake = api.FakeMessagesAPI([Reply(body=RECORDED_RESPONSE_2)])
    with FaultServer(rule=fake) as server:
        model = model_for(server)
        output = await model.complete(request, turn_id="t", step=1)
        await model.aclose()
    assert output.content.startswith("It is 18°C")
    assert len(server.requests) == 2 and server.requests[0].raw != server.requests[1].raw
    assert "Invalid `signature`" in fake.refusals[0]
    fallback = server.requests[1].json
    assert "thinking" not in fallback and all(
        b["type"] != "thinking" for m in fallback["messages"] for b in m["content"]
    )


async def test_other_refusals_and_errors():
    bad = api.error("invalid_request_error", "messages: too long")
    with FaultServer([Reply(status=400, body=bad)], repeat_last=True) as server:
        model = model_for(server)
        with pytest.raises(ModelInputRejected, match="too long"):
            await model.complete(first_request(), turn_id="t", step=0)
        await model.aclose()
    assert len(server.requests) == 1  # no blind retry, no fallback (not a signature problem)
    overloaded = api.error("overloaded_error", "Overloaded")
    in_stream = api.stream_events(MODEL, [{"type": "text", "text": "Hi"}])[:3] + [("error", overloaded)]
    fake = api.FakeMessagesAPI(
        [
            Reply(status=529, body=overloaded),
            Reply(events=in_stream),
            Reply(events=api.stream_events(MODEL, [{"type": "text", "text": "Hello"}])),
        ]
    )
    with FaultServer(rule=fake) as server:
        model = model_for(server, stream=True)
        assert (await model.complete(first_request(), turn_id="t", step=0)).content == "Hello"
        await model.aclose()
    assert len(server.requests) == 3
    with FaultServer(rule=api.FakeMessagesAPI([])) as server:
        model = model_for(server, key="sk-ant-wrong")
        with pytest.raises(ModelConfigError):
            await model.complete(first_request(), turn_id="t", step=0)
        await model.aclose()


async def test_c14_an_anthropic_refusal_is_a_refusal():
    fake = api.FakeMessagesAPI([Reply(body=api.message(MODEL, [], "refusal"))])
    with FaultServer(rule=fake) as server:
        model = model_for(server, budget=None)
        output = await model.complete(first_request(), turn_id="t", step=0)
        await model.aclose()
    assert output.stop_reason == "refusal"
