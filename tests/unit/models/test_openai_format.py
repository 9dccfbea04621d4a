"""The OpenAI chat-completions format: streamed assembly, stop reasons, quirks, reasoning replay."""

from __future__ import annotations

import json

import pytest

from agentstream.context.request import AssistantMessage, ChatRequest, ToolDefinition, ToolResultMessage, UserMessage
from agentstream.errors import ModelStopError
from agentstream.models import openai_format
from agentstream.models.endpoints import Quirks
from agentstream.wire.events import ModelOutput, ToolCall

TOOL = ToolDefinition(
    name="get_weather",
    description="Weather.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def assemble(chunks, **kw):
    assembler = openai_format.StreamAssembler()
    pieces = []
    for c in chunks:
        pieces += assembler.feed(c)
    return assembler, pieces, assembler.output(turn_id="t", step=0, model="m", request_sha256="h", latency_ms=1.0, **kw)


def test_c11_parallel_tool_call_deltas_are_assembled_per_index():
    # C11: the exact deltas of the field case; B's arguments must not run into A's.
    deltas = [
        {
            "tool_calls": [
                {"index": 0, "id": "call_A", "type": "function", "function": {"name": "search", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"q":"alpha"}'}}]},
        {
            "tool_calls": [
                {"index": 1, "id": "call_B", "type": "function", "function": {"name": "search", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"q":"beta"}'}}]},
    ]
    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    assembler, pieces, out = assemble(chunks)
    assert assembler.finished
    assert out.tool_calls == (
        ToolCall(id="call_A", name="search", arguments='{"q":"alpha"}'),
        ToolCall(id="call_B", name="search", arguments='{"q":"beta"}'),
    )
    assert all(json.loads(c.arguments) for c in out.tool_calls)
    assert [(p.index, p.call_id, p.text) for p in pieces if p.call_id] == [(0, "call_A", ""), (1, "call_B", "")]


def test_stream_without_indexes_is_matched_by_id_and_a_repeated_name_is_kept_once():
    # llama.cpp repeats id and name in every piece; some servers send no index at all.
    chunks = [
        {"choices": [{"delta": {"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "c2", "function": {"name": "g", "arguments": "{}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    _, _, out = assemble(chunks)
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [("c1", "f", '{"a": 1}'), ("c2", "g", "{}")]


def test_stream_text_reasoning_refusal_and_usage():
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Think. "}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ]
    _, pieces, out = assemble(chunks)
    assert out.content == "Hello" and out.reasoning == "Think. " and out.usage.total_tokens == 7
    assert [(p.kind, p.text) for p in pieces] == [("reasoning", "Think. "), ("text", "Hel"), ("text", "lo")]
    refused, _, out = assemble(
        [
            {"choices": [{"delta": {"refusal": "I can't "}}]},
            {"choices": [{"delta": {"refusal": "help."}, "finish_reason": "stop"}]},
        ]
    )
    assert out.stop_reason == "refusal" and out.stop_detail == "I can't help."


def test_a_stream_without_finish_or_done_is_not_finished():
    assembler, _, _ = assemble([{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}])
    assert not assembler.finished


def test_a_stream_ended_by_done_alone_is_interrupted_not_a_normal_stop():
    # llama.cpp's interrupt_requests: a role chunk, then [DONE], no finish reason (C14: not success).
    for chunks in (
        [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}],
        [{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}],
        [
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]
                        },
                    }
                ]
            }
        ],
    ):
        assembler = openai_format.StreamAssembler()
        for c in chunks:
            assembler.feed(c)
        assembler.mark_done()
        assert not assembler.finished
        out = assembler.output(turn_id="t", step=0, model="m", request_sha256="h", latency_ms=1.0)
        assert out.stop_reason == "interrupted" and "no finish reason" in out.stop_detail
        with pytest.raises(ModelStopError):
            out.raise_for_stop()


def parse(message, finish="stop", usage=None, max_output_tokens=None):
    return openai_format.parse_response(
        {"choices": [{"message": message, "finish_reason": finish}], "usage": usage or {}},
        turn_id="t",
        step=0,
        request_sha256="h",
        latency_ms=1.0,
        model="m",
        max_output_tokens=max_output_tokens,
    )


def test_c12_cut_off_tool_calls_are_length_even_when_labelled_tool_calls():
    cut = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "write_file", "arguments": '{"path":"a.txt","content":"hello wor'},
        }
    ]
    a = parse({"tool_calls": cut}, "length", {"completion_tokens": 300}, max_output_tokens=300)
    assert a.stop_reason == "length"
    b = parse({"tool_calls": cut}, "tool_calls", {"completion_tokens": 300}, max_output_tokens=300)
    assert b.stop_reason == "length" and "whole output budget" in b.stop_detail
    # C: empty-string arguments of a tool without parameters are a normal call
    c = parse(
        {"tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
        "tool_calls",
        {"completion_tokens": 12},
        max_output_tokens=300,
    )
    assert c.stop_reason == "tool_calls" and c.tool_calls[0].arguments == ""


def test_c14_stop_reasons_and_raise_for_stop():
    assert parse({"content": None}, "content_filter").stop_reason == "content_filter"
    refused = parse({"content": None, "refusal": "I can't help with that."})
    assert refused.stop_reason == "refusal" and refused.stop_detail == "I can't help with that."
    odd = parse({"content": "x"}, "eos_token")
    assert odd.stop_reason == "unknown" and odd.stop_detail == "eos_token"
    for output in (refused, odd, parse({"content": "x"}, "length")):
        with pytest.raises(ModelStopError) as info:
            output.raise_for_stop()
        assert info.value.stop_reason == output.stop_reason and info.value.turn_id == "t"
    fine = parse({"content": "x"})
    assert fine.raise_for_stop() is fine


def request_with_history(reasoning_provider="openai", reasoning_model="deepseek"):
    return ChatRequest(
        system="S",
        messages=(
            UserMessage(text="Weather in Oslo?"),
            AssistantMessage(
                content="",
                reasoning="Need the weather tool.",
                provider=reasoning_provider,
                model=reasoning_model,
                tool_calls=(ToolCall(id="call_1", name="get_weather", arguments='{"city":"Oslo"}'),),
            ),
            ToolResultMessage(call_id="call_1", name="get_weather", text="-3C"),
        ),
        tools=(TOOL,),
    )


def test_c10_reasoning_goes_back_where_the_context_put_it_in_the_endpoints_field():
    # the context policy is the one switch: a message that carries reasoning (the policy kept it)
    # sends it back to the model that wrote it, in the field the endpoint names
    request = request_with_history()
    msgs = json.loads(openai_format.request_body(request, model="deepseek"))["messages"]
    assert msgs[2] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Need the weather tool.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
        ],
    }
    other_model = json.loads(openai_format.request_body(request, model="gpt-x"))["messages"]
    assert "reasoning_content" not in other_model[2]  # only to the model that wrote it
    other_field = json.loads(
        openai_format.request_body(request, model="deepseek", quirks=Quirks(reasoning_field="reasoning"))
    )
    assert other_field["messages"][2]["reasoning"] == "Need the weather tool."
    # the policy left it out: nothing goes back, whatever the endpoint
    plain = AssistantMessage(content="", provider="openai", model="deepseek", tool_calls=request.messages[1].tool_calls)
    bare = ChatRequest(system="S", messages=(request.messages[0], plain, request.messages[2]))
    assert "reasoning_content" not in json.loads(openai_format.request_body(bare, model="deepseek"))["messages"][2]


def test_quirks_shape_the_body():
    request = ChatRequest(system="S", messages=(UserMessage(text="hi"),), tools=(TOOL,), tool_choice="required")
    assert json.loads(openai_format.request_body(request, model="m"))["tool_choice"] == "required"
    named = json.loads(openai_format.request_body(request, model="m", quirks=Quirks(required_tool_choice="named")))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    two = ChatRequest(
        system="S",
        messages=(UserMessage(text="hi"),),
        tools=(TOOL, ToolDefinition(name="b", description="", parameters={})),
        tool_choice="required",
    )
    assert (
        json.loads(openai_format.request_body(two, model="m", quirks=Quirks(required_tool_choice="named")))[
            "tool_choice"
        ]
        == "auto"
    )
    history = request_with_history()
    # the default is what the OpenAI API documents: null beside tool calls ("" is llama.cpp's quirk)
    assert json.loads(openai_format.request_body(history, model="m"))["messages"][2]["content"] is None
    for mode, expected in (("empty", ""), ("null", None)):
        assert (
            json.loads(openai_format.request_body(history, model="m", quirks=Quirks(tool_call_content=mode)))[
                "messages"
            ][2]["content"]
            == expected
        )
    assert (
        "content"
        not in json.loads(openai_format.request_body(history, model="m", quirks=Quirks(tool_call_content="omit")))[
            "messages"
        ][2]
    )
    body = json.loads(
        openai_format.request_body(
            history, model="m", quirks=Quirks(max_tokens_field="max_completion_tokens"), stream=True
        )
    )
    assert "max_tokens" not in body and body["max_completion_tokens"] == 512
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    # streaming decisions: llama.cpp streams tool calls only when one tool is forced by name
    forced = Quirks(stream_tools="forced", required_tool_choice="named")
    assert openai_format.streams(request, stream=True, quirks=forced)
    assert not openai_format.streams(two, stream=True, quirks=forced)
    assert openai_format.streams(
        ChatRequest(system="S", messages=(UserMessage(text="hi"),)), stream=True, quirks=forced
    )
    assert not openai_format.streams(request, stream=False)


def test_c11_stored_unparseable_arguments_replay_verbatim():
    bad = '{"q":"alpha"}{"q":"beta"}'
    request = ChatRequest(
        system="S",
        messages=(
            UserMessage(text="go"),
            AssistantMessage(tool_calls=(ToolCall(id="c1", name="search", arguments=bad),)),
            ToolResultMessage(call_id="c1", name="search", text="Error: invalid arguments", is_error=True),
        ),
    )
    body = openai_format.request_body(request, model="m")
    assert json.loads(body)["messages"][2]["tool_calls"][0]["function"]["arguments"] == bad
    assert body == openai_format.request_body(request, model="m")  # deterministic


def test_extra_body_and_generation_options_come_in_the_documented_order():
    request = ChatRequest(system="", messages=(UserMessage(text="hi"),))
    body = json.loads(
        openai_format.request_body(
            request, model="m", extra_body={"top_p": 0.5}, seed=3, response_format={"type": "json_object"}
        )
    )
    assert list(body) == ["top_p", "model", "messages", "temperature", "max_tokens", "seed", "response_format"]
    assert body["messages"] == [{"role": "user", "content": "hi"}]  # no empty system message


def test_model_output_of_old_traces_still_decodes():
    from agentstream.wire import codec

    old = b'{"type":"model_output","turn_id":"t","step":0,"content":"x"}'
    event = codec.decode_entry({b"v": b"1", b"e": old})
    assert isinstance(event, ModelOutput) and event.attempt_id == "" and event.endpoint == ""


def _chunks(*tool_call_pieces, finish="tool_calls"):
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [p]}, "finish_reason": None}]} for p in tool_call_pieces
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return chunks


