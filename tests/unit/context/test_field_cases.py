"""Field cases of kinds (a) and (e) from ../shared/cases/field-cases.md: C01, C03, C04, C21, C22, C24.

Each test's assertions are the case's "Expected".
"""

from __future__ import annotations

import itertools

import msgspec
import pytest

from agentstream import Agent, Tool
from agentstream.context import (
    AssistantMessage,
    Compact,
    ContextCache,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Share,
    SystemMessage,
    Tokens,
    ToolResultMessage,
    UserMessage,
    build_context,
    build_messages,
    build_request,
    compaction_event,
    estimate_tokens,
    summary_request,
    trim_messages,
    trimmed_request,
    turns,
)
from agentstream.context.builder import new_state, settings_of
from agentstream.context.compaction import trigger_tokens
from agentstream.context.limits import DEFAULT_LIMITS
from agentstream.context.trimming import estimate_counter
from agentstream.errors import ContextFullError
from agentstream.models.openai_format import request_body
from agentstream.wire.events import Compaction, ToolCall
from tests.unit.context.factory import Trace, make_agent


def assert_paired(messages) -> None:
    """No assistant tool_calls without all their results right after; no result without its call."""
    index = 0
    messages = [m for m in messages if not isinstance(m, SystemMessage)]
    while index < len(messages):
        message = messages[index]
        assert not isinstance(message, ToolResultMessage), f"orphan tool result at {index}"
        index += 1
        if isinstance(message, AssistantMessage) and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            got = [m.call_id for m in messages[index : index + len(ids)] if isinstance(m, ToolResultMessage)]
            assert got == ids, f"results {got} do not answer calls {ids}"
            index += len(ids)


# --- C01: the trimmer must not strip trailing tool results, nor orphan them -----------------------

