"""What a fork of a conversation starts with (:func:`agentstream.steps.forking.fork_plan`),
without Redis: the events copied for each fork point, the refusals, and that every copied model
call is rebuilt from the fork as it was from the source (the property ``trace verify`` checks)."""

from __future__ import annotations

import pytest

from agentstream.context import build_context
from agentstream.declarations.agents import Agent
from agentstream.errors import ForkRefused
from agentstream.steps.forking import fork_line, fork_plan
from agentstream.wire.events import (
    CancelRequested,
    ForkedFrom,
    ModelOutput,
    TaskInput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)

AGENT = Agent(name="a", system_prompt="You help.")
CALL = ToolCall(id="c1", name="look", arguments="{}")


def _source() -> list[tuple[str, object]]:
    """t1 (a tool round), then t2 queued while t1 ran, t2 answered, t3 running."""
    events = [
        TurnInput(turn_id="t1", agent="a", text="one", metadata={"u": "7"}, reply_to="agentstream:replies:x"),
        ModelOutput(turn_id="t1", step=0, tool_calls=(CALL,), stop_reason="tool_calls"),
        TurnInput(turn_id="t2", agent="a", text="two"),  # queued behind t1
        ToolOutput(turn_id="t1", call_id="c1", name="look", text="seen"),
        ModelOutput(turn_id="t1", step=1, content="one done"),
        TurnEnded(turn_id="t1", answer="one done"),
        ModelOutput(turn_id="t2", step=0, content="two done"),
        TurnEnded(turn_id="t2", answer="two done"),
        ToolOutput(turn_id="t1", call_id="c1", name="look", text="late", late=True),
        TurnInput(turn_id="t3", agent="a", text="three"),
    ]
    return [(f"{i + 1}-0", e) for i, e in enumerate(events)]


def _turns(events) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.turn_id) for e in events]


def test_a_fork_after_a_turn_copies_that_turn_and_those_before_but_no_later_ones():
    plan = fork_plan(_source(), "c1", fork_id="c1-f", turn_id="t1", by="me")
    assert _turns(plan.events) == [
        ("TurnInput", "t1"),
        ("ModelOutput", "t1"),
        ("ToolOutput", "t1"),
        ("ModelOutput", "t1"),
        ("TurnEnded", "t1"),
    ]  # t2's input, queued meanwhile, and t1's late result after the point are not copied
    assert plan.open_turn is None and plan.turn is None
    assert plan.forked_from == ForkedFrom(
        source_trace_id="c1", source_entry_id="6-0", turn_id="t1", copied=5, fork_id="c1-f", by="me"
    )
    assert (
        fork_line(plan.forked_from)
        == "forked from trace c1 (its entries up to 6-0), after turn t1 by me; 5 events copied"
    )
    later = fork_plan(_source(), "c1", fork_id="c1-g", turn_id="t2")
    assert [t for _, t in _turns(later.events)].count("t2") == 3 and later.forked_from.source_entry_id == "8-0"


def test_a_fork_with_the_input_replaced_copies_the_turns_before_and_publishes_the_new_one():
    plan = fork_plan(_source(), "c1", fork_id="c1-f", turn_id="t2", text="TWO, edited")
    assert {t for _, t in _turns(plan.events)} == {"t1"} and len(plan.events) == 5
    assert plan.turn is not None
    assert (plan.turn.trace_id, plan.turn.turn_id, plan.turn.agent, plan.turn.text) == (
        "c1-f",
        "t2",
        "a",
        "TWO, edited",
    )
    first = fork_plan(_source(), "c1", fork_id="c1-h", turn_id="t1", text="ONE, edited")
    assert first.events == () and first.forked_from.source_entry_id == ""
    assert (
        first.turn is not None and first.turn.metadata == {"u": "7"} and first.turn.reply_to == "agentstream:replies:x"
    )
    assert first.forked_from.replaced and "whose input it replaced" in fork_line(first.forked_from)


