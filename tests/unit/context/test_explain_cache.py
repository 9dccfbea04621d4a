"""Explain a model call, and the per-worker cache (incremental when it hits, correct when it misses)."""

from __future__ import annotations

import msgspec
import pytest

from agentstream.context import (
    ContextCache,
    ContextPolicy,
    Tokens,
    build_context,
    describe_shrunk,
    explain,
)
from agentstream.errors import UnrenderedEventError
from tests.unit.context.factory import Trace, make_agent

AGENT = make_agent(window=8_000, policy=ContextPolicy(output_reserve=Tokens(500)))


def grow(trace: Trace, turns: int) -> None:
    for index in range(turns):
        trace.tool_turn(f"question {index}", ["lorem ipsum " * 150], f"answer {index}")


def test_explain_names_the_shrink_and_the_call_that_gave_each_form():
    trace = Trace()
    grow(trace, 10)
    last = trace.user("last")
    explanation = explain(trace.events, lambda name: AGENT, step=0)
    assert not explanation.made and explanation.turn_id == last
    assert explanation.request == build_context(trace.events, AGENT, turn_id=last, step=0).request
    lines = [describe_shrunk(s) for s in explanation.shrunk]
    assert lines and lines[0].startswith("r1 (call_1, search) stubbed by Stub(where=turns[:-4], when=None) at call ")
    made = explain(trace.events, lambda name: AGENT, step=1, turn_id="t9")
    assert made.made and made.built.call == 17
    with pytest.raises(LookupError, match="neither"):
        explain(trace.events, lambda name: AGENT, step=4, turn_id="t9")
    with pytest.raises(LookupError, match="no turn"):
        explain(trace.events, lambda name: AGENT, step=0, turn_id="zz")
    with pytest.raises(LookupError, match="agent"):
        explain(trace.events, lambda name: None, step=0)


def entries_of(trace: Trace, prefix: str = "") -> list[tuple[str, object]]:
    return [(f"{prefix}{index}-0", event) for index, event in enumerate(trace.events)]


def test_each_step_through_the_cache_equals_a_cold_rebuild():
    trace = Trace()
    cache = ContextCache()
    for index in range(14):
        turn = trace.user(f"q{index}")
        for step in range(2):
            warm = cache.build("tr", entries_of(trace), AGENT, turn_id=turn, step=step)
            cold = build_context(trace.events, AGENT, turn_id=turn, step=step)
            assert msgspec.json.encode(warm.request) == msgspec.json.encode(cold.request)
            assert warm.shrunk == cold.shrunk and warm.size_tokens == cold.size_tokens
            if step == 0:
                (call,) = trace.calls(turn, ("search", "{}"))
                trace.result(turn, call, "lorem ipsum " * 150)
        trace.answer(turn, "ok")
        trace.end(turn)
    assert cache.misses == 1 and cache.hits == 27


def test_a_miss_rebuilds_from_the_start():
    trace = Trace()
    grow(trace, 3)
    last = trace.user("last")
    cache = ContextCache(max_traces=1)
    cache.build("a", entries_of(trace), AGENT, turn_id=last, step=0)
    rewritten = entries_of(trace, prefix="x")
    assert (
        cache.build("a", rewritten, AGENT, turn_id=last, step=0).request
        == build_context(trace.events, AGENT, turn_id=last, step=0).request
    )
    other = make_agent(window=100_000)
    cache.build("a", rewritten, other, turn_id=last, step=0)
    cache.build("b", rewritten, other, turn_id=last, step=0)
    assert len(cache) == 1 and cache.misses == 4
    cache.forget("b")
    assert len(cache) == 0


def test_a_failed_build_drops_the_cached_state():
    class Unknown(msgspec.Struct, frozen=True, tag="unknown"):
        turn_id: str

    trace = Trace()
    turn = trace.user("hi")
    cache = ContextCache()
    cache.build("t", entries_of(trace), AGENT, turn_id=turn, step=0)
    trace.events.append(Unknown(turn_id=turn))
    with pytest.raises(UnrenderedEventError):
        cache.build("t", entries_of(trace), AGENT, turn_id=turn, step=0)
    assert len(cache) == 0
