import json

from agentstream.context import build_request
from agentstream.declarations.agents import Agent
from agentstream.declarations.tools import tool
from agentstream.models import openai_format
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnInput


@tool
def f(x: int) -> int:
    """F."""
    return x


def parse(message, finish="stop", **kw):
    return openai_format.parse_response(
        {"choices": [{"message": message, "finish_reason": finish}], "model": "m", **kw},
        turn_id="t",
        step=2,
        request_sha256="h",
        latency_ms=1.0,
        model="m",
    )


def test_tool_calls_keep_raw_arguments_and_get_ids():
    out = parse(
        {
            "content": None,
            "tool_calls": [
                {"function": {"name": "f", "arguments": '{"x": 1}{"x": 2}'}},
                {"id": "c9", "function": {"name": "f", "arguments": {"x": 3}}},
            ],
        },
        finish="tool_calls",
    )
    assert out.tool_calls[0] == ToolCall(id="call_t_2_0", name="f", arguments='{"x": 1}{"x": 2}')
    assert out.tool_calls[1].arguments == '{"x":3}'
    assert out.stop_reason == "tool_calls" and out.content == ""


def test_stop_reasons():
    assert parse({"content": "x"}, "length").stop_reason == "length"
    assert parse({"content": None}, "content_filter").stop_reason == "content_filter"
    refused = parse({"content": None, "refusal": "I can't help with that."})
    assert refused.stop_reason == "refusal" and refused.stop_detail == "I can't help with that."
    odd = parse({"content": "x"}, "weird_reason")
    assert odd.stop_reason == "unknown" and odd.stop_detail == "weird_reason"


def test_body_is_deterministic_and_replays_arguments_verbatim():
    agent = Agent(name="a", system_prompt="S", tools=[f], max_passes=3)
    bad = '{"x": 1}{"x": 2}'  # C11: a stored unparseable string replays as the same string
    events = [
        TurnInput(turn_id="t", agent="a", text="go"),
        ModelOutput(turn_id="t", step=0, tool_calls=(ToolCall(id="c1", name="f", arguments=bad),)),
        ToolOutput(turn_id="t", call_id="c1", name="f", text="Error: invalid arguments", error="invalid_arguments"),
    ]
    body = openai_format.request_body(build_request(events, agent, turn_id="t", step=1), model="m")
    again = openai_format.request_body(build_request(list(events), agent, turn_id="t", step=1), model="m")
    assert body == again
    doc = json.loads(body)
    assert doc["messages"][0] == {"role": "system", "content": "S"}
    assistant = doc["messages"][2]
    assert assistant["content"] is None and assistant["tool_calls"][0]["function"]["arguments"] == bad
    assert doc["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "Error: invalid arguments"}
    assert doc["tool_choice"] == "auto" and doc["tools"][0]["function"]["name"] == "f"
    # past the passes cap (tool-calling calls counted) and its extra rounds, the model must answer
    capped = Agent(name="a", system_prompt="S", tools=[f], max_passes=1, tool_rounds_after_cap=0)
    last = json.loads(openai_format.request_body(build_request(events, capped, turn_id="t", step=1), model="m"))
    assert "tools" not in last and "tool_choice" not in last


def test_tool_results_restated_as_a_user_message_for_servers_that_drop_tool_messages():
    from agentstream.models.endpoints import Quirks

    agent = Agent(name="a", system_prompt="S", tools=[f], max_passes=3)
    events = [
        TurnInput(turn_id="t", agent="a", text="go"),
        ModelOutput(
            turn_id="t",
            step=0,
            tool_calls=(
                ToolCall(id="c1", name="f", arguments='{"x":1}'),
                ToolCall(id="c2", name="f", arguments='{"x":2}'),
            ),
        ),
        ToolOutput(turn_id="t", call_id="c2", name="f", text="2"),
        ToolOutput(turn_id="t", call_id="c1", name="f", text="1"),
    ]
    request = build_request(events, agent, turn_id="t", step=1)
    plain = json.loads(openai_format.request_body(request, model="m"))
    assert [m["role"] for m in plain["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    quirky = json.loads(openai_format.request_body(request, model="m", quirks=Quirks(tool_results_as_user=True)))
    assert [m["role"] for m in quirky["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert (
        quirky["messages"][-1]["content"]
        == "Result of f: 1\nResult of f: 2\nAnswer the question in one short sentence."
    )
