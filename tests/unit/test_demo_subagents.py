"""The demo app's subagent and long-conversation agents (pure: no model, no Redis)."""

from __future__ import annotations

import json

import pytest

from agentstream.context import build_context
from agentstream.delegation import HandOff, hand_off
from agentstream.demo.app import app, ask_assistant, notes
from agentstream.steps.summarising import Summarise, next_call
from agentstream.wire.events import ModelOutput, ToolCall, TurnEnded, TurnInput


def test_the_manager_hands_a_question_to_a_subagent():
    assert app.agent("manager").tool("ask_assistant") is ask_assistant
    call = ToolCall(id="c1", name="ask_assistant", arguments=json.dumps({"task": "1234 * 5678"}))
    events = [
        TurnInput(turn_id="t1", agent="manager", text="What is 1234 * 5678?"),
        ModelOutput(turn_id="t1", step=0, tool_calls=(call,), stop_reason="tool_calls"),
    ]
    outcome = hand_off(ask_assistant, "conv", events, call, "t1")
    assert isinstance(outcome, HandOff) and outcome.task.agent == ask_assistant.agent
    assert outcome.task.text == "What is 1234 * 5678?"


@pytest.mark.parametrize(
    "answer",
    ["Python is readable.", "Python is a readable, general-purpose language with a large standard library. " * 3],
)
def test_the_notes_agent_compacts_from_its_second_turn(answer):
    # the README's `--turns 2`: the first turn alone is under the threshold, any second turn is over it
    events: list = []
    due = []
    for n in range(1, 4):
        events.append(TurnInput(turn_id=f"t{n}", agent="notes", text="Tell me one thing about Python."))
        if isinstance(next_call(build_context(events, notes, turn_id=f"t{n}", step=0), events, notes), Summarise):
            due.append(n)
        events += [ModelOutput(turn_id=f"t{n}", step=0, content=answer), TurnEnded(turn_id=f"t{n}", answer=answer)]
    assert due[0] == 2
