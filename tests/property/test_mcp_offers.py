"""Recorded MCP tools (``tools_offered`` events) in generated traces: every call offers the agent's
own tools then the last tools recorded for it before the call, whatever the shrinks do, and the
cache, the shortcuts and a fold from the start agree at every call."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentstream.context import build_context
from agentstream.steps.offers import offer_digest
from agentstream.wire.events import ModelOutput, OfferedTool, ToolsOffered, TurnInput
from tests.property.test_context_properties import agent_of, calls_of
from tests.property.test_context_shortcuts import SETTINGS, assert_same_contexts
from tests.property.traces import traces


def _offer(agent: str, turn_id: str, step: int, names: list[str], size: int) -> ToolsOffered:
    tools = tuple(
        OfferedTool(
            name=n,
            description="d" * size,
            server="srv",
            parameters={"type": "object", "properties": {"q": {"type": "string", "description": "p" * size}}},
        )
        for n in names
    )
    return ToolsOffered(turn_id=turn_id, step=step, agent=agent, tools=tools, digest=offer_digest(tools))


@st.composite
def offered_traces(draw: st.DrawFn) -> list[Any]:
    """A generated trace with ``tools_offered`` events before some model outputs (and some for another agent)."""
    events = draw(traces())
    agent = next(e.agent for e in events if isinstance(e, TurnInput))
    out: list[Any] = []
    for event in events:
        if isinstance(event, ModelOutput) and draw(st.integers(0, 2)) == 0:
            names = draw(st.lists(st.sampled_from(["m_one", "m_two", "m_three"]), unique=True, max_size=3))
            owner = agent if draw(st.integers(0, 4)) else "someone_else"
            out.append(_offer(owner, event.turn_id, event.step, names, draw(st.sampled_from([0, 200, 4000]))))
        out.append(event)
    return out


@SETTINGS
@given(offered_traces())
def test_each_call_offers_the_tools_recorded_last_and_every_path_agrees(events):
    agent = agent_of(events)
    turns = {e.turn_id: e for e in events if isinstance(e, TurnInput)}
    for index, turn_id, step in calls_of(events):
        own = [t.name for t in agent.offered_tools(turns[turn_id])]  # the agent's own the turn does not turn off
        request = build_context(events[:index], agent, turn_id=turn_id, step=step).request
        last = next(
            (e for e in reversed(events[:index]) if isinstance(e, ToolsOffered) and e.agent == agent.name), None
        )
        names = [t.name for t in request.tools]
        if not names:  # the last pass offers no tools
            assert agent.tool_choice_for(step) == "none"
            continue
        wanted = own + ([t.name for t in last.tools] if last is not None else [])
        assert names[: len(wanted)] == wanted, (names, wanted)
        assert all(n == "reopen" for n in names[len(wanted) :])  # then only the context library's reopen tool
    assert_same_contexts(events, agent)
