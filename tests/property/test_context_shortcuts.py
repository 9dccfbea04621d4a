"""The judge's shortcuts against planning every pass in full: the same contexts at every call.

:func:`agentstream.context.shrink.judge` skips planning a pass when its outcome is known (the
same view as a pass that was tried in full and not made; a bound of what a pass could free
under ``min_gain``), reads the candidates of the built-in prefix shrinks incrementally, and
measures the default forms without making them. With ``shrink.SHORTCUTS`` off, every pass is
planned from the shrinks' own offers. Both must give every call the same request, size, fit,
compaction and shortened results (which shrink, at which call), cold and through the cache.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstream import Agent
from agentstream.context import (
    BRACKETS,
    Compact,
    ContextCache,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Share,
    Tokens,
    build_context,
    compaction_event,
    shrink,
)
from agentstream.context.policy import Compress, Stub, results, rounds, turns
from agentstream.wire.events import (
    Compaction,
    Document,
    ModelOutput,
    Passage,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    Usage,
)
from tests.property.test_context_properties import calls_of
from tests.property.traces import AGENTS, fetch, search, traces
from tests.support.examples import examples


def _agent(name: str, window: int, **policy: Any) -> Agent:
    config = ContextConfig(policy=ContextPolicy(**policy), citations=BRACKETS)
    return Agent(
        name=name,
        system_prompt=f"You are agent {name}.",
        tools=[search, fetch],
        max_passes=6,
        context=config,
        model_limits=ModelLimits(window=Tokens(window)),
    )


POLICIES: dict[str, Agent] = {
    **AGENTS,
    "default": _agent("default", 12_000, output_reserve=Tokens(1_000), compact=Compact()),
    "running_turn": _agent(
        "running_turn",
        8_000,
        output_reserve=Tokens(500),
        min_gain=Share(0.05),
        shrink=(Compress(turns[:]), Stub(turns[:2]), Stub(rounds[:-1], when=Share(0.8))),
    ),
    "by_result": _agent(
        "by_result",
        6_000,
        output_reserve=Tokens(300),
        min_gain=Tokens(200),
        shrink=(Compress(results[:-2]), Stub(results[:4]), Stub(turns[-2:], when=Share(0.9))),
    ),
}
"""The property tests' agents, and agents whose shrinks take each path of the judge."""

MESSY: dict[str, Agent] = {
    "default": _agent("default", 20_000, compact=Compact()),
    "no_compaction": _agent("no_compaction", 12_000),
    "in_band": _agent("in_band", 40_000, compact=Compact()),
    "by_result": _agent(
        "by_result",
        40_000,
        min_gain=Share(0.05),
        shrink=(Compress(results[:-3]), Stub(turns[:-3]), Stub(turns[-3:], when=Share(0.85))),
    ),
    "running_turn": _agent(
        "running_turn",
        14_000,
        compact=Compact(),
        shrink=(Compress(turns[:]), Stub(turns[:3]), Stub(rounds[:-2]), Compress(results[:5])),
    ),
}
"""Agents for the long traces: the default policy in several windows (over it, in the band between
start_at and the compaction threshold, without compaction), and other prefix selections."""

