"""Field cases of kind (f), results after parallel calls and after a cancel (C25, C27), and the
pure decisions of a cancelled turn."""

from __future__ import annotations

from agentstream import Agent, App, tool
from agentstream.context import build_request
from agentstream.context.request import AssistantMessage, ToolResultMessage, UserMessage
from agentstream.steps.decision import CallModel, CancelTurn, RunTools, decide
from agentstream.wire.events import (
    CancelRequested,
    ModelOutput,
    ToolCall,
    ToolOutput,
    ToolStarted,
    TurnFailed,
    TurnInput,
)


@tool
def read(path: str) -> str:
    """Read a file."""
    return path


@tool
def run_tests() -> str:
    """Run the tests."""
    return "ok"


@tool
def lint() -> str:
    """Lint."""
    return "ok"


agent = Agent(name="a", system_prompt="sys", tools=[read, run_tests, lint], max_passes=6)
app = App(agents=[agent])


def calls(*pairs: tuple[str, str]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(id=i, name=n, arguments="{}") for i, n in pairs)


def result(
    call_id: str, name: str, text: str, *, turn: str = "t1", late: bool = False, error: str | None = None
) -> ToolOutput:
    return ToolOutput(turn_id=turn, call_id=call_id, name=name, text=text, late=late, error=error)


def shape(messages) -> list[tuple]:
    out = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(("user", m.text))
        elif isinstance(m, AssistantMessage):
            out.append(("assistant", tuple(c.id for c in m.tool_calls), m.content))
        elif isinstance(m, ToolResultMessage):
            out.append(("tool", m.call_id, m.text))
    return out


def test_c25_results_in_call_order_whatever_the_arrival_order_duplicates_and_strays_dropped():
    events = [
        TurnInput(turn_id="t1", agent="a", text="read both"),
        ModelOutput(
            turn_id="t1", step=0, tool_calls=calls(("call_A", "read"), ("call_B", "read")), stop_reason="tool_calls"
        ),
        result("call_B", "read", "B-content"),  # B finished first
        result("call_A", "read", "A-content"),
        result("call_B", "read", "B-again"),  # a duplicate: first terminal result wins
        result("call_Z", "read", "stray"),  # no such call: never shown, never guessed
    ]
    request = build_request(events, agent, turn_id="t1", step=1)
    assert shape(request.messages) == [
        ("user", "read both"),
        ("assistant", ("call_A", "call_B"), ""),
        ("tool", "call_A", "A-content"),
        ("tool", "call_B", "B-content"),
    ]


def test_c27_cancel_while_tools_run_next_request_is_valid_and_the_late_result_stays_out():
    events = [
        TurnInput(turn_id="t1", agent="a", text="run the tests and lint"),
        ModelOutput(
            turn_id="t1",
            step=0,
            tool_calls=calls(("call_1", "run_tests"), ("call_2", "lint")),
            stop_reason="tool_calls",
        ),
        result("call_2", "lint", "lint ok"),
        CancelRequested(turn_id="t1", by="user"),
    ]
    decision = decide(events, app.agent)
    assert isinstance(decision, CancelTurn)
    # on cancel: a synthetic terminal result for call_1 only, then the turn ends as cancelled
    assert [(r.call_id, r.error) for r in decision.results] == [("call_1", "cancelled")]
    assert "may have partly run" in decision.results[0].text
    events += [*decision.results, TurnFailed(turn_id="t1", code=decision.code, reason=decision.reason)]
    events += [
        TurnInput(turn_id="t2", agent="a", text="Actually, just fix the typo."),
        result("call_1", "run_tests", "tests passed", late=True),  # the real result, after the user moved on
    ]
    request = build_request(events, agent, turn_id="t2", step=0)
    assert shape(request.messages) == [
        ("user", "run the tests and lint"),
        ("assistant", ("call_1", "call_2"), ""),
        ("tool", "call_1", decision.results[0].text),
        ("tool", "call_2", "lint ok"),
        ("user", "Actually, just fix the typo."),
    ]
    assert "tests passed" not in str(request)


def test_a_late_result_is_ignored_even_inside_its_own_turn():
    events = [
        TurnInput(turn_id="t1", agent="a", text="x"),
        ModelOutput(turn_id="t1", step=0, tool_calls=calls(("c1", "lint")), stop_reason="tool_calls"),
        result("c1", "lint", "outcome unknown", error="outcome_unknown"),
        result("c1", "lint", "lint ok", late=True),
    ]
    request = build_request(events, agent, turn_id="t1", step=1)
    assert shape(request.messages)[-1] == ("tool", "c1", "outcome unknown")


def test_a_cancelled_turn_with_a_running_model_call_ends_without_results():
    events = [TurnInput(turn_id="t1", agent="a", text="x"), CancelRequested(turn_id="t1", by="ops", reason="stop")]
    decision = decide(events, app.agent)
    assert isinstance(decision, CancelTurn) and decision.results == ()
    assert decision.code == "cancelled" and decision.reason == "the turn was cancelled by ops: stop"


def test_a_cancel_of_a_queued_turn_takes_effect_when_it_comes_up():
    events = [
        TurnInput(turn_id="t1", agent="a", text="x"),
        TurnInput(turn_id="t2", agent="a", text="y"),
        CancelRequested(turn_id="t2"),
    ]
    assert isinstance(decide(events, app.agent), CallModel)  # t1 runs untouched
    events += [ModelOutput(turn_id="t1", step=0, content="done"), TurnFailed(turn_id="t1", code="x", reason="y")]
    decision = decide(events, app.agent)
    assert isinstance(decision, CancelTurn) and decision.turn.turn_id == "t2"


def test_tool_started_is_a_record_only_event():
    events = [
        TurnInput(turn_id="t1", agent="a", text="x"),
        ModelOutput(turn_id="t1", step=0, tool_calls=calls(("c1", "lint")), stop_reason="tool_calls"),
        ToolStarted(turn_id="t1", call_id="c1", name="lint", worker="w1", job="s/1-0"),
    ]
    assert isinstance(decide(events, app.agent), RunTools)
    request = build_request([*events, result("c1", "lint", "ok")], agent, turn_id="t1", step=1)
    assert shape(request.messages)[-1] == ("tool", "c1", "ok")
