"""Model limits: estimates, the recorded-usage correction, and the context-full error."""

from __future__ import annotations

import pytest

from agentstream.context import (
    AssistantMessage,
    ChatRequest,
    ContextPolicy,
    ModelLimits,
    Share,
    Tokens,
    UserMessage,
    build_context,
    build_request,
    estimate_tokens,
)
from agentstream.context.limits import corrected_tokens, request_chars
from agentstream.errors import ContextFullError
from agentstream.wire.events import ToolCall
from tests.unit.context.factory import Trace, make_agent


def test_thresholds_in_a_window():
    limits = ModelLimits(window=Tokens(100_000))
    assert limits.tokens(Share(0.6)) == 60_000 and limits.tokens(Tokens(5)) == 5
    assert limits.characters_per_token == 3.0
    assert limits.tokens_of_chars(10) == 4  # rounded up: conservative
    with pytest.raises(ValueError):
        ModelLimits(window=Tokens(0))


def test_the_estimate_counts_tool_call_arguments_reasoning_and_tool_definitions():
    limits = ModelLimits(window=Tokens(100_000))
    call = ToolCall(id="c", name="write", arguments="x" * 3000)
    plain = ChatRequest(system="S", messages=(UserMessage(text="hi"), AssistantMessage(tool_calls=(call,))))
    assert estimate_tokens(plain, limits) > 1000
    with_reasoning = ChatRequest(system="S", messages=(AssistantMessage(content="a", reasoning="r" * 300),))
    assert request_chars(with_reasoning) > 300
    agent = make_agent()
    from agentstream.context import tool_definitions

    with_tools = ChatRequest(system="S", messages=(), tools=tool_definitions(agent))
    assert request_chars(with_tools) > request_chars(ChatRequest(system="S", messages=()))


def test_a_recorded_prompt_count_replaces_the_estimate_of_what_it_covered():
    limits = ModelLimits(window=Tokens(100_000))
    assert corrected_tokens(3000, limits, None) == 1000
    assert corrected_tokens(3000, limits, (5000, 3000)) == 5000
    assert corrected_tokens(3300, limits, (5000, 3000)) == 5100
    assert corrected_tokens(2700, limits, (5000, 3000)) == 4900


def test_the_builder_uses_the_newest_recorded_usage():
    trace = Trace()
    turn = trace.user("hi")
    trace.answer(turn, "hello", prompt_tokens=20_000)
    trace.end(turn)
    nxt = trace.user("again")
    agent = make_agent(window=100_000, policy=ContextPolicy(output_reserve=Tokens(1000)))
    built = build_context(trace.events, agent, turn_id=nxt, step=0)
    assert 21_000 < built.size_tokens < 21_100


def test_a_context_that_cannot_fit_raises_before_anything_is_sent():
    trace = Trace()
    turn = trace.user("x" * 30_000)
    agent = make_agent(window=8_000, policy=ContextPolicy(output_reserve=Tokens(1000)))
    with pytest.raises(ContextFullError, match="window is 8000 tokens"):
        build_request(trace.events, agent, turn_id=turn, step=0)
    built = build_context(trace.events, agent, turn_id=turn, step=0)
    assert not built.fits and built.size_tokens > 8_000


def test_the_output_reserve_counts():
    trace = Trace()
    turn = trace.user("x" * 3_000)
    tight = make_agent(window=2_000, policy=ContextPolicy(output_reserve=Tokens(1_500)))
    with pytest.raises(ContextFullError):
        build_request(trace.events, tight, turn_id=turn, step=0)
    roomy = make_agent(window=2_000, policy=ContextPolicy(output_reserve=Tokens(500)))
    assert build_request(trace.events, roomy, turn_id=turn, step=0).messages


def test_target_must_be_below_start_at_in_the_window():
    trace = Trace()
    turn = trace.user("hi")
    policy = ContextPolicy(start_at=Tokens(1000), target=Share(0.5))
    with pytest.raises(ValueError, match="target"):
        build_context(trace.events, make_agent(window=10_000, policy=policy), turn_id=turn, step=0)


def test_an_agent_without_limits_gets_the_default_window():
    from agentstream.context import DEFAULT_LIMITS, settings_of

    assert settings_of(make_agent())[1] is DEFAULT_LIMITS and DEFAULT_LIMITS.window == Tokens(32_000)
    assert settings_of(make_agent(), limits=None)[1] is None


def test_an_implausibly_low_reported_count_does_not_correct_the_estimate():
    # issue 11 item 4: 947 reported for a ~7,660-token request in a 4,000-token window
    from agentstream.context.limits import PLAUSIBLE_USAGE_RATIO, plausible_prompt_tokens

    limits = ModelLimits(window=Tokens(4_000))
    assert PLAUSIBLE_USAGE_RATIO == 0.5
    assert not plausible_prompt_tokens(947, 22_980, limits)
    assert plausible_prompt_tokens(4_000, 22_980, limits)  # 0.52 of 7,660: a real tokenizer may count so few
    trace = Trace()
    turn = trace.user("x" * 9_000)
    trace.answer(turn, "ok", prompt_tokens=10)  # a server that under-reports
    trace.end(turn)
    nxt = trace.user("y" * 9_000)
    agent = make_agent(window=4_000, policy=ContextPolicy(output_reserve=Tokens(500)))
    built = build_context(trace.events, agent, turn_id=nxt, step=0)
    assert built.size_tokens > 6_000 and not built.fits  # the estimate stands: the call is not sent
    trusted = Trace()
    t = trusted.user("x" * 9_000)
    trusted.answer(t, "ok", prompt_tokens=2_900)  # plausible (0.97 of the estimate): it corrects
    trusted.end(t)
    n = trusted.user("again")
    corrected = build_context(
        trusted.events, make_agent(window=100_000, policy=ContextPolicy(output_reserve=Tokens(500))), turn_id=n, step=0
    )
    assert 3_400 < corrected.size_tokens < 3_500
