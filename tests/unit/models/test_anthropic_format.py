"""The Anthropic Messages format: field cases C06, C07, C08 and the documented request shape."""

from __future__ import annotations

import json

import msgspec

from agentstream.context.request import AssistantMessage, ChatRequest, ToolDefinition, ToolResultMessage, UserMessage
from agentstream.models import anthropic_format
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolCall
from tests.support import anthropic_api

A, B = "claude-a", "claude-b"
LOOKUP = ToolDefinition(
    name="lookup", description="Look up.", parameters={"type": "object", "properties": {"q": {"type": "string"}}}
)

# C06: the stored assistant turn; the trace event must hold exactly these blocks
C06_THINKING = {"type": "thinking", "thinking": "Plan: call lookup.\n", "signature": "SIG_A"}


def body(request: ChatRequest, model: str = A, budget: int | None = 2048, **kw) -> dict:
    raw = anthropic_format.request_body(request, model=model, thinking_budget_tokens=budget, **kw)
    return json.loads(raw)


def c06_request() -> ChatRequest:
    asst = AssistantMessage(
        provider="anthropic",
        model=A,
        replay_blocks=(C06_THINKING,),
        tool_calls=(ToolCall(id="toolu_1", name="lookup", arguments='{"q":"x"}'),),
    )
    return ChatRequest(
        system="S",
        messages=(UserMessage(text="find x"), asst, ToolResultMessage(call_id="toolu_1", name="lookup", text="42")),
        tools=(LOOKUP,),
    )


def test_c06_thinking_blocks_survive_the_trace_and_go_back_byte_identical():
    # the block survives the msgspec round trip of the trace event unchanged (mutation 3)
    output = ModelOutput(
        turn_id="t",
        step=0,
        provider="anthropic",
        model=A,
        replay_blocks=(C06_THINKING,),
        tool_calls=(ToolCall(id="toolu_1", name="lookup", arguments='{"q":"x"}'),),
    )
    stored = codec.decode_entry(codec.encode_entry(output))
    assert stored.replay_blocks == (C06_THINKING,)
    assert list(stored.replay_blocks[0]) == ["type", "thinking", "signature"]
    sent = body(c06_request())
    assert sent["system"] == "S" and all(m["role"] != "system" for m in sent["messages"])
    assistant = sent["messages"][1]
    # same text (trailing newline kept: mutation 1), same place: first, before tool_use (mutation 4)
    assert assistant == {
        "role": "assistant",
        "content": [C06_THINKING, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
    }
    assert sent["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}],
    }
    assert b'"thinking":"Plan: call lookup.\\n","signature":"SIG_A"' in anthropic_format.request_body(
        c06_request(), model=A, thinking_budget_tokens=2048
    )
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048} and "temperature" not in sent
    assert sent["max_tokens"] == 512 + 2048


def test_c06_two_consecutive_assistant_events_are_never_merged():
    # mutation 2: two assistant events stay two messages, each with its own thinking block
    t2 = {"type": "thinking", "thinking": "Second.", "signature": "SIG_A2"}
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="go"),
            AssistantMessage(content="first", provider="anthropic", model=A, replay_blocks=(C06_THINKING,)),
            UserMessage(text="more"),
            AssistantMessage(content="second", provider="anthropic", model=A, replay_blocks=(t2,)),
            UserMessage(text="again"),
        ),
    )
    msgs = body(request)["messages"]
    assistants = [m for m in msgs if m["role"] == "assistant"]
    assert [m["content"][0] for m in assistants] == [C06_THINKING, t2]
    assert all(len([b for b in m["content"] if b["type"] == "thinking"]) == 1 for m in assistants)


def test_c07_an_unsigned_thinking_block_is_never_replayed_and_no_empty_assistant_message():
    # the stored content of a turn whose stream broke mid-thinking; then the user says "continue"
    for broken in (
        {"type": "thinking", "thinking": "Let me check the file", "signature": ""},
        {"type": "thinking", "thinking": "Let me check the file"},
        {"type": "redacted_thinking", "data": ""},
    ):
        request = ChatRequest(
            system="S",
            messages=(
                UserMessage(text="read the file"),
                AssistantMessage(provider="anthropic", model=A, replay_blocks=(broken,)),
                UserMessage(text="continue"),
            ),
        )
        sent = body(request)
        assert sent["messages"] == [
            {
                "role": "user",
                "content": [{"type": "text", "text": "read the file"}, {"type": "text", "text": "continue"}],
            }
        ]
        assert (
            anthropic_api.validate(sent | {"model": A}, {"x-api-key": anthropic_api.API_KEY, "anthropic-version": "x"})
            is None
        )


