"""The reopen tool: its result names what to show, the builder draws it from where it was recorded."""

from __future__ import annotations

import json

from agentstream.context import (
    BRACKETS,
    ContextConfig,
    ContextPolicy,
    Tokens,
    build_context,
    reopen_result,
)
from agentstream.steps.decision import RecordResults, decide
from agentstream.wire.codec import TraceCodec
from agentstream.wire.events import Document, ModelOutput, Passage, ToolCall
from tests.unit.context.factory import Trace, make_agent


def trace_with_sources() -> tuple[Trace, str]:
    trace = Trace()
    turn = trace.user("find it")
    (call,) = trace.calls(turn, ("search", "{}"))
    trace.result(
        turn,
        call,
        "two passages",
        elements=(
            Document(id="doc", title="Guide", text="whole " * 50),
            Passage(id="p1", ref="doc", text="the answer is 42"),
        ),
    )
    trace.answer(turn, "ok")
    trace.end(turn)
    return trace, trace.user("show me again")


AGENT = make_agent(window=100_000, config=ContextConfig(citations=BRACKETS))


def call_reopen(arguments: dict) -> ToolCall:
    return ToolCall(id="call_r", name="reopen", arguments=json.dumps(arguments))


def test_numbers_and_handles_become_real_ids():
    trace, turn = trace_with_sources()
    result = reopen_result(trace.events, AGENT, turn, call_reopen({"elements": [2], "results": ["r1"]}))
    assert result is not None and result.error is None
    assert result.data == {"reopened": {"elements": ["p1"], "results": ["call_1"]}}


def test_bad_arguments_give_an_error_result_the_model_can_act_on():
    trace, turn = trace_with_sources()
    for arguments, message in (
        ({"elements": [9]}, "unknown"),
        ({"results": ["r7"]}, "unknown"),
        ({}, "at least one"),
        ({"other": 1}, "only"),
    ):
        result = reopen_result(trace.events, AGENT, turn, call_reopen(arguments))
        assert result.error == "invalid_arguments" and message in result.text
    bad_json = ToolCall(id="x", name="reopen", arguments="{nope")
    assert "not valid JSON" in reopen_result(trace.events, AGENT, turn, bad_json).text
    # a lone surrogate escape in a handle: echoed into the error text, it made a result no trace could store
    lone = reopen_result(
        trace.events, AGENT, turn, ToolCall(id="z", name="reopen", arguments='{"results": ["r\\ud800"]}')
    )
    assert lone.error == "invalid_arguments" and "lone high UTF-16 surrogate" in lone.text
    assert TraceCodec().unstorable(lone) is None
    assert reopen_result(trace.events, AGENT, turn, ToolCall(id="y", name="search")) is None


def test_the_reopened_content_is_drawn_from_the_original_result_and_nested_in_its_whole():
    trace, turn = trace_with_sources()
    call = call_reopen({"elements": [2], "results": ["r1"]})
    trace.events.append(ModelOutput(turn_id=turn, step=0, tool_calls=(call,)))
    trace.events.append(reopen_result(trace.events, AGENT, turn, call))
    messages = build_context(trace.events, AGENT, turn_id=turn, step=1).request.messages
    shown = messages[-1].text
    assert (
        '<document id="1" cite="[1]" title="Guide">\n<passage id="2" cite="[2]">the answer is 42</passage>\n</document>'
        in shown
    )
    assert "[result r1 of search, shown again]" in shown and "whole whole" in shown


def test_the_agent_loop_records_a_reopen_call_instead_of_calling_it_unknown():
    trace, turn = trace_with_sources()
    trace.calls(turn, ("reopen", json.dumps({"results": ["r1"]})))
    decision = decide(trace.events, lambda name: AGENT)
    assert isinstance(decision, RecordResults) and decision.results[0].name == "reopen"
    assert decision.results[0].error is None


def test_reopen_is_offered_only_after_something_was_shortened_and_an_app_tool_of_that_name_wins():
    trace, turn = trace_with_sources()
    assert "reopen" not in [t.name for t in build_context(trace.events, AGENT, turn_id=turn, step=0).request.tools]
    no_reopen = make_agent(window=100_000, policy=ContextPolicy(reopen=None, output_reserve=Tokens(10)))
    assert reopen_result(trace.events, no_reopen, turn, call_reopen({"results": ["r1"]})) is None