def test_a_fork_before_a_model_call_holds_the_turn_open_up_to_that_call():
    plan = fork_plan(_source(), "c1", fork_id="c1-f", turn_id="t1", step=1)
    assert _turns(plan.events) == [("TurnInput", "t1"), ("ModelOutput", "t1"), ("ToolOutput", "t1")]
    assert plan.open_turn == "t1" and plan.forked_from.step == 1 and plan.forked_from.source_entry_id == "4-0"
    cancelled = [*_source()[:3], ("3-1", CancelRequested(turn_id="t1")), *_source()[3:]]
    again = fork_plan(cancelled, "c1", fork_id="c1-f", turn_id="t1", step=1)
    assert not any(isinstance(e, CancelRequested) for e in again.events)  # the fork's turn goes on


@pytest.mark.parametrize(
    ("kwargs", "kind", "says"),
    [
        ({"turn_id": "t9"}, "not_found", "holds no turn 't9' (its latest turns: t1, t2, t3)"),
        ({"turn_id": "t1", "step": 5}, "not_found", "has no model call 5 (its calls: 0, 1)"),
        ({"turn_id": "t3"}, "conflict", "turn 't3' of trace 'c1' has not ended"),
        ({"turn_id": "t1", "step": 0, "text": "x"}, "invalid", "not both"),
        ({"turn_id": "t1", "fork_id": "c1"}, "invalid", "a trace id of its own"),
    ],
)
def test_a_fork_that_cannot_be_made_is_refused_saying_why(kwargs, kind, says):
    kwargs = {"fork_id": "c1-f", **kwargs}
    with pytest.raises(ForkRefused) as refused:
        fork_plan(_source(), "c1", **kwargs)
    assert refused.value.kind == kind and says in str(refused.value)


def test_an_empty_source_and_a_delegated_task_are_refused():
    with pytest.raises(ForkRefused, match="no trace 'gone'") as refused:
        fork_plan([], "gone", fork_id="x", turn_id="t1")
    assert refused.value.kind == "not_found"
    task = [("1-0", TaskInput(turn_id="t1", agent="a", text="sub", parent_trace_id="p", call_id="c"))]
    with pytest.raises(ForkRefused, match="delegated task"):
        fork_plan(task, "p/c", fork_id="x", turn_id="t1")


def test_a_turn_before_the_point_that_has_not_ended_is_refused():
    entries = [
        ("1-0", TurnInput(turn_id="t1", agent="a", text="one")),
        ("2-0", TurnInput(turn_id="t2", agent="a", text="two")),
    ]
    with pytest.raises(ForkRefused, match="turn 't1' of trace 'c1', before 't2', has not ended") as refused:
        fork_plan(entries, "c1", fork_id="x", turn_id="t2", text="edited")
    assert refused.value.kind == "conflict"


def test_a_fork_of_a_fork_copies_no_second_forked_from():
    plan = fork_plan(_source(), "c1", fork_id="c1-f", turn_id="t1")
    forked = [("1-0", plan.forked_from), *[(f"{i + 2}-0", e) for i, e in enumerate(plan.events)]]
    again = fork_plan(forked, "c1-f", fork_id="c1-f-f", turn_id="t1")
    assert again.events == plan.events and again.forked_from.source_trace_id == "c1-f"


@pytest.mark.parametrize("turn_id", ["t1", "t2"])
def test_every_copied_model_call_is_built_from_the_fork_as_from_the_source(turn_id):
    source = _source()
    plan = fork_plan(source, "c1", fork_id="c1-f", turn_id=turn_id)
    fork = [plan.forked_from, *plan.events]
    events = [e for _, e in source]
    for i, event in enumerate(fork):
        if isinstance(event, ModelOutput):
            at = events.index(event)
            before = build_context(events[:at], AGENT, turn_id=event.turn_id, step=event.step)
            after = build_context(fork[:i], AGENT, turn_id=event.turn_id, step=event.step)
            assert after.request == before.request


def test_a_failed_turn_can_be_forked_after():
    entries = [
        ("1-0", TurnInput(turn_id="t1", agent="a", text="one")),
        ("2-0", TurnFailed(turn_id="t1", code="x", reason="y")),
    ]
    assert len(fork_plan(entries, "c1", fork_id="x", turn_id="t1").events) == 2