C01 = (
    SystemMessage(text="You are a helpful agent."),
    UserMessage(text="Weather in Paris?"),
    AssistantMessage(tool_calls=(ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}'),)),
    ToolResultMessage(call_id="call_1", name="get_weather", text="18C, cloudy"),
)


def test_c01_under_budget_trimming_is_a_no_op():
    counter = estimate_counter(ModelLimits(window=Tokens(100_000)))
    assert counter(C01) < 100
    assert (
        trim_messages(C01, max_tokens=10_000, token_counter=counter, include_system=True, start_on="user") is not None
    )
    assert trim_messages(C01, max_tokens=10_000, token_counter=counter, include_system=True, start_on="user") == C01


def test_c01_under_budget_the_builder_sends_the_history_unchanged_byte_for_byte():
    trace = Trace()
    turn = trace.user("Weather in Paris?")
    (call,) = trace.calls(turn, ("get_weather", '{"city":"Paris"}'))
    trace.result(turn, call, "18C, cloudy", name="get_weather")
    agent = make_agent(window=10_000, policy=ContextPolicy(output_reserve=Tokens(1_000)))
    limited = build_request(trace.events, agent, turn_id=turn, step=1)
    unlimited = build_request(trace.events, agent, turn_id=turn, step=1, limits=None)
    assert limited.messages == build_messages(trace.events)
    assert request_body(limited, model="m") == request_body(unlimited, model="m")
    assert isinstance(limited.messages[-1], ToolResultMessage)


@pytest.mark.parametrize("budget", range(0, 60))
def test_c01_when_trimming_must_drop_a_call_and_its_results_go_together(budget):
    counter = estimate_counter(ModelLimits(window=Tokens(100_000)))
    kept = trim_messages(C01, max_tokens=budget, token_counter=counter, include_system=True)
    assert_paired(kept)
    assert not (kept and isinstance(kept[-1], AssistantMessage) and kept[-1].tool_calls)


# --- C03: a parallel tool-call group is one unit ---------------------------------------------------

C03 = (
    SystemMessage(text="S"),
    UserMessage(text="Compare A and B"),
    AssistantMessage(
        tool_calls=(
            ToolCall(id="call_1", name="get", arguments='{"k":"A"}'),
            ToolCall(id="call_2", name="get", arguments='{"k":"B"}'),
        )
    ),
    ToolResultMessage(call_id="call_1", name="get", text="A=1"),
    ToolResultMessage(call_id="call_2", name="get", text='[{"type": "text", "text": "B=2"}]'),
    AssistantMessage(content="A is smaller."),
    UserMessage(text="Thanks, now C?"),
)


def test_c03_keep_system_and_the_last_three_messages_drops_the_whole_unit_and_starts_on_user():
    kept = trim_messages(C03, max_tokens=4, token_counter=len, include_system=True, start_on="user")
    assert kept == (C03[0], C03[-1])


@pytest.mark.parametrize("budget", range(1, 9))
def test_c03_at_any_budget_the_unit_is_whole_or_gone(budget):
    kept = trim_messages(C03, max_tokens=budget, token_counter=len, include_system=True, start_on="user")
    assert_paired(kept)
    ids = [m.call_id for m in kept if isinstance(m, ToolResultMessage)]
    assert ids in ([], ["call_1", "call_2"])
    assert len(kept) <= 1 or isinstance(kept[1], UserMessage)


def test_c03_with_a_summary_the_context_is_system_summary_then_the_new_user_message():
    trace = Trace()
    first = trace.user("Compare A and B")
    a, b = trace.calls(first, ("get", '{"k":"A"}'), ("get", '{"k":"B"}'))
    trace.result(first, b, "B=2", name="get")
    trace.result(first, a, "A=1", name="get")
    trace.answer(first, "A is smaller.")
    trace.end(first)
    second = trace.user("Thanks, now C?")
    trace.events.append(
        Compaction(turn_id=second, summary="A=1, B=2; A is smaller.", kept_from_turn=second, replaced_turns=1)
    )
    request = build_request(
        trace.events,
        make_agent(window=10_000, policy=ContextPolicy(output_reserve=Tokens(100))),
        turn_id=second,
        step=0,
    )
    assert "A is smaller." in request.system and request.messages == (UserMessage(text="Thanks, now C?"),)


# --- C04: a summary never duplicates or orphans results, and never eats the live user turn ----------


def c04_trace() -> tuple[Trace, str, str]:
    trace = Trace()
    first = trace.user("Analyze metrics for asset X")
    errors, latency = trace.calls(first, ("query_errors", "{}"), ("query_latency", "{}"))
    trace.result(first, errors, "error row\n" * 500, name="query_errors")
    trace.result(first, latency, "latency row\n" * 500, name="query_latency")
    trace.answer(first, "Errors are high; latency is fine.")
    trace.end(first)
    return trace, first, trace.user("And yesterday?")


def c04_agent(where=turns[:-1]) -> Agent:
    policy = ContextPolicy(
        shrink=(), output_reserve=Tokens(200), compact=Compact(where=where, when=Share(0.5), summary_output=Tokens(300))
    )
    return make_agent(window=4_000, policy=policy)


def test_c04_the_boundary_is_a_turn_boundary_and_each_event_shows_once():
    trace, first, second = c04_trace()
    agent = c04_agent()
    plan = build_context(trace.events, agent, turn_id=second, step=0).compaction
    assert plan is not None and plan.kept_from_turn == second and plan.new_turns == (first,)
    state = new_state(trace.events, agent, *settings_of(agent))
    summary_call = summary_request(state, plan, 0, None)
    call_ids = [c.id for m in summary_call.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    result_ids = [m.call_id for m in summary_call.messages if isinstance(m, ToolResultMessage)]
    assert call_ids == result_ids == ["call_1", "call_2"]
    assert_paired(summary_call.messages)
    trace.events.append(compaction_event(plan, "Errors were high, latency fine."))
    request = build_request(trace.events, agent, turn_id=second, step=0)
    assert request.messages == (UserMessage(text="And yesterday?"),)
    assert "Errors were high, latency fine." in request.system


def test_c04_the_newest_user_message_is_never_summarised_away():
    trace, _, second = c04_trace()
    agent = c04_agent(where=turns[:])
    plan = build_context(trace.events, agent, turn_id=second, step=0).compaction
    assert plan is not None and plan.kept_from_turn == second


def test_c04_a_second_compaction_folds_the_first_summary_in():
    trace, _, second = c04_trace()
    agent = c04_agent()
    plan = build_context(trace.events, agent, turn_id=second, step=0).compaction
    trace.events.append(compaction_event(plan, "FIRST SUMMARY"))
    (call,) = trace.calls(second, ("query_errors", "{}"))
    trace.result(second, call, "yesterday row\n" * 500, name="query_errors")
    trace.answer(second, "Yesterday was fine.")
    trace.end(second)
    third = trace.user("And today?")
    plan = build_context(trace.events, agent, turn_id=third, step=0).compaction
    assert plan is not None and plan.previous_summary == "FIRST SUMMARY"
    state = new_state(trace.events, agent, *settings_of(agent))
    assert "FIRST SUMMARY" in summary_request(state, plan, 0, plan.previous_summary).system
    trace.events.append(compaction_event(plan, "SECOND SUMMARY"))
    request = build_request(trace.events, agent, turn_id=third, step=0)
    assert "SECOND SUMMARY" in request.system and "FIRST SUMMARY" not in request.system
    assert request.messages == (UserMessage(text="And today?"),)


# --- C21: the cached prefix survives ---------------------------------------------------------------


def messages_bytes(request) -> list[bytes]:
    body = msgspec.json.decode(request_body(request, model="m"))
    return [msgspec.json.encode(m) for m in body["messages"]]


def test_c21_under_budget_ten_turns_keep_the_prefix_byte_identical():
    trace = Trace()
    agent = make_agent(window=100_000, policy=ContextPolicy(output_reserve=Tokens(1_000)))
    previous = previous_tools = None
    for index in range(10):
        turn = trace.user(f"question {index}")
        request = build_request(trace.events, agent, turn_id=turn, step=0)
        current = messages_bytes(request)
        if previous is not None:
            assert current[: len(previous)] == previous
            assert request.tools == previous_tools
        previous, previous_tools = current, request.tools
        (call,) = trace.calls(turn, ("search", '{"query": "x"}'))
        trace.result(turn, call, "tool traffic " * 200)
        trace.answer(turn, f"answer {index}")
        trace.end(turn)


def test_c21_at_the_budget_a_shrink_cuts_deep_once_then_the_prefix_holds_for_many_turns():
    trace = Trace()
    agent = make_agent(window=30_000, policy=ContextPolicy(output_reserve=Tokens(1_000)))
    cache = ContextCache()
    previous: list[bytes] | None = None
    changes = []
    for index in range(40):
        turn = trace.user(f"question {index}")
        entries = [(f"{i}-0", e) for i, e in enumerate(trace.events)]
        built = cache.build("c21", entries, agent, turn_id=turn, step=0)
        current = messages_bytes(built.request)
        if previous is not None and current[: len(previous)] != previous:
            changes.append(index)
            assert built.size_tokens <= 30_000 * 0.4, "a cut goes down to the target in one step"
        previous = current
        (call,) = trace.calls(turn, ("search", '{"query": "x"}'))
        trace.result(turn, call, "tool traffic " * 200)
        trace.answer(turn, f"answer {index}")
        trace.end(turn)
    assert changes, "the history outgrew the start threshold"
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    assert all(gap >= 5 for gap in gaps), f"the prefix changed too often: at turns {changes}"


# --- C22: tool-call arguments and tool schemas count --------------------------------------------------


def schema_tool(index: int) -> Tool:
    def fn(path: str, content: str = "") -> str:
        return path

    fn.__doc__ = f"Tool {index}. " + "It does something specific with files and folders. " * 14
    return Tool(fn, name=f"tool_{index}")


def c22_agent(compact: Compact | None) -> Agent:
    tools = [schema_tool(i) for i in range(12)]
    policy = ContextPolicy(output_reserve=Tokens(2_000), compact=compact)
    return Agent(
        name="a",
        system_prompt="S",
        tools=tools,
        context=ContextConfig(policy=policy),
        model_limits=ModelLimits(window=Tokens(16_000)),
    )


def c22_trace() -> tuple[Trace, str]:
    trace = Trace()
    first = trace.user("Write the report")
    (call,) = trace.calls(first, ("tool_0", msgspec.json.encode({"path": "r.md", "content": "x" * 40_000}).decode()))
    trace.result(first, call, "ok", name="tool_0")
    trace.end(first)
    return trace, trace.user("Now add a summary")


def test_c22_the_estimate_counts_arguments_schemas_and_the_reserve_and_compaction_fires_before_the_call():
    trace, second = c22_trace()
    agent = c22_agent(Compact(where=turns[:-1]))
    built = build_context(trace.events, agent, turn_id=second, step=0)
    schemas = estimate_tokens(
        built.request.__class__(system="", messages=(), tools=built.request.tools), agent.model_limits
    )
    assert 2_500 <= schemas <= 5_000, schemas  # cl100k counts 2 533: JSON punctuation counts a token each
    assert built.size_tokens > 14_000
    assert built.compaction is not None and built.compaction.kept_from_turn == second
    with pytest.raises(ContextFullError):
        build_request(trace.events, c22_agent(None), turn_id=second, step=0)


def test_c22_the_estimate_is_corrected_by_the_providers_real_prompt_count():
    trace, second = c22_trace()
    trace.answer(second, "partial", prompt_tokens=15_500)
    agent = c22_agent(Compact(where=turns[:-1]))
    built = build_context(trace.events, agent, turn_id=second, step=1)
    assert built.size_tokens >= 15_500 + 2_000


# --- C24: compaction starts with room to spare, and its own call is budgeted ---------------------------


def c24_trace(turn_count: int, result_chars: int) -> tuple[Trace, str]:
    trace = Trace()
    for index in range(turn_count):
        trace.tool_turn(f"step {index}", ["r" * result_chars], f"done {index}")
    return trace, trace.user("continue")


def c24_agent(compact: Compact) -> Agent:
    policy = ContextPolicy(shrink=(), output_reserve=Tokens(8_000), result_cap=None, compact=compact)
    return make_agent(window=200_000, policy=policy)


def test_c24_the_default_threshold_leaves_headroom_and_a_late_threshold_is_clamped():
    limits = ModelLimits(window=Tokens(200_000))
    assert trigger_tokens(Compact(summary_output=Tokens(4_000)), limits, 8_000, 3_000) == 160_000
    late = trigger_tokens(Compact(when=Share(0.98), summary_output=Tokens(4_000)), limits, 8_000, 3_000)
    assert late <= 200_000 - 4_000 - 1_000 + 8_000
    trace, last = c24_trace(30, 17_000)  # about 170 k tokens of history
    built = build_context(trace.events, c24_agent(Compact(summary_output=Tokens(4_000))), turn_id=last, step=0)
    assert built.fits and built.size_tokens < 196_000 and built.compaction is not None


def test_c24_every_summary_call_fits_even_from_a_history_at_the_limit():
    trace, last = c24_trace(33, 17_500)  # about 193 k tokens of history: over the window with the reserve
    agent = c24_agent(Compact(when=Share(0.98), summary_output=Tokens(4_000)))
    built = build_context(trace.events, agent, turn_id=last, step=0)
    assert not built.fits and built.compaction is not None
    state = new_state(trace.events, agent, *settings_of(agent))
    summary = None
    for chunk in range(len(built.compaction.chunks)):
        request = summary_request(state, built.compaction, chunk, summary)
        assert estimate_tokens(request, agent.model_limits) + request.max_output_tokens <= 200_000
        assert_paired(request.messages)
        summary = "s" * 12_000


def test_c24_if_summarising_fails_the_fallback_is_structural_trimming_that_fits():
    trace, last = c24_trace(33, 17_500)
    agent = c24_agent(Compact(when=Share(0.98), summary_output=Tokens(4_000)))
    built = build_context(trace.events, agent, turn_id=last, step=0)
    request = trimmed_request(built, agent)
    assert estimate_tokens(request, agent.model_limits) + 8_000 <= 200_000
    assert isinstance(request.messages[0], UserMessage) and request.messages[-1] == UserMessage(text="continue")
    assert_paired(request.messages)
    assert "left out" in request.system


def test_c24_a_missing_window_falls_back_to_a_conservative_default_and_no_compaction_loop():
    assert settings_of(make_agent())[1] is DEFAULT_LIMITS
    trace, last = c24_trace(30, 17_000)
    agent = c24_agent(Compact(summary_output=Tokens(4_000)))
    plan = build_context(trace.events, agent, turn_id=last, step=0).compaction
    trace.events.append(compaction_event(plan, "summary"))
    assert build_context(trace.events, agent, turn_id=last, step=0).compaction is None
