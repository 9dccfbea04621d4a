"""Before each model call: send it, have a summary written first, or end the turn (pure)."""

from __future__ import annotations

import pytest

from agentstream.context import (
    AssistantMessage,
    Compact,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Share,
    Tokens,
    ToolResultMessage,
    UserMessage,
    build_context,
    compaction_event,
    settings_of,
    summary_request,
    turns,
)
from agentstream.context.builder import new_state
from agentstream.errors import CompactionError, ContextFullError
from agentstream.steps.summarising import (
    COMPACTION_ERROR,
    CONTEXT_FULL,
    SUMMARY_FAILED,
    Send,
    Summarise,
    failure_code,
    next_call,
    outcome_of,
    sent_request,
)
from agentstream.wire.events import CompactionFailed, ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnInput
from tests.support.compaction_apps import chatty, turn_text


def conversation(*sizes: int) -> list:
    """Ended turns t1.. of the given user message sizes, then nothing (the caller adds the next)."""
    events: list = []
    for n, size in enumerate(sizes, start=1):
        events += [
            TurnInput(turn_id=f"t{n}", agent="chatty", text=turn_text(n, size)),
            ModelOutput(turn_id=f"t{n}", step=0, content=f"Noted turn {n}."),
            TurnEnded(turn_id=f"t{n}", answer=f"Noted turn {n}."),
        ]
    return events


def ask(events: list, n: int, size: int = 2_000, **kwargs) -> tuple[list, object]:
    events = [*events, TurnInput(turn_id=f"t{n}", agent="chatty", text=turn_text(n, size, **kwargs))]
    return events, build_context(events, chatty, turn_id=f"t{n}", step=0)


def test_under_the_threshold_the_call_goes_out_as_built():
    events, built = ask(conversation(2_000), 2)
    decision = next_call(built, events, chatty)
    assert decision == Send(built.request) and built.compaction is None


def test_over_the_threshold_a_summary_is_written_first_of_every_turn_but_the_running_one():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    decision = next_call(built, events, chatty)
    assert isinstance(decision, Summarise)
    assert decision.plan.kept_from_turn == "t4" and decision.plan.new_turns == ("t1", "t2", "t3")


def test_after_the_summary_the_call_shows_it_in_the_system_message_in_place_of_the_turns():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    plan = next_call(built, events, chatty).plan
    events.append(compaction_event(plan, "SUMMARY[turn 1, turn 2, turn 3]"))
    built = build_context(events, chatty, turn_id="t4", step=0)
    decision = next_call(built, events, chatty)
    assert isinstance(decision, Send) and not decision.trimmed
    assert "SUMMARY[turn 1, turn 2, turn 3]" in decision.request.system
    assert [m.text[:7] for m in decision.request.messages] == ["turn 4:"]
    assert outcome_of(events, "t4", "t4") == events[-1]


C04_AGENT = chatty.__class__(
    name="chatty",
    system_prompt="S",
    context=ContextConfig(
        policy=ContextPolicy(
            shrink=(),
            output_reserve=Tokens(100),
            result_cap=None,
            compact=Compact(where=turns[:-1], when=Share(0.5), summary_output=Tokens(200)),
        )
    ),
    model_limits=ModelLimits(window=Tokens(3_000)),
)


def c04_trace() -> list:
    """C04: a turn whose model called two tools at once (5 KB results), answered; then a new question."""
    calls = (
        ToolCall(id="call_1", name="query_errors", arguments="{}"),
        ToolCall(id="call_2", name="query_latency", arguments="{}"),
    )
    return [
        TurnInput(turn_id="t1", agent="chatty", text="Analyze metrics for asset X"),
        ModelOutput(turn_id="t1", step=0, tool_calls=calls, stop_reason="tool_calls"),
        ToolOutput(turn_id="t1", call_id="call_1", name="query_errors", text="error row\n" * 500),
        ToolOutput(turn_id="t1", call_id="call_2", name="query_latency", text="latency row\n" * 400),
        ModelOutput(turn_id="t1", step=1, content="Errors are high; latency is fine."),
        TurnEnded(turn_id="t1", answer="Errors are high; latency is fine."),
        TurnInput(turn_id="t2", agent="chatty", text="And yesterday?"),
    ]


def test_c04_the_summary_starts_the_kept_part_on_the_newest_user_message_and_each_call_shows_once():
    events = c04_trace()
    built = build_context(events, C04_AGENT, turn_id="t2", step=0)
    decision = next_call(built, events, C04_AGENT)
    assert isinstance(decision, Summarise) and decision.plan.kept_from_turn == "t2"  # a turn boundary
    # the summary call reads the whole tool unit, each result once and right after its call
    state = new_state(events, C04_AGENT, *settings_of(C04_AGENT))
    summary_call = summary_request(state, decision.plan, 0, None)
    ids = [m.call_id for m in summary_call.messages if isinstance(m, ToolResultMessage)]
    assert ids == ["call_1", "call_2"]
    events.append(compaction_event(decision.plan, "Errors were high, latency fine."))
    request = next_call(build_context(events, C04_AGENT, turn_id="t2", step=0), events, C04_AGENT).request
    # [system + summary, user "And yesterday?"]: nothing of t1 twice, no orphaned result, the question kept
    assert request.messages == (UserMessage(text="And yesterday?"),)
    assert "Errors were high, latency fine." in request.system


