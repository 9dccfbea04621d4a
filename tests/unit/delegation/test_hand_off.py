"""Delegations as tools, and the hand-off of a call to a child trace (pure)."""

from __future__ import annotations

import copy
import json

import pydantic
import pytest

from agentstream.context import build_request
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.declarations.tools import tool
from agentstream.delegation import (
    Delegation,
    HandOff,
    child_trace_id,
    children_of,
    hand_off,
    offered_agent,
    task_digest,
)
from agentstream.errors import ConfigError
from agentstream.steps.decision import CallModel, RunTools, decide
from agentstream.wire.events import Document, ModelOutput, Passage, Source, TaskInput, ToolCall, ToolOutput, TurnInput


class Research(pydantic.BaseModel):
    topic: str = pydantic.Field(description="The topic to research.")


class Review(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    question: str
    sources: list[Source] = []
    document: Document | None = None


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return topic


research = Delegation(name="research", description="Research a topic.", input=Research, agent="worker", max_depth=2)
review = Delegation(
    name="review",
    description="Review sources.",
    input=Review,
    agent="worker",
    result_schema={"type": "object", "required": ["verdict"]},
)
LEAD = Agent(name="lead", system_prompt="Lead.", tools=[research, review])
WORKER = Agent(name="worker", system_prompt="Worker.", tools=[lookup, research])
APP = App(agents=[LEAD, WORKER])

ROOT_TURN = TurnInput(turn_id="t1", agent="lead", text="Compare A and B")


def call(call_id: str, name: str = "research", **arguments) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


def asked(turn: TurnInput, *calls: ToolCall) -> list:
    return [turn, ModelOutput(turn_id=turn.turn_id, step=0, tool_calls=calls, stop_reason="tool_calls")]


def test_a_delegation_is_a_tool_whose_arguments_are_the_input_fields():
    assert research.parameters["properties"]["topic"]["description"] == "The topic to research."
    assert research.parameters["required"] == ["topic"]
    assert [d.name for d in build_request([ROOT_TURN], LEAD, turn_id="t1", step=0).tools] == ["research", "review"]
    assert APP.tool_queues == ["default"]  # a delegation has no tool queue


def test_an_element_field_is_shown_as_the_number_of_an_element():
    props = review.parameters["properties"]
    assert props["sources"]["items"] == {"type": "integer"} and "numbers of sources" in props["sources"]["description"]
    assert {"type": "integer"} in props["document"]["anyOf"]


def test_a_delegation_to_an_agent_the_app_lacks_is_refused_at_startup():
    stray = Delegation(name="stray", description="x", input=Research, agent="nobody")
    with pytest.raises(ConfigError, match="nobody"):
        App(agents=[Agent(name="a", system_prompt="S", tools=[stray])])


def test_an_element_field_that_cannot_be_filled_and_a_bad_schema_are_refused():
    class Nested(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        by_name: dict[str, Source]

    with pytest.raises(ConfigError, match="by_name"):
        Delegation(name="n", description="x", input=Nested, agent="worker")
    with pytest.raises(ConfigError, match="result_schema"):
        Delegation(name="s", description="x", input=Research, agent="worker", result_schema={"type": "no-such-type"})


def test_hand_off_opens_a_child_whose_first_event_is_the_task_input():
    events = asked(ROOT_TURN, call("call_1", topic="A"))
    outcome = hand_off(research, "conv", events, events[1].tool_calls[0], "t1")
    assert isinstance(outcome, HandOff)
    assert outcome.child_trace_id == child_trace_id("conv", "call_1") == "conv/call_1"
    task = outcome.task
    assert isinstance(task, TaskInput) and isinstance(task, TurnInput)
    assert (task.call_id, task.parent_trace_id, task.parent_turn_id, task.root_trace_id, task.depth) == (
        "call_1",
        "conv",
        "t1",
        "conv",
        1,
    )
    assert task.agent == "worker" and task.text == "A" and task.arguments == {"topic": "A"} and task.expects is None
    assert task.lineage == (task_digest("worker", {"topic": "A"}),)


def test_hand_off_of_arguments_that_do_not_fit_gives_an_error_result_and_no_child():
    events = asked(ROOT_TURN, call("call_1", subject="A"))
    outcome = hand_off(research, "conv", events, events[1].tool_calls[0], "t1")
    assert isinstance(outcome, ToolOutput) and outcome.error == "invalid_arguments"
    assert "topic" in outcome.text and outcome.call_id == "call_1"


def test_hand_off_of_arguments_that_are_not_unicode_gives_an_error_result_and_no_child():
    # json.loads makes a lone surrogate of "\\ud800"; the child's task holding it could not be
    # stored, and the delegation job failed on every delivery instead of telling the model
    raw = ToolCall(id="call_1", name="research", arguments='{"topic": "A \\ud800 B"}')
    events = [ROOT_TURN, ModelOutput(turn_id="t1", step=0, tool_calls=(raw,), stop_reason="tool_calls")]
    outcome = hand_off(research, "conv", events, raw, "t1")
    assert isinstance(outcome, ToolOutput) and outcome.error == "invalid_arguments", outcome
    assert "lone high UTF-16 surrogate" in outcome.text and "`topic`" in outcome.text


def test_the_task_names_the_schema_and_elements_come_from_the_parents_numbering():
    doc = Document(id="doc-1", title="D", text="whole")
    part = Passage(id="p-1", ref="doc-1", text="part")
    found = ToolOutput(turn_id="t1", call_id="c0", name="lookup", text="found", elements=(doc, part))
    first = ModelOutput(
        turn_id="t1", step=0, tool_calls=(ToolCall(id="c0", name="lookup", arguments="{}"),), stop_reason="tool_calls"
    )
    review_call = call("call_2", name="review", question="Is it right?", sources=[2], document=1)
    events = [
        ROOT_TURN,
        first,
        found,
        ModelOutput(turn_id="t1", step=1, tool_calls=(review_call,), stop_reason="tool_calls"),
    ]
    outcome = hand_off(review, "conv", events, review_call, "t1")
    assert isinstance(outcome, HandOff)
    assert outcome.task.elements == (part, doc)
    assert outcome.task.arguments == {"question": "Is it right?", "sources": ["p-1"], "document": "doc-1"}
    assert outcome.task.expects == {"type": "object", "required": ["verdict"]}
    assert "Is it right?" in outcome.task.text and '"required": ["verdict"]' in outcome.task.text
    wrong = call("call_3", name="review", question="?", document=2)  # 2 is a passage, not a document
    refused = hand_off(review, "conv", events, wrong, "t1")
    assert isinstance(refused, ToolOutput) and refused.error == "invalid_arguments" and "document" in refused.text


def child(depth: int, *, lineage=(), root="root", call_id="call_x") -> TaskInput:
    return TaskInput(
        turn_id=call_id,
        agent="worker",
        text="task",
        call_id=call_id,
        parent_trace_id="p",
        parent_turn_id="t",
        root_trace_id=root,
        depth=depth,
        delegation="research",
        lineage=lineage,
    )


def test_c30_depth_and_root_travel_in_every_task_input():
    first = hand_off(research, "root", asked(ROOT_TURN, call("c1", topic="A")), call("c1", topic="A"), "t1")
    assert isinstance(first, HandOff)
    level1 = first.task
    grandchild_call = call("c2", topic="A, part 1")
    second = hand_off(research, first.child_trace_id, asked(level1, grandchild_call), grandchild_call, level1.turn_id)
    assert isinstance(second, HandOff)
    assert second.task.depth == 2 and second.task.root_trace_id == "root" and second.task.parent_trace_id == "root/c1"
    assert second.child_trace_id == "root/c1/c2"


def test_c30_at_the_depth_limit_the_tool_is_withheld_and_a_forced_call_gets_an_error():
    at_limit = child(2)  # research.max_depth == 2
    offered = offered_agent(WORKER, at_limit)
    assert [t.name for t in offered.tools] == ["lookup"]
    assert offered_agent(WORKER, at_limit) is offered  # the same object for the same inputs
    assert [d.name for d in build_request([at_limit], offered, turn_id=at_limit.turn_id, step=0).tools] == ["lookup"]
    assert decide([at_limit], APP.agent) == CallModel(at_limit, offered, 0)
    # one level up, it is offered
    assert [t.name for t in offered_agent(WORKER, child(1)).tools] == ["lookup", "research"]
    # the model calls it anyway: the call goes to the delegation service (not an unknown-tool error) ...
    forced = call("c9", topic="refactor module M")
    events = asked(at_limit, forced)
    decision = decide(events, APP.agent)
    assert isinstance(decision, RunTools) and decision.agent.tool("research") is research
    # ... which gives it an error result instead of a child
    outcome = hand_off(research, "p/call_x", events, forced, at_limit.turn_id)
    assert isinstance(outcome, ToolOutput) and outcome.error == "depth_limit"
    assert "depth limit" in outcome.text and "yourself" in outcome.text


def test_c30_an_identical_task_to_the_same_agent_down_the_chain_is_refused():
    same = call("c5", topic="refactor module M")
    parent = child(1, lineage=(task_digest("worker", {"topic": "refactor module M"}),))
    refused = hand_off(research, "p/call_x", asked(parent, same), same, parent.turn_id)
    assert isinstance(refused, ToolOutput) and refused.error == "repeated_task" and "yourself" in refused.text
    other = call("c6", topic="refactor module M, tests only")
    assert isinstance(hand_off(research, "p/call_x", asked(parent, other), other, parent.turn_id), HandOff)


def test_children_of_a_turn_are_its_delegation_calls():
    events = asked(
        ROOT_TURN, call("c1", topic="A"), ToolCall(id="c2", name="lookup", arguments="{}"), call("c3", topic="B")
    )
    assert children_of("conv", events, "t1", {"research", "review"}.__contains__) == [
        ("conv/c1", "c1"),
        ("conv/c3", "c3"),
    ]


# --- the model a task runs on (the seed: the parent's, unless the delegation or the child pins one)


def _delegated_on(endpoint: str, *, turn_model: str | None = None) -> tuple[TurnInput, list, ToolCall]:
    turn = TurnInput(turn_id="t1", agent="lead", text="go", model=turn_model)
    made = call("c1", topic="X")
    events = [turn, ModelOutput(turn_id="t1", step=0, tool_calls=(made,), endpoint=endpoint)]
    return turn, events, made


def test_a_task_that_names_no_model_runs_on_the_model_of_the_parents_call():
    turn, events, made = _delegated_on("big")
    outcome = hand_off(research, "root", events, made, "t1", child=WORKER)  # WORKER pins no model
    assert isinstance(outcome, HandOff) and outcome.task.model == "big"


def test_the_delegations_model_then_a_child_that_pins_one_win_over_the_parents():
    turn, events, made = _delegated_on("big")
    pinned = Delegation(name="research", description="x", input=Research, agent="worker", model="small")
    assert hand_off(pinned, "root", events, made, "t1", child=WORKER).task.model == "small"
    own = Agent(name="worker", system_prompt="Worker.", model="tiny", tools=[lookup])
    assert hand_off(research, "root", events, made, "t1", child=own).task.model == "tiny"


def test_without_an_endpoint_recorded_the_parent_turns_model_is_used_then_none():
    turn, events, made = _delegated_on("", turn_model="big")
    assert hand_off(research, "root", events, made, "t1", child=WORKER).task.model == "big"
    turn, events, made = _delegated_on("")
    assert hand_off(research, "root", events, made, "t1", child=WORKER).task.model is None


def test_the_memo_of_offered_agents_is_bounded():
    # issue 35: an agent with a settings function is a new object each turn; the memo of the
    # agents a model call sees kept every one of them, growing with the turns a process served
    from agentstream.delegation import handoff

    base = Agent(name="per_turn", system_prompt="You answer.", model="small")
    turn = TurnInput(turn_id="t", agent="per_turn", text="hi", model="large")
    kept = []
    for _ in range(handoff.MEMO_ENTRIES * 3):
        agent = copy.copy(base)  # what a settings function gives: another object per turn
        kept.append(agent)
        offered = offered_agent(agent, turn)
        assert offered.model == "large" and offered_agent(agent, turn) is offered
    assert len(handoff._OFFERED) <= handoff.MEMO_ENTRIES
