"""Replay reads a trace once and rebuilds every model call as a rebuild from the start would."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from agentstream import Agent
from agentstream.context import (
    BRACKETS,
    Compact,
    ContextCache,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Tokens,
    compaction_event,
)
from agentstream.context._context_fold import ContextFold
from agentstream.delegation import offered_agent
from agentstream.models import formats
from agentstream.steps.replay import RebuiltCall, _candidates, _endpoint_of, rebuild_calls
from agentstream.steps.summarising import SUMMARY_FAILED, Summarise, next_call, sent_request
from agentstream.wire.events import (
    CompactionFailed,
    Document,
    ModelOutput,
    Passage,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnInput,
)
from tests.property.test_context_shortcuts import messy_trace
from tests.property.traces import fetch, search


def _agent(name: str, window: int) -> Agent:
    policy = ContextPolicy(output_reserve=Tokens(1_000), compact=Compact())
    return Agent(
        name=name,
        system_prompt=f"You are {name}.",
        tools=[search, fetch],
        max_passes=6,
        context=ContextConfig(policy=policy, citations=BRACKETS),
        model_limits=ModelLimits(window=Tokens(window)),
    )


AGENTS = {"a": _agent("a", 16_000), "b": _agent("b", 9_000)}


def rebuild_each_from_the_start(events: list[Any], agent_of, **kwargs: Any) -> list[RebuiltCall]:
    """What replay did before: every call's request built from the whole prefix of the trace."""
    endpoints = kwargs.get("endpoints") or {}
    turns: dict[str, TurnInput] = {}
    out = []
    for index, event in enumerate(events):
        if isinstance(event, TurnInput):
            turns.setdefault(event.turn_id, event)
        elif isinstance(event, ModelOutput):
            turn = turns[event.turn_id]
            agent = offered_agent(agent_of(turn.agent), turn, endpoints)
            request = sent_request(events[:index], agent, turn_id=event.turn_id, step=event.step)
            endpoint = _endpoint_of(event, agent, endpoints, kwargs.get("model_name"))
            bodies = list(_candidates(request, endpoint, event, configured=False))
            body = next((b for b in bodies if formats.fingerprint(b) == event.request_sha256), bodies[0])
            out.append(
                RebuiltCall(
                    event.turn_id, event.step, body, event.request_sha256, formats.fingerprint(body), endpoint, False
                )
            )
    return out


def recorded(events: list[Any]) -> list[Any]:
    """The trace with each model output's fingerprint as a rebuild from the start gives it."""
    calls = iter(rebuild_each_from_the_start(events, AGENTS.get))
    return [
        msgspec.structs.replace(e, request_sha256=next(calls).rebuilt_sha256) if isinstance(e, ModelOutput) else e
        for e in events
    ]


def agent_loop_trace(seed: int, turns_wanted: int) -> list[Any]:
    """Turns of two agents, each model call made as the agent loop makes it: a summary first when
    one is due (written, or failed so that the call goes out trimmed)."""
    rng = random.Random(seed)
    words = "the of and to in is that for it as with was on be by this are from at or an".split()

    def text(count: int) -> str:
        return " ".join(rng.choice(words) for _ in range(count))

    events: list[Any] = []
    cache = ContextCache()
    calls = docs = 0

    def call(agent: Agent, turn: str, step: int) -> None:
        entries = [(str(i), e) for i, e in enumerate(events)]
        decision = next_call(cache.build("t", entries, agent, turn_id=turn, step=step), events, agent)
        if isinstance(decision, Summarise):
            plan = decision.plan
            if rng.random() < 0.3:
                events.append(
                    CompactionFailed(
                        turn_id=plan.turn_id, kept_from_turn=plan.kept_from_turn, code=SUMMARY_FAILED, reason="refused"
                    )
                )
            else:
                events.append(compaction_event(plan, text(50)))

    for number in range(turns_wanted):
        turn, name = f"t{number}", rng.choice(sorted(AGENTS))
        events.append(TurnInput(turn_id=turn, agent=name, text=text(rng.randint(5, 40))))
        step = 0
        for _ in range(rng.randint(1, 3)):
            call(AGENTS[name], turn, step)
            tool_calls = []
            for _ in range(rng.randint(1, 3)):
                calls += 1
                tool_calls.append(ToolCall(id=f"c{calls}", name=rng.choice(["search", "fetch"]), arguments="{}"))
            events.append(ModelOutput(turn_id=turn, step=step, tool_calls=tuple(tool_calls), stop_reason="tool_calls"))
            step += 1
            for tool_call in tool_calls:
                docs += 1
                elements = (
                    Document(id=f"d{docs}", title=text(3)),
                    Passage(id=f"d{docs}#0", ref=f"d{docs}", text=text(80)),
                )
                events.append(
                    ToolOutput(
                        turn_id=turn,
                        call_id=tool_call.id,
                        name=tool_call.name,
                        text=text(rng.randint(5, 500)),
                        elements=elements if tool_call.name == "search" else (),
                    )
                )
        call(AGENTS[name], turn, step)
        events.append(ModelOutput(turn_id=turn, step=step, content=text(20) + f" [{rng.randint(1, docs * 2)}]"))
        events.append(TurnEnded(turn_id=turn, answer="."))
    return events


@pytest.fixture
def folded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the events every fold of a trace reads."""
    counts: list[int] = []
    feed = ContextFold.feed

    def counting(self: ContextFold, events: Any) -> None:
        counts.append(len(events))
        feed(self, events)

    monkeypatch.setattr(ContextFold, "feed", counting)
    return counts


@pytest.mark.parametrize("seed", range(3))
def test_replay_reads_the_trace_once_per_agent_and_rebuilds_what_a_rebuild_from_the_start_does(seed, folded):
    events = recorded(agent_loop_trace(seed, 40))
    assert any(isinstance(e, CompactionFailed) for e in events) or seed != 0
    expected = rebuild_each_from_the_start(events, AGENTS.get)
    folded.clear()
    calls = rebuild_calls(events, AGENTS.get)
    assert calls == expected
    assert all(c.matches for c in calls)
    assert sum(folded) <= len(events) * len(AGENTS)


@pytest.mark.parametrize("seed", range(3))
def test_replay_of_messy_traces(seed):
    agent = _agent("a", 20_000)
    events = messy_trace(seed, 40, 1.0)
    assert rebuild_calls(events, {"a": agent}.get) == rebuild_each_from_the_start(events, {"a": agent}.get)
