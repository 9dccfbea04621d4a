"""The passes cap with ``resets_on_answer`` (issue 13): each answer to a request — a subagent's
result handed back to a delegation call — starts the count again; the decision and the context
library count alike."""

import pydantic

from agentstream.context import build_request
from agentstream.declarations.agents import Agent
from agentstream.declarations.tools import tool
from agentstream.delegation import Delegation
from agentstream.steps.decision import PASSES_CAP_CODE, CallModel, RecordResults, decide, passes_before
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnInput


@tool
def get(k: str) -> str:
    """Get a value."""
    return k


class Task(pydantic.BaseModel):
    task: str


ask = Delegation(name="ask", description="Ask the helper.", input=Task, agent="helper")
T1 = TurnInput(turn_id="t1", agent="boss", text="Do it all")


def boss(resets: bool) -> Agent:
    return Agent(
        name="boss", system_prompt="S", tools=[get, ask], max_passes=2, tool_rounds_after_cap=0, resets_on_answer=resets
    )


def one_pass(events, step, name, *, error=None):
    call = ToolCall(id=f"c{step}", name=name, arguments='{"k": "x"}' if name == "get" else '{"task": "x"}')
    events.append(ModelOutput(turn_id="t1", step=step, tool_calls=(call,), stop_reason="tool_calls"))
    events.append(ToolOutput(turn_id="t1", call_id=call.id, name=name, text="done", error=error))


def test_an_answer_starts_the_count_again_only_when_set():
    events = [T1]
    one_pass(events, 0, "get")
    one_pass(events, 1, "ask")  # the subagent answered: the count starts again after this call
    for resets, choice in ((False, "none"), (True, "auto")):
        agent = boss(resets)
        request = build_request(events, agent, turn_id="t1", step=2)
        assert request.tool_choice == choice and bool(request.tools) == resets
        assert decide(events, lambda name, a=agent: a) == CallModel(T1, agent, 2)
    agent = boss(True)
    one_pass(events, 2, "get")
    one_pass(events, 3, "get")  # two more passes: the cap again
    assert passes_before(
        agent, [e for e in events if isinstance(e, ModelOutput)], [e for e in events if isinstance(e, ToolOutput)]
    ) == (0, 1, 0, 1)
    assert build_request(events, agent, turn_id="t1", step=4).tool_choice == "none"


def test_a_failed_delegation_and_a_plain_tool_are_no_answer():
    agent = boss(True)
    events = [T1]
    one_pass(events, 0, "get")
    one_pass(events, 1, "ask", error="timed_out")  # no answer came back
    assert build_request(events, agent, turn_id="t1", step=2).tool_choice == "none"
    events.append(
        ModelOutput(
            turn_id="t1",
            step=2,
            tool_calls=(ToolCall(id="c2", name="get", arguments='{"k": "y"}'),),
            stop_reason="tool_calls",
        )
    )
    decision = decide(events, lambda name: agent)
    assert isinstance(decision, RecordResults) and decision.results[0].error == PASSES_CAP_CODE  # past the cap: not run


def test_without_reset_the_count_covers_the_turn():
    agent = boss(False)
    outputs = [
        ModelOutput(turn_id="t1", step=s, tool_calls=(ToolCall(id=f"c{s}", name="ask", arguments="{}"),))
        for s in range(3)
    ]
    results = [ToolOutput(turn_id="t1", call_id=f"c{s}", name="ask", text="ok") for s in range(3)]
    assert passes_before(agent, outputs, results) == (0, 1, 2)
    assert passes_before(boss(True), outputs, results) == (0, 0, 0)
