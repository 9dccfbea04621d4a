"""The builder: turn grouping, result pairing, selection, renderers, elements."""

from __future__ import annotations

import msgspec
import pytest

from agentstream.context import (
    BRACKETS,
    AssistantMessage,
    ContextConfig,
    ToolResultMessage,
    UserMessage,
    build_context,
    build_messages,
    build_request,
    only,
)
from agentstream.context.render import MISSING_RESULT_TEXT
from agentstream.errors import ContextError, UnrenderedEventError
from agentstream.wire.events import (
    Document,
    ModelOutput,
    Passage,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from tests.unit.context.factory import Trace, make_agent


def kinds(messages) -> list[str]:
    return [type(m).__name__.replace("Message", "").lower() for m in messages]


def test_results_follow_their_call_in_call_order_whatever_the_arrival_order():
    trace = Trace()
    turn = trace.user("compare")
    a, b = trace.calls(turn, ("search", "{}"), ("search", "{}"))
    trace.result(turn, b, "B")
    trace.result(turn, a, "A")
    messages = build_request(trace.events, make_agent(), turn_id=turn, step=1).messages
    assert kinds(messages) == ["user", "assistant", "toolresult", "toolresult"]
    assert [(m.call_id, m.text) for m in messages[2:]] == [(a, "A"), (b, "B")]


def test_first_result_per_call_wins_and_late_results_after_the_turn_ended_are_ignored():
    trace = Trace()
    turn = trace.user("run")
    first, second = trace.calls(turn, ("search", "{}"), ("search", "{}"))
    trace.result(turn, first, "first")
    trace.result(turn, first, "duplicate")
    trace.fail(turn)
    trace.result(turn, second, "too late")
    nxt = trace.user("Actually, just fix the typo.")
    messages = build_request(trace.events, make_agent(), turn_id=nxt, step=0).messages
    assert kinds(messages) == ["user", "assistant", "toolresult", "toolresult", "user"]
    assert messages[2].text == "first"
    assert messages[3].text == MISSING_RESULT_TEXT and messages[3].is_error
    assert messages[4].text == "Actually, just fix the typo."


def test_a_result_without_a_call_is_never_shown():
    trace = Trace()
    turn = trace.user("hi")
    trace.result(turn, "call_nobody", "orphan")
    trace.answer(turn, "hello")
    messages = build_request(trace.events, make_agent(), turn_id=turn, step=1).messages
    assert kinds(messages) == ["user", "assistant"]


def test_turns_show_in_input_order_and_a_queued_turn_is_not_shown():
    trace = Trace()
    first = trace.user("first")
    queued = trace.user("queued")
    trace.answer(first, "answer one")
    messages = build_request(trace.events, make_agent(), turn_id=first, step=1).messages
    assert [getattr(m, "text", getattr(m, "content", None)) for m in messages] == ["first", "answer one"]
    trace.end(first)
    messages = build_request(trace.events, make_agent(), turn_id=queued, step=0).messages
    assert [getattr(m, "text", getattr(m, "content", None)) for m in messages] == ["first", "answer one", "queued"]


def test_empty_replies_are_skipped_and_the_system_prompt_comes_first():
    trace = Trace()
    turn = trace.user("hi")
    trace.answer(turn, "   ")
    request = build_request(trace.events, make_agent(), turn_id=turn, step=1)
    assert request.system == "You are a test agent."
    assert kinds(request.messages) == ["user"]


def test_build_messages_keeps_its_simple_form():
    trace = Trace()
    trace.tool_turn("q", ["r"])
    assert kinds(build_messages(trace.events)) == ["user", "assistant", "toolresult", "assistant"]


class Note(msgspec.Struct, frozen=True, kw_only=True, tag="note"):
    turn_id: str
    text: str


class Secret(msgspec.Struct, frozen=True, kw_only=True, tag="secret"):
    turn_id: str


def test_an_app_event_renders_through_its_renderer_after_the_round_before_it():
    trace = Trace()
    turn = trace.user("hi")
    (call,) = trace.calls(turn, ("search", "{}"))
    trace.result(turn, call, "found")
    trace.events.append(Note(turn_id=turn, text="remember this"))
    config = ContextConfig(renderers={Note: lambda event, show: [UserMessage(text=f"note: {event.text}")]})
    messages = build_request(trace.events, make_agent(config=config), turn_id=turn, step=1).messages
    assert kinds(messages) == ["user", "assistant", "toolresult", "user"]
    assert messages[-1].text == "note: remember this"


def test_an_event_that_nothing_renders_raises():
    trace = Trace()
    turn = trace.user("hi")
    trace.events.append(Secret(turn_id=turn))
    with pytest.raises(UnrenderedEventError, match="Secret"):
        build_request(trace.events, make_agent(), turn_id=turn, step=0)


def test_a_renderer_may_not_return_tool_results():
    trace = Trace()
    turn = trace.user("hi")
    trace.events.append(Note(turn_id=turn, text="x"))
    bad = ContextConfig(renderers={Note: lambda e, show: [ToolResultMessage(call_id="c", name="n", text="x")]})
    with pytest.raises(ContextError):
        build_request(trace.events, make_agent(config=bad), turn_id=turn, step=0)


def test_selection_hides_events_and_never_renumbers_elements():
    trace = Trace()
    first = trace.user("first", elements=(Document(id="doc-a", text="A"),))
    trace.events.append(Secret(turn_id=first))
    trace.answer(first, "ok")
    trace.end(first)
    second = trace.user("second", elements=(Document(id="doc-b", text="B"),))
    hide_secrets = ContextConfig(
        select=only(TurnInput, ModelOutput, ToolOutput, TurnEnded, TurnFailed), citations=BRACKETS
    )
    messages = build_request(trace.events, make_agent(config=hide_secrets), turn_id=second, step=0).messages
    assert '<document id="2" cite="[2]">B</document>' in messages[-1].text
    # A selection that drops the first turn still numbers doc-b as 2.
    custom = ContextConfig(
        select=lambda events: [e for e in events if getattr(e, "turn_id", "") != first], citations=BRACKETS
    )
    messages = build_request(trace.events, make_agent(config=custom), turn_id=second, step=0).messages
    assert len(messages) == 1 and 'id="2"' in messages[0].text


def test_input_elements_show_before_the_text_with_parts_nested_in_their_whole():
    trace = Trace()
    turn = trace.user(
        "what does it say?",
        elements=(
            Document(id="d", title="Guide"),
            Passage(id="p2", ref="d", text="two"),
            Passage(id="p1", ref="d", text="one <b>"),
        ),
    )
    text = (
        build_request(trace.events, make_agent(config=ContextConfig(citations=BRACKETS)), turn_id=turn, step=0)
        .messages[0]
        .text
    )
    assert text == (
        '<document id="1" cite="[1]" title="Guide">\n'
        '<passage id="2" cite="[2]">two</passage>\n'
        '<passage id="3" cite="[3]">one &lt;b&gt;</passage>\n'
        "</document>\n\nwhat does it say?"
    )


def test_reasoning_is_replayed_only_as_the_policy_says():
    from agentstream.context import ALWAYS, CURRENT_TURN, ContextPolicy

    trace = Trace()
    first = trace.user("one")
    trace.answer(first, "a1", reasoning="think 1")
    trace.end(first)
    second = trace.user("two")
    trace.calls(second, ("search", "{}"), reasoning="think 2")
    trace.result(second, "call_1", "r")

    def reasoning(mode):
        agent = make_agent(window=100_000, policy=ContextPolicy(reasoning=mode))
        messages = build_request(trace.events, agent, turn_id=second, step=1).messages
        return [m.reasoning for m in messages if isinstance(m, AssistantMessage)]

    assert reasoning(ContextPolicy().reasoning) == [None, None]
    assert reasoning(CURRENT_TURN) == [None, "think 2"]
    assert reasoning(ALWAYS) == ["think 1", "think 2"]


def test_a_turn_id_not_in_the_trace_shows_every_turn_and_an_empty_trace_builds():
    assert build_context([], make_agent(), turn_id="nope", step=0).request.messages == ()
    trace = Trace()
    trace.user("hi")
    assert len(build_request(trace.events, make_agent(), turn_id="nope", step=0).messages) == 1