def test_c04_a_second_compaction_folds_the_first_summary_in_and_only_the_newer_one_shows():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    events.append(compaction_event(next_call(built, events, chatty).plan, "SUMMARY[turn 1, turn 2, turn 3]"))
    events += [
        ModelOutput(turn_id="t4", step=0, content="Noted turn 4."),
        TurnEnded(turn_id="t4", answer="Noted turn 4."),
    ]
    for n in (5, 6):
        events += conversation(*[0] * (n - 1), 2_000)[-3:]
        events[-3] = TurnInput(turn_id=f"t{n}", agent="chatty", text=turn_text(n))
        events[-2] = ModelOutput(turn_id=f"t{n}", step=0, content=f"Noted turn {n}.")
        events[-1] = TurnEnded(turn_id=f"t{n}", answer=f"Noted turn {n}.")
    events, built = ask(events, 7)
    decision = next_call(built, events, chatty)
    assert isinstance(decision, Summarise) and decision.plan.previous_summary == "SUMMARY[turn 1, turn 2, turn 3]"
    state = new_state(events, chatty, *settings_of(chatty))
    assert (
        "SUMMARY[turn 1, turn 2, turn 3]"
        in summary_request(state, decision.plan, 0, decision.plan.previous_summary).system
    )
    events.append(compaction_event(decision.plan, "SUMMARY[SUMMARY[turn 1, turn 2, turn 3] + turn 4, turn 5, turn 6]"))
    request = next_call(build_context(events, chatty, turn_id="t7", step=0), events, chatty).request
    assert request.system.count("SUMMARY[") == 2 and request.system.count("<conversation_summary>") == 1
    assert [m.text[:7] for m in request.messages if isinstance(m, UserMessage)] == ["turn 7:"]


def test_c24_a_failed_summary_falls_back_to_plain_trimming_that_fits_and_says_so():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4, size=6_000)
    assert not built.fits and built.compaction is not None
    events.append(CompactionFailed(turn_id="t4", kept_from_turn="t4", code=SUMMARY_FAILED, reason="HTTP 500"))
    decision = next_call(built, events, chatty)
    assert isinstance(decision, Send) and decision.trimmed
    assert "left out" in decision.request.system
    users = [m.text[:7] for m in decision.request.messages if isinstance(m, UserMessage)]
    assert isinstance(decision.request.messages[0], UserMessage) and users[-1] == "turn 4:" and "turn 1:" not in users
    # a rebuild of the stored call gives the same request
    assert sent_request(events, chatty, turn_id="t4", step=0) == decision.request
    # the same failure over the threshold but within the window: the call goes out as built
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    events.append(CompactionFailed(turn_id="t4", kept_from_turn="t4", code=SUMMARY_FAILED, reason="HTTP 500"))
    assert next_call(built, events, chatty) == Send(built.request)


def test_an_empty_summary_or_one_that_replaces_nothing_ends_the_turn_with_a_compaction_error():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    with pytest.raises(CompactionError, match="empty summary"):
        compaction_event(next_call(built, events, chatty).plan, "  ")
    events.append(
        CompactionFailed(
            turn_id="t4", kept_from_turn="t4", code=COMPACTION_ERROR, reason="the model wrote an empty summary"
        )
    )
    with pytest.raises(CompactionError, match="empty summary") as caught:
        next_call(built, events, chatty)
    assert failure_code(caught.value) == COMPACTION_ERROR


def test_a_context_that_still_does_not_fit_after_the_summary_ends_the_turn_as_context_full():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4, size=13_000)  # the running turn alone is over the window
    events.append(compaction_event(next_call(built, events, chatty).plan, "SUMMARY[turn 1, turn 2, turn 3]"))
    built = build_context(events, chatty, turn_id="t4", step=0)
    assert built.compaction is None and not built.fits  # nothing more to summarise: no loop
    with pytest.raises(ContextFullError, match="after the summary") as caught:
        next_call(built, events, chatty)
    assert failure_code(caught.value) == CONTEXT_FULL


def test_the_assistant_message_kept_after_a_summary_is_the_running_turns_own():
    events, built = ask(conversation(2_000, 2_000, 2_000), 4)
    events.append(compaction_event(next_call(built, events, chatty).plan, "S"))
    call = ToolCall(id="c1", name="x", arguments="{}")
    events += [
        ModelOutput(turn_id="t4", step=0, tool_calls=(call,), stop_reason="tool_calls"),
        ToolOutput(turn_id="t4", call_id="c1", name="x", text="r"),
    ]
    request = next_call(build_context(events, chatty, turn_id="t4", step=1), events, chatty).request
    assert [type(m) for m in request.messages] == [UserMessage, AssistantMessage, ToolResultMessage]
