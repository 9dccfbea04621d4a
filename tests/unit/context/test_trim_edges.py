"""Where a trim's kept units may start and end (pure): the units up to the last that ends on one
of the ``end_on`` kinds, and from the first that starts on one of the ``start_on`` kinds."""

from __future__ import annotations

import pytest

from agentstream.context.request import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from agentstream.context.trimming import drop_after_last, drop_before_first

USER = [UserMessage(text="q")]
ANSWER = [AssistantMessage(content="a")]
CALL = [
    AssistantMessage(content="", tool_calls=(ToolCall(id="c", name="t", arguments="{}"),)),
    ToolResultMessage(call_id="c", name="t", text="r"),
]


@pytest.mark.parametrize(
    ("case", "units", "ends", "expected"),
    [
        ("no kinds: all", [USER, ANSWER], None, [USER, ANSWER]),
        ("up to the last of a kind", [USER, ANSWER, USER], frozenset({"assistant"}), [USER, ANSWER]),
        ("a unit ends on its last message", [USER, CALL], frozenset({"tool"}), [USER, CALL]),
        ("a call unit does not end on its call", [USER, CALL], frozenset({"assistant"}), []),
        ("none of the kind: none", [USER, USER], frozenset({"assistant"}), []),
        ("nothing", [], frozenset({"user"}), []),
    ],
)
def test_the_units_up_to_the_last_of_a_kind(case, units, ends, expected) -> None:
    assert drop_after_last(units, ends) == expected, case


@pytest.mark.parametrize(
    ("case", "units", "starts", "expected"),
    [
        ("no kinds: all", [ANSWER, USER], None, [ANSWER, USER]),
        ("from the first of a kind", [ANSWER, CALL, USER, ANSWER], frozenset({"user"}), [USER, ANSWER]),
        ("a call unit starts on its call", [USER, CALL], frozenset({"assistant"}), [CALL]),
        ("none of the kind: none", [ANSWER], frozenset({"user"}), []),
        ("nothing", [], frozenset({"user"}), []),
    ],
)
def test_the_units_from_the_first_of_a_kind(case, units, starts, expected) -> None:
    assert drop_before_first(units, starts) == expected, case