def test_two_streamed_calls_under_one_index_with_their_own_ids_stay_two_calls():
    # Ollama numbers every streamed call index 0; each call has its own id
    chunks = _chunks(
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":'}},
        {"index": 0, "function": {"arguments": ' "Oslo"}'}},
        {"index": 0, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{"}},
        {"index": 0, "function": {"arguments": '"zone": "CET"}'}},
    )
    _, pieces, out = assemble(chunks)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("call_a", "get_weather", {"city": "Oslo"}),
        ("call_b", "get_time", {"zone": "CET"}),
    ]
    # the published pieces name each call by its own position
    assert [(p.index, p.call_id, p.name) for p in pieces if p.call_id] == [
        (0, "call_a", "get_weather"),
        (1, "call_b", "get_time"),
    ]
    assert [(p.index, p.text) for p in pieces if not p.call_id] == [(0, ' "Oslo"}'), (1, '"zone": "CET"}')]


def test_a_new_name_after_whole_arguments_starts_a_new_call_where_ids_are_absent():
    chunks = _chunks(
        {"index": 0, "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"index": 0, "function": {"name": "get_weather", "arguments": '{"city": '}},
        {"index": 0, "function": {"arguments": '"Bergen"}'}},
    )
    _, _, out = assemble(chunks)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Bergen"}),
    ]
    assert len({c.id for c in out.tool_calls}) == 2


def test_without_ids_the_index_still_separates_calls_and_a_repeated_bare_name_is_kept_once():
    chunks = _chunks(
        {"index": 0, "function": {"name": "f", "arguments": '{"a": '}},
        {"index": 1, "function": {"name": "g", "arguments": "{}"}},
        {"index": 0, "function": {"name": "f", "arguments": "1}"}},  # a name repeated mid-arguments
        {"index": 0, "function": {"name": "f"}},  # repeated after whole arguments, nothing new
    )
    _, _, out = assemble(chunks)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("f", '{"a": 1}'), ("g", "{}")]