def test_c08_provider_and_model_switch():
    sig_a = anthropic_api.thinking(A, "Plan: lookup.")
    sig_a2 = anthropic_api.thinking(A, "Done now.")
    history = (
        UserMessage(text="find x"),
        AssistantMessage(
            provider="anthropic",
            model=A,
            replay_blocks=(sig_a,),
            tool_calls=(ToolCall(id="toolu_1", name="lookup", arguments='{"q":"x"}'),),
        ),
        ToolResultMessage(call_id="toolu_1", name="lookup", text="42"),
        AssistantMessage(content="done", provider="anthropic", model=A, replay_blocks=(sig_a2,)),
        UserMessage(text="next"),
        AssistantMessage(content="ok", provider="openai", model="gpt-x", reasoning="short plan"),
        UserMessage(text="again"),
    )
    request = ChatRequest(system="S", messages=history, tools=(LOOKUP,))
    # turn 3 on claude-B: no thinking block at all, and gpt-X's reasoning never leaks in
    to_b = body(request, model=B)
    assert not [b for m in to_b["messages"] for b in m["content"] if b["type"] in ("thinking", "redacted_thinking")]
    assert "short plan" not in json.dumps(to_b)
    assert anthropic_api.validate(to_b, {"x-api-key": anthropic_api.API_KEY, "anthropic-version": "x"}) is None
    # turn 3' on claude-A again: exactly claude-A's blocks, verbatim
    to_a = body(request, model=A)
    blocks = [b for m in to_a["messages"] if m["role"] == "assistant" for b in m["content"] if b["type"] == "thinking"]
    assert blocks == [sig_a, sig_a2] and "short plan" not in json.dumps(to_a)
    assert anthropic_api.validate(to_a, {"x-api-key": anthropic_api.API_KEY, "anthropic-version": "x"}) is None


def test_c08_thinking_is_disabled_when_the_continued_tool_turn_has_no_replayable_thinking():
    # the tool call was made by another model: continuing it with thinking on would be refused
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="find x"),
            AssistantMessage(
                provider="openai",
                model="gpt-x",
                reasoning="r",
                tool_calls=(ToolCall(id="call_1", name="lookup", arguments='{"q":"x"}'),),
            ),
            ToolResultMessage(call_id="call_1", name="lookup", text="42"),
        ),
        tools=(LOOKUP,),
    )
    sent = body(request)
    assert "thinking" not in sent and sent["temperature"] == 0.0 and sent["max_tokens"] == 512
    assert anthropic_api.validate(sent, {"x-api-key": anthropic_api.API_KEY, "anthropic-version": "x"}) is None
    # forcing a tool turns thinking off too (the API does not allow both)
    forced = ChatRequest(system="S", messages=(UserMessage(text="go"),), tools=(LOOKUP,), tool_choice="required")
    assert "thinking" not in body(forced) and body(forced)["tool_choice"] == {"type": "any"}
    # the fallback body after a signature refusal carries no thinking block
    fallback = body(c06_request(), replay_thinking=False)
    assert "thinking" not in fallback and C06_THINKING not in fallback["messages"][1]["content"]


def test_all_results_of_one_assistant_turn_in_one_user_message_in_call_order_before_text():
    calls = (
        ToolCall(id="call_A", name="lookup", arguments='{"q":"A"}'),
        ToolCall(id="call.B/2", name="lookup", arguments=""),
    )
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="compare"),
            AssistantMessage(content="Looking both up.", tool_calls=calls),
            ToolResultMessage(call_id="call_A", name="lookup", text="A=1"),
            ToolResultMessage(call_id="call.B/2", name="lookup", text="boom", is_error=True),
            UserMessage(text="and C?"),
        ),
        tools=(LOOKUP,),
    )
    sent = body(request, budget=None)
    asst, user = sent["messages"][1], sent["messages"][2]
    assert asst["content"] == [
        {"type": "text", "text": "Looking both up."},
        {"type": "tool_use", "id": "call_A", "name": "lookup", "input": {"q": "A"}},
        {"type": "tool_use", "id": "call_B_2", "name": "lookup", "input": {}},  # empty arguments mean {}
    ]
    assert user == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_A", "content": "A=1"},
            {"type": "tool_result", "tool_use_id": "call_B_2", "content": "boom", "is_error": True},
            {"type": "text", "text": "and C?"},
        ],
    }
    assert (
        anthropic_api.validate(sent | {"model": A}, {"x-api-key": anthropic_api.API_KEY, "anthropic-version": "x"})
        is None
    )


def test_c11_unparseable_stored_arguments_become_a_note_object():
    bad = '{"q":"alpha"}{"q":"beta"}'
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="go"),
            AssistantMessage(tool_calls=(ToolCall(id="c1", name="lookup", arguments=bad),)),
            ToolResultMessage(call_id="c1", name="lookup", text="Error: invalid arguments", is_error=True),
        ),
    )
    tool_use = body(request, budget=None)["messages"][1]["content"][0]
    assert tool_use["input"] == {"invalid_arguments": bad}


