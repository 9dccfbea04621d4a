"""What a child's result becomes in its parent's tool result, one decision per function (pure):
a result checked against the task's schema (:func:`expected_result`), any other value
(:func:`data_result`), a failed child (:func:`failed_result`)."""

from __future__ import annotations

import pytest

from agentstream.delegation.handback import Handed, data_result, expected_result, failed_result
from agentstream.wire.events import ModelOutput, TaskInput, TurnFailed

WHO = "The 'worker' subagent"
SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}}, "required": ["verdict"]}


@pytest.mark.parametrize(
    ("case", "value", "text", "data", "error"),
    [
        ("JSON text that fits", '{"verdict": "yes"}', '{"verdict": "yes"}', {"verdict": "yes"}, None),
        ("in a code fence", '```json\n{"verdict": "no"}\n```', '{"verdict": "no"}', {"verdict": "no"}, None),
        ("a value that fits, as data", {"verdict": "no"}, '{"verdict": "no"}', {"verdict": "no"}, None),
        ("keys sorted", {"verdict": "no", "a": 1}, '{"a": 1, "verdict": "no"}', {"verdict": "no", "a": 1}, None),
        ("text that is not JSON", "yes", None, None, "schema_mismatch"),
        ("text that is not Unicode", '{"verdict": "\\ud800"}', None, None, "schema_mismatch"),
        ("JSON the schema refuses", '{"verdict": "maybe"}', None, {"verdict": "maybe"}, "schema_mismatch"),
        ("a value the schema refuses", ["yes"], None, ["yes"], "schema_mismatch"),
    ],
)
def test_a_result_checked_against_the_tasks_schema(case, value, text, data, error) -> None:
    handed = expected_result(WHO, SCHEMA, value)
    assert (handed.data, handed.error, handed.elements) == (data, error, ()), case
    if text is not None:
        assert handed.text == text, case
    else:
        assert handed.text.startswith(f"Error: {WHO}'s result "), case
        assert "Its result was:\n" in handed.text, case


class Opaque:
    def __str__(self) -> str:
        return "an opaque thing"


@pytest.mark.parametrize(
    ("case", "value", "expected"),
    [
        ("a mapping: sorted JSON and data", {"b": 1, "a": [2]}, Handed('{"a": [2], "b": 1}', data={"b": 1, "a": [2]})),
        ("a number", 3, Handed("3", data=3)),
        ("a value that is not JSON data: its text", Opaque(), Handed("an opaque thing")),
    ],
)
def test_any_other_result(case, value, expected) -> None:
    assert data_result(value) == expected, case


def test_a_failed_child_is_an_error_named_by_its_code_with_what_it_wrote() -> None:
    task = TaskInput(
        turn_id="c1",
        agent="worker",
        text="x",
        call_id="c1",
        parent_trace_id="P",
        parent_turn_id="t1",
        root_trace_id="P",
        depth=1,
    )
    events = [
        task,
        ModelOutput(turn_id="c1", step=0, content="half an answer"),
        TurnFailed(turn_id="c1", code="timed_out", reason="late"),
    ]
    handed = failed_result(WHO, events[-1], events)
    assert handed.error == "timed_out"
    assert handed.text.startswith(f"Error: {WHO} did not finish its task (timed_out): late.\n")
    assert (
        "(incomplete):\nhalf an answer\nWhat the subagent did: it failed (timed_out) after 1 model call(s)"
        in handed.text
    )
    assert handed.data["digest"]["ended"] == "failed"