def test_an_id_sent_after_the_first_piece_joins_the_call_it_belongs_to():
    chunks = _chunks(
        {"index": 0, "function": {"name": "f", "arguments": '{"a"'}},
        {"index": 0, "id": "call_late", "function": {"arguments": ": 1}"}},
    )
    _, _, out = assemble(chunks)
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [("call_late", "f", '{"a": 1}')]


@pytest.mark.parametrize("numbering", ["per_call", "all_zero", "none"])
@pytest.mark.parametrize("split", [1, 3, 7])
def test_parallel_calls_assemble_whatever_the_index_numbering_and_the_piece_size(numbering, split):
    calls = [("call_1", "search", '{"q": "alpha"}'), ("call_2", "search", '{"q": "beta"}'), ("call_3", "calc", "{}")]
    pieces = []
    for position, (call_id, name, arguments) in enumerate(calls):
        parts = [arguments[i : i + split] for i in range(0, len(arguments), split)]
        for number, part in enumerate(parts):
            piece = {"function": {"arguments": part}}
            if number == 0:
                piece = {"id": call_id, "type": "function", "function": {"name": name, "arguments": part}}
            if numbering != "none":
                piece["index"] = position if numbering == "per_call" else 0
            pieces.append(piece)
    _, _, out = assemble(_chunks(*pieces))
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == calls


