"""Compaction boundaries, the summary in the system message, and the summary calls."""

from __future__ import annotations

import pytest

from agentstream.context import (
    BRACKETS,
    Compact,
    ContextConfig,
    ContextPolicy,
    Share,
    Tokens,
    UserMessage,
    build_context,
    compaction_event,
    rounds,
    summary_request,
    turns,
)
from agentstream.context.builder import new_state, settings_of
from agentstream.context.compaction import kept_from_index
from agentstream.errors import CompactionError
from agentstream.wire.events import Compaction, Document
from tests.unit.context.factory import Trace, make_agent


def compacting_agent(window: int = 4_000, **compact_kwargs):
    compact_kwargs.setdefault("summary_output", Tokens(500))
    policy = ContextPolicy(output_reserve=Tokens(200), compact=Compact(**compact_kwargs), min_gain=None)
    return make_agent(window=window, config=ContextConfig(policy=policy, citations=BRACKETS))


def test_the_kept_part_starts_on_a_turn_and_never_after_the_running_one():
    compact = Compact()
    assert kept_from_index(compact, 5) == 4  # turns[:-2] of 6 turns: 0..3 replaced
    assert kept_from_index(compact, 0) == 0
    assert kept_from_index(Compact(where=turns[1:]), 5) == 0  # not a run from the oldest
    assert kept_from_index(Compact(where=turns[:]), 3) == 3  # the running turn is kept
    with pytest.raises(ValueError):
        Compact(where=rounds[:-2])


def test_a_compaction_shows_its_summary_in_the_system_message_in_place_of_the_replaced_turns():
    trace = Trace()
    first = trace.tool_turn(
        "first question", ["first result"], "first answer", elements=(Document(id="d1", text="one"),)
    )
    second = trace.tool_turn(
        "second question", ["second result"], "second answer", elements=(Document(id="d2", text="two"),)
    )
    third = trace.user("third question")
    trace.events.append(
        Compaction(turn_id=third, summary="They asked <two> things.", kept_from_turn=second, replaced_turns=1)
    )
    built = build_context(trace.events, compacting_agent(window=100_000), turn_id=third, step=0)
    request = built.request
    assert request.system.startswith("You are a test agent.\n\n<conversation_summary>")
    assert "They asked &lt;two&gt; things." in request.system
    assert isinstance(request.messages[0], UserMessage) and request.messages[0].text == "second question"
    assert 'id="2"' in request.messages[2].text  # numbers stay those of the whole trace
    assert not any("first" in getattr(m, "text", "") for m in request.messages)
    assert "reopen" in [t.name for t in request.tools]
    _ = first


def test_a_compaction_never_hides_the_turn_being_answered():
    trace = Trace()
    first = trace.user("only question")
    trace.events.append(Compaction(turn_id=first, summary="s", kept_from_turn="a-later-turn"))
    trace.events.append(Compaction(turn_id=first, summary="s", kept_from_turn=first))
    request = build_context(trace.events, compacting_agent(), turn_id=first, step=0).request
    assert request.messages[0].text == "only question" and "conversation_summary" not in request.system


LONG = " and more" * 80


def long_conversation(count: int, question: str = "") -> tuple[Trace, str]:
    trace = Trace()
    for index in range(count):
        trace.tool_turn(f"question {index}{question}", ["rows " * 300], f"answer {index}")
    return trace, trace.user("newest question")


def test_a_compaction_is_due_over_its_threshold_and_replaces_all_but_the_last_two_turns():
    trace, last = long_conversation(8, question=LONG)
    agent = compacting_agent(window=3_500)
    built = build_context(trace.events, agent, turn_id=last, step=0)
    plan = built.compaction
    assert plan is not None and plan.kept_from_turn == "t8" and plan.new_turns == tuple(f"t{i}" for i in range(1, 8))
    assert plan.previous_summary is None and sum(len(c) for c in plan.chunks) == 7
    state = new_state(trace.events, agent, *settings_of(agent))
    first_call = summary_request(state, plan, 0, None)
    assert first_call.tools == () and first_call.messages[0].text.startswith("question 0")
    assert first_call.messages[-1].text.startswith(Compact().instructions) and "[1]" in first_call.messages[-1].text
    event = compaction_event(plan, "  the summary  ", model="m")
    assert event.kept_from_turn == "t8" and event.summary == "the summary" and event.replaced_turns == 7
    with pytest.raises(CompactionError):
        compaction_event(plan, "   ")
    trace.events.append(event)
    after = build_context(trace.events, agent, turn_id=last, step=0)
    assert after.size_tokens < built.size_tokens and after.request.messages[0].text.startswith("question 7")


def test_a_second_compaction_folds_the_first_and_a_compaction_that_replaces_nothing_is_not_planned():
    trace, last = long_conversation(8, question=LONG)
    agent = compacting_agent(window=3_500)
    plan = build_context(trace.events, agent, turn_id=last, step=0).compaction
    trace.events.append(compaction_event(plan, "first summary"))
    again = build_context(trace.events, agent, turn_id=last, step=0)
    assert again.compaction is None  # nothing new to replace: no compaction loop
    trace.answer(last, "answer")
    trace.end(last)
    for index in range(8):
        trace.tool_turn(f"more {index}{LONG}", ["rows " * 300], "ok")
    newest = trace.user("the very newest")
    built = build_context(trace.events, agent, turn_id=newest, step=0)
    plan = built.compaction
    assert plan is not None and plan.previous_summary == "first summary"
    state = new_state(trace.events, agent, *settings_of(agent))
    request = summary_request(state, plan, 0, plan.previous_summary)
    assert "first summary" in request.system and request.messages[0].text.startswith("question 7")
    trace.events.append(compaction_event(plan, "second summary"))
    system = build_context(trace.events, agent, turn_id=newest, step=0).request.system
    assert "second summary" in system and "first summary" not in system


def test_summary_calls_fit_the_window_by_shortening_results_and_chunking():
    trace, last = long_conversation(30, question=LONG)
    agent = compacting_agent(window=5_000, summary_output=Tokens(500), when=Share(0.5))
    built = build_context(trace.events, agent, turn_id=last, step=0)
    plan = built.compaction
    assert plan is not None and len(plan.chunks) > 1
    state = new_state(trace.events, agent, *settings_of(agent))
    limits = state.limits
    from agentstream.context import estimate_tokens

    summary = None
    for index in range(len(plan.chunks)):
        request = summary_request(state, plan, index, summary)
        assert estimate_tokens(request, limits) + request.max_output_tokens <= limits.window.count
        assert isinstance(request.messages[0], UserMessage) and len(request.messages) > 1
        summary = "s" * 1500