SETTINGS = settings(
    max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@contextmanager
def full_planning() -> Iterator[None]:
    """Plan every pass in full (for states made inside the block)."""
    saved = shrink.SHORTCUTS
    shrink.SHORTCUTS = False
    try:
        yield
    finally:
        shrink.SHORTCUTS = saved


def outcome(built: Any) -> tuple:
    shortened = [(s.handle, s.form, s.by, s.at) for s in built.shrunk]
    return msgspec.json.encode(built.request), built.size_tokens, built.fits, built.compaction, shortened


def assert_same_contexts(events: list[Any], agent: Agent) -> None:
    cache = ContextCache()
    entries = [(f"{i}-0", e) for i, e in enumerate(events)]
    for index, turn_id, step in calls_of(events):
        fast = outcome(build_context(events[:index], agent, turn_id=turn_id, step=step))
        warm = outcome(cache.build("trace", entries[:index], agent, turn_id=turn_id, step=step))
        with full_planning():
            full = outcome(build_context(events[:index], agent, turn_id=turn_id, step=step))
        assert fast == full, f"call {index} ({turn_id}, step {step}): the shortcuts changed the context"
        assert warm == full, f"call {index} ({turn_id}, step {step}): the cache changed the context"


@st.composite
def reused_call_ids(draw: st.DrawFn) -> list[Any]:
    """A generated trace where some model outputs call ids that earlier outputs called (as some local models do)."""
    events = draw(traces())
    outputs = [i for i, e in enumerate(events) if isinstance(e, ModelOutput) and e.tool_calls]
    renamed: dict[str, str] = {}
    seen: list[str] = []
    for index in outputs:
        ids = [c.id for c in events[index].tool_calls]
        if seen and draw(st.integers(0, 3)) == 0:
            old = draw(st.sampled_from(seen))
            if old not in ids:
                renamed[ids[0]] = old
        seen.extend(ids)
    if not renamed:
        return events
    out = []
    for event in events:
        if isinstance(event, ModelOutput) and event.tool_calls:
            calls = tuple(msgspec.structs.replace(c, id=renamed.get(c.id, c.id)) for c in event.tool_calls)
            event = msgspec.structs.replace(event, tool_calls=calls)
        elif isinstance(event, ToolOutput) and event.call_id in renamed:
            event = msgspec.structs.replace(event, call_id=renamed[event.call_id])
        out.append(event)
    return out


@SETTINGS
@given(traces(), st.sampled_from(sorted(POLICIES)))
def test_the_shortcuts_build_what_planning_every_pass_builds(events, name):
    assert_same_contexts(events, POLICIES[name])


@SETTINGS
@given(reused_call_ids(), st.sampled_from(sorted(POLICIES)))
def test_the_shortcuts_hold_when_a_call_id_is_called_again(events, name):
    assert_same_contexts(events, POLICIES[name])


def conversation(seed: int, agent: Agent, turns_wanted: int) -> list[Any]:
    """A long conversation like the benchmark's (sources, citations, compactions where due)."""
    rng = random.Random(seed)
    words = "the of and to in is that for it as with was on be by this are from at or an".split()

    def text(count: int) -> str:
        return " ".join(rng.choice(words) for _ in range(count))

    events: list[Any] = []
    cache = ContextCache()
    calls = docs = 0
    for number in range(turns_wanted):
        turn = f"t{number}"
        events.append(TurnInput(turn_id=turn, agent=agent.name, text=text(rng.randint(5, 40))))
        built = cache.build("c", [(str(i), e) for i, e in enumerate(events)], agent, turn_id=turn, step=0)
        if built.compaction is not None:
            events.append(compaction_event(built.compaction, text(60)))
        step = 0
        for _ in range(rng.randint(1, 3)):
            tool_calls = []
            for _ in range(rng.randint(1, 3)):
                calls += 1
                tool_calls.append(ToolCall(id=f"c{calls}", name=rng.choice(["search", "fetch"]), arguments="{}"))
            events.append(ModelOutput(turn_id=turn, step=step, tool_calls=tuple(tool_calls), stop_reason="tool_calls"))
            step += 1
            for call in tool_calls:
                elements: tuple = ()
                if call.name == "search":
                    docs += 1
                    elements = (
                        Document(id=f"d{docs}", title=text(3)),
                        *(
                            Passage(id=f"d{docs}#{k}", ref=f"d{docs}", text=text(rng.randint(10, 120)))
                            for k in range(2)
                        ),
                    )
                events.append(
                    ToolOutput(
                        turn_id=turn, call_id=call.id, name=call.name, text=text(rng.randint(5, 400)), elements=elements
                    )
                )
        cite = f" [{rng.randint(1, docs * 3)}]" if docs else ""
        events.append(ModelOutput(turn_id=turn, step=step, content=text(rng.randint(10, 60)) + cite))
        events.append(TurnEnded(turn_id=turn, answer="."))
    events.append(TurnInput(turn_id=f"t{turns_wanted}", agent=agent.name, text="and then?"))
    return events


def messy_trace(seed: int, turns_wanted: int, size: float) -> list[Any]:
    """A long trace with what the agent loop can leave behind: reused call ids, results recorded
    before their call, duplicate and late results, failed turns, recorded usage, reasoning,
    answers that cite, and compactions (``size`` scales the texts)."""
    rng = random.Random(seed)
    words = "the of and to in is that for it as with was on be by this are from at or an".split()

    def text(count: float) -> str:
        return " ".join(rng.choice(words) for _ in range(int(count)))

    events: list[Any] = []
    calls = docs = 0
    finished: list[str] = []
    for number in range(turns_wanted):
        turn = f"t{number}"
        events.append(TurnInput(turn_id=turn, agent="a", text=text(rng.randint(3, 60) * size)))
        failed, late = False, []
        for step in range(rng.randint(0, 4)):
            usage = Usage(prompt_tokens=rng.choice([None, None, rng.randint(100, 9_000)]))
            reasoning = rng.choice([None, text(20)])
            if rng.random() < 0.25:
                cite = rng.choice(["", f" [{rng.randint(1, docs * 3 + 2)}]", f" [{rng.randint(1, docs * 3 + 2)}, 2]"])
                events.append(
                    ModelOutput(
                        turn_id=turn,
                        step=step,
                        content=text(rng.randint(3, 40)) + cite,
                        usage=usage,
                        reasoning=reasoning,
                    )
                )
                break
            ids = [f"c{calls + k}" for k in range(rng.randint(1, 3))]
            calls += len(ids)
            if calls > 4 and rng.random() < 0.15:  # a call id called again
                ids[0] = f"c{rng.randint(0, calls - len(ids) - 1)}"
            names = [rng.choice(["search", "fetch"]) for _ in ids]
            if rng.random() < 0.05:  # a result recorded before its call
                events.append(ToolOutput(turn_id=turn, call_id=ids[-1], name=names[-1], text=text(30)))
            events.append(
                ModelOutput(
                    turn_id=turn,
                    step=step,
                    usage=usage,
                    reasoning=reasoning,
                    stop_reason="tool_calls",
                    tool_calls=tuple(ToolCall(id=i, name=n, arguments="{}") for i, n in zip(ids, names, strict=True)),
                )
            )
            order = list(range(len(ids)))
            rng.shuffle(order)
            crash = rng.random() < 0.1
            answered = order[: rng.randint(0, len(ids) - 1)] if crash else order
            for position in answered:
                elements: tuple = ()
                if rng.random() < 0.6:
                    docs += 1
                    elements = (
                        Document(id=f"d{docs}", title=text(3)),
                        *(
                            Passage(id=f"d{docs}#{k}", ref=f"d{docs}", text=text(rng.randint(10, 300) * size))
                            for k in range(rng.randint(0, 3))
                        ),
                    )
                events.append(
                    ToolOutput(
                        turn_id=turn,
                        call_id=ids[position],
                        name=names[position],
                        text=text(rng.randint(0, 900) * size),
                        elements=elements,
                    )
                )
                if rng.random() < 0.1:
                    events.append(
                        ToolOutput(turn_id=turn, call_id=ids[position], name=names[position], text="DUPLICATE")
                    )
            if crash:
                failed = True
                late = [
                    ToolOutput(turn_id=turn, call_id=ids[p], name=names[p], text="LATE")
                    for p in order
                    if p not in answered
                ]
                break
        if number == turns_wanted - 1 and not failed:
            break  # the last turn is still running
        events.append(
            TurnFailed(turn_id=turn, code="cancelled", reason="r") if failed else TurnEnded(turn_id=turn, answer="a")
        )
        events.extend(late)
        finished.append(turn)
        if len(finished) > 2 and rng.random() < 0.08:
            events.append(Compaction(turn_id=turn, summary=text(40), kept_from_turn=rng.choice(finished[-4:])))
    return events


@pytest.mark.parametrize("name", sorted(MESSY))
def test_the_shortcuts_hold_over_long_messy_traces(name):
    for seed in range(examples(3)):  # one seed in the quick tier
        for size in (0.3, 1.0, 3.0):
            assert_same_contexts(messy_trace(seed * 10 + int(size * 10), 40 + 15 * seed, size), MESSY[name])


def test_the_shortcuts_hold_over_a_long_conversation_with_compactions():
    agent = _agent("long", 16_000, output_reserve=Tokens(1_000), compact=Compact())
    events = conversation(3, agent, 60)
    assert sum(1 for e in events if type(e).__name__ == "Compaction") >= 2
    assert_same_contexts(events, agent)