# --- the peer's cases (openai-agents-python's converter and stream tests), decided -------------


def test_an_empty_tool_result_is_sent_as_a_placeholder_not_an_empty_tool_message():
    request = ChatRequest(
        system="",
        messages=(
            UserMessage(text="run it"),
            AssistantMessage(tool_calls=(ToolCall(id="c1", name="get_weather", arguments="{}"),)),
            ToolResultMessage(call_id="c1", name="get_weather", text=""),
        ),
        tools=(TOOL,),
    )
    sent = openai_format.message_dicts(request, model="m")
    assert sent[-1] == {"role": "tool", "tool_call_id": "c1", "content": openai_format.EMPTY_TOOL_RESULT}
    restated = openai_format.message_dicts(request, model="m", quirks=Quirks(tool_results_as_user=True))
    assert restated[-1]["content"].startswith(f"Result of get_weather: {openai_format.EMPTY_TOOL_RESULT}")


def test_an_audio_only_reply_is_its_transcript_and_says_so():
    message = {
        "role": "assistant",
        "content": None,
        "audio": {"id": "audio_1", "data": "UklGRg==", "expires_at": 1733500000, "transcript": "It is sunny."},
    }
    out = openai_format.parse_response(
        {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]},
        turn_id="t",
        step=0,
        request_sha256="h",
        latency_ms=1.0,
        model="m",
    )
    assert out.content == "It is sunny." and out.stop_reason == "stop"
    assert out.stop_detail == openai_format.AUDIO_NOTE
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "audio": {"id": "audio_1", "transcript": "It is "}}}]},
        {"choices": [{"index": 0, "delta": {"audio": {"data": "UklGRg==", "transcript": "sunny."}}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    _, pieces, streamed = assemble(chunks)
    assert streamed.content == "It is sunny." and streamed.stop_detail == openai_format.AUDIO_NOTE
    assert [p.text for p in pieces] == ["It is ", "sunny."]


def test_a_custom_tool_call_is_refused_with_the_reason_not_run_under_an_empty_name():
    custom = {"id": "call_c", "type": "custom", "custom": {"name": "shell", "input": "ls -la"}}
    payload = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "tool_calls": [custom]}, "finish_reason": "tool_calls"}
        ]
    }
    with pytest.raises(ValueError, match="type 'custom' \\(tool 'shell'\\).*only function tools"):
        openai_format.parse_response(payload, turn_id="t", step=0, request_sha256="h", latency_ms=1.0, model="m")
    with pytest.raises(ValueError, match="type 'custom'"):
        assemble([{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **custom}]}}]}])


def test_whole_arguments_sent_again_or_sent_cumulatively_are_kept_once():
    again = _chunks(
        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a": '}},
        {"index": 0, "function": {"arguments": "1}"}},
        {"index": 0, "function": {"arguments": '{"a": 1}'}},  # the whole arguments once more, at the end
    )
    _, pieces, out = assemble(again)
    assert [(c.id, c.arguments) for c in out.tool_calls] == [("c1", '{"a": 1}')]
    assert "".join(p.text for p in pieces if p.kind == "tool_call") == '{"a": 1}'
    cumulative = _chunks(
        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}},
        {"index": 0, "function": {"arguments": '{"a": 1, "b"'}},
        {"index": 0, "function": {"arguments": '{"a": 1, "b": 2}'}},
    )
    _, pieces, out = assemble(cumulative)
    assert [c.arguments for c in out.tool_calls] == ['{"a": 1, "b": 2}']
    assert "".join(p.text for p in pieces if p.kind == "tool_call") == '{"a": 1, "b": 2}'