def test_parse_a_documented_response_with_thinking_and_tool_use():
    payload = anthropic_api.message(
        A,
        [
            anthropic_api.thinking(A, "The user wants the weather."),
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {"type": "text", "text": "I'll check."},
            {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"location": "Paris", "unit": "c"}},
        ],
        "tool_use",
    )
    out = anthropic_format.parse_response(payload, turn_id="t", step=0, request_sha256="h", latency_ms=1.0, model=A)
    assert (
        out.stop_reason == "tool_calls"
        and out.content == "I'll check."
        and out.reasoning == "The user wants the weather."
    )
    assert out.tool_calls == (
        ToolCall(id="toolu_01A", name="get_weather", arguments='{"location":"Paris","unit":"c"}'),
    )
    assert out.replay_blocks == tuple(payload["content"][:2])
    assert out.usage.prompt_tokens == 120 and out.usage.completion_tokens == 48
    refused = anthropic_format.parse_response(
        anthropic_api.message(A, [], "refusal"), turn_id="t", step=0, request_sha256="h", latency_ms=1.0, model=A
    )
    assert refused.stop_reason == "refusal"  # C14 B_anthropic
    paused = anthropic_format.parse_response(
        anthropic_api.message(A, [{"type": "text", "text": "x"}], "pause_turn"),
        turn_id="t",
        step=0,
        request_sha256="h",
        latency_ms=1.0,
        model=A,
    )
    assert paused.stop_reason == "pause"


def test_the_stream_assembler_rebuilds_the_documented_message():
    content = [
        anthropic_api.thinking(A, "Plan: call lookup.\n"),
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"q": "x", "n": 2}},
    ]
    assembler = anthropic_format.StreamAssembler()
    pieces = []
    for _, event in anthropic_api.stream_events(A, content, "tool_use"):
        pieces += assembler.feed(event)
    assert assembler.finished
    out = assembler.output(turn_id="t", step=1, model=A, request_sha256="h", latency_ms=1.0)
    assert out.replay_blocks == (content[0],)  # text and signature exactly as the whole response has them
    assert out.tool_calls[0].arguments == '{"q":"x","n":2}' and out.content == "Let me look."
    assert "".join(p.text for p in pieces if p.kind == "reasoning") == "Plan: call lookup.\n"
    assert msgspec.json.decode(codec.encode(out)) is not None


def test_a_stream_cut_mid_thinking_leaves_an_unsigned_block_that_is_not_replayable():
    events = anthropic_api.stream_events(A, [anthropic_api.thinking(A, "Let me check the file")])
    cut = [e for _, e in events if not (e.get("delta", {}).get("type") == "signature_delta")][:5]
    assembler = anthropic_format.StreamAssembler()
    for event in cut:
        assembler.feed(event)
    assert not assembler.finished
    (block,) = assembler.blocks()
    assert block == {"type": "thinking", "thinking": "Let me check", "signature": ""}
    assert not anthropic_format.replayable(block)


def test_a_lone_surrogate_in_a_tool_input_is_kept_escaped_and_never_breaks_the_output_or_a_later_request():
    # json.loads turned "\ud800" into a string no writer can encode: the streamed output failed to
    # build on every delivery (the model called again each time), and a stored call with such an
    # escape made every later request of the conversation fail to encode
    lone = {"q": "a\ud800"}
    content = [{"type": "tool_use", "id": "toolu_7", "name": "lookup", "input": lone}]
    assembler = anthropic_format.StreamAssembler()
    for _, event in anthropic_api.stream_events(A, content, "tool_use"):
        assembler.feed(event)
    streamed = assembler.output(turn_id="t", step=0, model=A, request_sha256="h", latency_ms=1.0)
    whole = anthropic_format.parse_response(
        anthropic_api.message(A, content, "tool_use"), turn_id="t", step=0, request_sha256="h", latency_ms=1.0, model=A
    )
    for out in (streamed, whole):
        (call,) = out.tool_calls
        assert "\\ud800" in call.arguments and json.loads(call.arguments) == lone  # the escape, as the model wrote it
        assert codec.TraceCodec().unstorable(out) is None
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="go"),
            AssistantMessage(tool_calls=whole.tool_calls),
            ToolResultMessage(call_id="toolu_7", name="lookup", text="Error: not Unicode", is_error=True),
        ),
    )
    tool_use = body(request, budget=None)["messages"][1]["content"][0]
    assert tool_use["input"] == {"invalid_arguments": whole.tool_calls[0].arguments}
