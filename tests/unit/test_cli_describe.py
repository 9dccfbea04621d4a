"""The one line ``agentstream ask`` and ``trace show`` print per event (:func:`describe`): a
table by event type, one row per case."""

from __future__ import annotations

import typing

import msgspec
import pytest

from agentstream.cli.commands import DESCRIPTIONS, describe
from agentstream.wire.events import (
    CancelRequested,
    CitedSource,
    Compaction,
    Document,
    Event,
    ModelOutput,
    TaskInput,
    ToolCall,
    ToolOutput,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
    UnknownEvent,
)


def test_every_stored_event_type_has_a_line() -> None:
    assert [t.__name__ for t in typing.get_args(Event) if t not in DESCRIPTIONS] == []


class Ours(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str


class MyTurn(TurnInput, frozen=True, kw_only=True, tag="my_turn"):
    pass


@pytest.mark.parametrize(
    ("case", "event", "line"),
    [
        (
            "a task names its depth, call and parent",
            TaskInput(
                turn_id="c",
                agent="w",
                text="do",
                call_id="c1",
                parent_trace_id="P",
                parent_turn_id="t",
                root_trace_id="P",
                depth=2,
            ),
            "» task for w (depth 2, for call c1 of trace P): do",
        ),
        ("a turn", TurnInput(turn_id="t", agent="a", text="hi"), "» turn for a: hi"),
        ("a subclass of a turn: a turn's line", MyTurn(turn_id="t", agent="a", text="hi"), "» turn for a: hi"),
        (
            "a turn that rolls one back",
            TurnInput(turn_id="t", agent="a", text="hi", rolls_back="t0"),
            "» turn for a (rolls back turn t0: left out of later contexts): hi",
        ),
        (
            "a model call with tool calls shows its text",
            ModelOutput(
                turn_id="t",
                step=1,
                content="let me look",
                stop_reason="tool_calls",
                latency_ms=1500,
                tool_calls=(ToolCall(id="c9", name="search", arguments='{"q": 1}'),),
            ),
            '· model call 1 (1.5 s, tool_calls)\n  → tool call search({"q": 1}) [c9]\n  text: let me look',
        ),
        (
            "a model call without tool calls does not repeat its text",
            ModelOutput(turn_id="t", step=0, content="the answer", stop_reason="stop"),
            "· model call 0 (0.0 s, stop)",
        ),
        (
            "a tool result: cut at 300 characters, its error marked, its elements listed",
            ToolOutput(
                turn_id="t",
                call_id="c9",
                name="search",
                text="x" * 301,
                error="boom",
                elements=tuple(Document(id=f"d{i}") for i in range(9)),
            ),
            "  ← tool result search [c9] (error): "
            + "x" * 300
            + "…\n    elements: "
            + ", ".join(f"document d{i}" for i in range(8))
            + ", … 1 more",
        ),
        (
            "an answer with its sources",
            TurnEnded(turn_id="t", answer="yes", citations=(CitedSource(number=1, id="x", title="T", url="u"),)),
            "✓ answer: yes\n  [1] T — u",
        ),
        ("a failure", TurnFailed(turn_id="t", code="timed_out", reason="late"), "✗ turn failed (timed_out): late"),
        (
            "an event of a type the app does not register",
            UnknownEvent(stored_type="mine", raw={"a": "é"}),
            '? mine (a type this app does not register; as stored): {"a": "é"}',
        ),
        (
            "a tool started on no known worker",
            ToolStarted(turn_id="t", call_id="c9", name="search"),
            "  ▸ tool started search [c9] on ?",
        ),
        (
            "a cancel with its reason",
            CancelRequested(turn_id="t", by="me", reason="enough"),
            "■ cancel of turn t requested by me: enough",
        ),
        (
            "a summary, cut",
            Compaction(turn_id="t", summary="s" * 301, replaced_turns=3, kept_from_turn="t5"),
            "⋯ a summary now replaces 3 earlier turn(s) (kept from turn t5): " + "s" * 300 + "…",
        ),
        ("an event no row knows: its repr", Ours(turn_id="t"), "Ours(turn_id='t')"),
    ],
)
def test_the_line_of_each_event(case: str, event, line: str) -> None:
    assert describe(event) == line, case
