"""A window miss (issue 34 kind 2): the server refused a request the estimate said fits. The
context is rebuilt smaller under the corrected limits, or the turn fails context_full with the
figures; a later turn on the same conversation can still be sent."""

from __future__ import annotations

import pytest

from agentstream.context import build_context
from agentstream.context.builder import rebuild_after_miss
from agentstream.context.limits import request_chars
from agentstream.errors import ContextFullError
from tests.unit.context.factory import Trace, make_agent

WINDOW = 20_000


def tool_heavy() -> tuple[Trace, str]:
    """Three finished turns with long tool results, then a running turn: fits a 20 000-token window."""
    trace = Trace()
    for n in range(3):
        trace.tool_turn(f"question {n}", [f"result {n} " + "lorem ipsum dolor sit amet " * 40])
    turn = trace.user("and the last question?")
    return trace, turn


def test_the_refused_request_is_rebuilt_smaller_and_fits_the_corrected_limits():
    trace, turn = tool_heavy()
    agent = make_agent(window=WINDOW)
    sent = build_context(trace.events, agent, turn_id=turn, step=0)
    assert sent.fits  # the estimate said it fits ...
    # ... the server says the window is 9000 and the prompt 8600 tokens (its tokenizer counts more)
    built, correction = rebuild_after_miss(
        trace.events, agent, turn_id=turn, step=0, prompt_tokens=8600, window_tokens=9000
    )
    assert correction.limits.window.count == 9000 and correction.prompt_tokens == 8600
    assert request_chars(built.request) < request_chars(sent.request)
    assert built.request.messages[-1].text == "and the last question?"  # the running turn is whole


def test_without_figures_the_request_still_gets_smaller():
    trace, turn = tool_heavy()
    agent = make_agent(window=WINDOW)
    sent = build_context(trace.events, agent, turn_id=turn, step=0)
    built, _ = rebuild_after_miss(trace.events, agent, turn_id=turn, step=0)
    assert request_chars(built.request) < request_chars(sent.request)


def test_when_nothing_can_be_shed_the_error_gives_the_figures():
    trace = Trace()
    turn = trace.user("summarise this: " + "word " * 2000)  # the running turn alone
    agent = make_agent(window=WINDOW)
    assert build_context(trace.events, agent, turn_id=turn, step=0).fits
    with pytest.raises(ContextFullError) as caught:
        rebuild_after_miss(trace.events, agent, turn_id=turn, step=0, prompt_tokens=9400, window_tokens=9000)
    message = str(caught.value)
    assert "prompt 9400" in message and "window 9000" in message and "nothing more can be shed" in message


def test_the_next_turn_after_a_failed_one_can_still_be_sent():
    trace = Trace()
    big = trace.user("summarise this: " + "word " * 2000)
    trace.fail(big)  # the turn failed context_full
    nxt = trace.user("Never mind. What is 2+2?")
    agent = make_agent(window=WINDOW)
    built, _ = rebuild_after_miss(trace.events, agent, turn_id=nxt, step=0, prompt_tokens=3400, window_tokens=9000)
    assert built.request.messages[-1].text == "Never mind. What is 2+2?"
    assert all("word word" not in getattr(m, "text", "") for m in built.request.messages)  # the old input was shed


def test_after_a_call_sent_again_the_next_estimate_counts_the_refused_size_not_the_smaller_ones():
    from agentstream.context.limits import WINDOW_MISS
    from agentstream.wire.events import ModelOutput, ToolCall, Usage

    def trace_with(attributes: dict) -> tuple[Trace, str]:
        trace, turn = tool_heavy()
        trace.events.append(
            ModelOutput(
                turn_id=turn,
                step=0,
                tool_calls=(ToolCall(id="c9", name="search", arguments="{}"),),
                stop_reason="tool_calls",
                usage=Usage(prompt_tokens=900),  # the smaller request sent again
                attributes=attributes,
            )
        )
        trace.result(turn, "c9", "short")
        return trace, turn

    agent = make_agent(window=WINDOW)
    plain, turn = trace_with({})
    missed, _ = trace_with({WINDOW_MISS: {"prompt_tokens": 8600, "window_tokens": 9000, "over_by_tokens": None}})
    before = build_context(plain.events, agent, turn_id=turn, step=1).size_tokens
    after = build_context(missed.events, agent, turn_id=turn, step=1).size_tokens
    # the server's count of the refused request (8600 tokens, not the estimate's ~900) sizes the next call
    assert after - before > 7000
