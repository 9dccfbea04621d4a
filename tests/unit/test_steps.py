"""The agent loop's decisions, as a pure function of the trace."""

import pytest

from agentstream.context import ToolResultMessage, UserMessage, build_messages, build_request
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.declarations.tools import tool
from agentstream.steps.decision import (
    PASSES_CAP_CODE,
    PASSES_CAP_DIRECTIVE,
    CallModel,
    EndTurn,
    FailTurn,
    Idle,
    RecordResults,
    RunTools,
    decide,
)
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnFailed, TurnInput


@tool
def get(k: str) -> str:
    """Get a value."""
    return k


AGENT = Agent(name="a", system_prompt="S", tools=[get], max_passes=3)
T1 = TurnInput(turn_id="t1", agent="a", text="Compare A and B")


def agents(name):
    return AGENT if name == "a" else None


def calls(*ids, name="get", args='{"k":"A"}'):
    return tuple(ToolCall(id=i, name=name, arguments=args) for i in ids)


def test_new_turn_calls_the_model():
    assert decide([T1], agents) == CallModel(T1, AGENT, 0)
    assert decide([], agents) == Idle()


def test_unknown_agent_fails_the_turn():
    turn = TurnInput(turn_id="t", agent="nobody", text="x")
    d = decide([turn], agents)
    assert isinstance(d, FailTurn) and d.code == "unknown_agent"


def test_waits_for_every_result_then_calls_again():
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("c1", "c2"), stop_reason="tool_calls")
    r2 = ToolOutput(turn_id="t1", call_id="c2", name="get", text="B=2")
    d = decide([T1, out, r2], agents)
    assert isinstance(d, RunTools) and [c.id for c in d.calls] == ["c1"]
    r1 = ToolOutput(turn_id="t1", call_id="c1", name="get", text="A=1")
    assert decide([T1, out, r2, r1], agents) == CallModel(T1, AGENT, 1)


def test_unknown_tool_gets_an_error_result_and_siblings_still_run():
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("c1") + calls("c2", name="nope"), stop_reason="tool_calls")
    d = decide([T1, out], agents)
    assert isinstance(d, RecordResults)
    (result,) = d.results
    assert result.call_id == "c2" and result.error == "unknown_tool" and "get" in result.text
    after = [T1, out, *d.results]
    d2 = decide(after, agents)
    assert isinstance(d2, RunTools) and [c.id for c in d2.calls] == ["c1"]


def test_call_cut_off_by_length_is_not_run():
    # C12 A/B: a tool call cut off by the output limit is never executed.
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("c1", args='{"k":"hel'), stop_reason="length")
    d = decide([T1, out], agents)
    assert isinstance(d, RecordResults) and d.results[0].error == "cut_off"


def test_refusal_and_content_filter_end_the_turn_without_retry():
    for reason in ("refusal", "content_filter"):
        out = ModelOutput(turn_id="t1", step=0, stop_reason=reason, stop_detail="I can't help with that.")
        d = decide([T1, out], agents)
        assert isinstance(d, FailTurn) and d.code == reason and "can't help" in d.reason


def test_empty_reply_is_retried_once_then_fails():
    empty = ModelOutput(turn_id="t1", step=0, content="")
    assert decide([T1, empty], agents) == CallModel(T1, AGENT, 1)
    empty2 = ModelOutput(turn_id="t1", step=1, content=" ")
    d = decide([T1, empty, empty2], agents)
    assert isinstance(d, FailTurn) and d.code == "empty_reply"


def test_answer_ends_the_turn_and_the_next_queued_turn_starts():
    t2 = TurnInput(turn_id="t2", agent="a", text="next")
    out = ModelOutput(turn_id="t1", step=0, content="done")
    assert decide([T1, t2, out], agents) == EndTurn(T1, "done")
    assert decide([T1, t2, out, TurnEnded(turn_id="t1", answer="done")], agents) == CallModel(t2, AGENT, 0)


def tool_pass(events, step, *ids, answered=True):
    events.append(ModelOutput(turn_id="t1", step=step, tool_calls=calls(*ids), stop_reason="tool_calls"))
    if answered:
        events.extend(ToolOutput(turn_id="t1", call_id=i, name="get", text="x") for i in ids)


def test_the_passes_cap_counts_calls_with_tools_and_keeps_tools_one_round_past_it():
    events = [T1]
    for step in range(3):  # max_passes=3: three calls with tools run
        tool_pass(events, step, f"c{step}")
    assert decide(events, agents) == CallModel(T1, AGENT, 3)
    request = build_request(events, AGENT, turn_id="t1", step=3)
    assert request.tool_choice == "auto" and [t.name for t in request.tools] == ["get"]  # tool_rounds_after_cap=1


def test_calls_past_the_cap_do_not_run_and_get_the_directive():
    events = [T1]
    for step in range(3):
        tool_pass(events, step, f"c{step}")
    tool_pass(events, 3, "c3a", "c3b", answered=False)
    d = decide(events, agents)
    assert isinstance(d, RecordResults) and [r.call_id for r in d.results] == ["c3a", "c3b"]
    assert {r.error for r in d.results} == {PASSES_CAP_CODE}
    assert d.results[0].text == PASSES_CAP_DIRECTIVE.format(cap=3)
    events.extend(d.results)
    assert decide(events, agents) == CallModel(T1, AGENT, 4)
    final = build_request(events, AGENT, turn_id="t1", step=4)
    assert final.tool_choice == "none" and final.tools == ()  # then it can only answer
    events.append(ModelOutput(turn_id="t1", step=4, content="A is bigger."))
    assert decide(events, agents) == EndTurn(T1, "A is bigger.")


def test_a_tool_called_where_tools_are_withheld_never_runs_and_a_second_time_fails_the_turn():
    events = [T1]
    for step in range(4):
        tool_pass(events, step, f"c{step}")
    tool_pass(events, 4, "c4", answered=False)  # the server ignored that no tools were offered
    d = decide(events, agents)
    assert isinstance(d, RecordResults) and d.results[0].error == PASSES_CAP_CODE
    events.extend(d.results)
    assert decide(events, agents) == CallModel(T1, AGENT, 5)
    tool_pass(events, 5, "c5", answered=False)
    d = decide(events, agents)
    assert isinstance(d, RecordResults) and d.results[0].error == PASSES_CAP_CODE
    events.extend(d.results)
    d = decide(events, agents)
    assert isinstance(d, FailTurn) and d.code == "passes_cap" and "3" in d.reason


def test_answers_and_empty_replies_do_not_count_toward_the_cap():
    events = [T1, ModelOutput(turn_id="t1", step=0, content="")]  # an empty reply, retried
    for step in range(1, 4):
        tool_pass(events, step, f"c{step}")
    request = build_request(events, AGENT, turn_id="t1", step=4)
    assert request.tool_choice == "auto"  # three calls with tools so far: the round past the cap
    assert decide(events, agents) == CallModel(T1, AGENT, 4)


def test_no_rounds_after_the_cap():
    agent = Agent(
        name="a", system_prompt="S", tools=[get], max_passes=1, tool_rounds_after_cap=0, first_tool_choice="required"
    )
    assert [agent.tool_choice_at(passes, passes) for passes in range(2)] == ["required", "none"]


def test_results_are_shown_in_call_order_whatever_the_arrival_order():
    # C25: results arrive B before A; the context shows A then B, matched by id.
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("call_A", "call_B"))
    rb = ToolOutput(turn_id="t1", call_id="call_B", name="get", text="B-content")
    ra = ToolOutput(turn_id="t1", call_id="call_A", name="get", text="A-content")
    dup = ToolOutput(turn_id="t1", call_id="call_A", name="get", text="second copy")
    msgs = build_messages([T1, out, rb, ra, dup])
    tools = [m for m in msgs if isinstance(m, ToolResultMessage)]
    assert [(m.call_id, m.text) for m in tools] == [("call_A", "A-content"), ("call_B", "B-content")]


def test_late_result_after_the_turn_ended_is_ignored():
    # C27: a result arriving after the turn ended (cancel/failure) never enters a context.
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("call_1", "call_2"))
    r2 = ToolOutput(turn_id="t1", call_id="call_2", name="get", text="lint ok")
    ended = TurnFailed(turn_id="t1", code="cancelled", reason="by user")
    t2 = TurnInput(turn_id="t2", agent="a", text="Actually, just fix the typo.")
    late = ToolOutput(turn_id="t1", call_id="call_1", name="get", text="tests passed")
    msgs = build_messages([T1, out, r2, ended, t2, late])
    tools = [m for m in msgs if isinstance(m, ToolResultMessage)]
    assert tools[0].call_id == "call_1" and tools[0].is_error and "tests passed" not in tools[0].text
    assert tools[1].text == "lint ok"
    assert isinstance(msgs[-1], UserMessage) and msgs[-1].text.startswith("Actually")


def test_a_queued_turn_is_not_shown_inside_the_running_one():
    t2 = TurnInput(turn_id="t2", agent="a", text="second")
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls("c1"))
    r1 = ToolOutput(turn_id="t1", call_id="c1", name="get", text="x")
    msgs = build_messages([T1, t2, out, r1], upto_turn="t1")
    assert not any(isinstance(m, UserMessage) and m.text == "second" for m in msgs)
    full = build_messages(
        [T1, t2, out, r1, ModelOutput(turn_id="t1", step=1, content="ok"), TurnEnded(turn_id="t1", answer="ok")]
    )
    assert isinstance(full[-1], UserMessage) and full[-1].text == "second"


def test_a_turn_may_name_only_a_model_its_agent_allows_and_the_app_configures():
    from agentstream.models.endpoints import ModelEndpoint
    from agentstream.steps.decision import model_refusal
    from agentstream.wire.events import TaskInput

    agent = Agent(name="a", system_prompt="S", tools=[get], models=["big", "gone"])
    endpoints = {n: ModelEndpoint(id=n, provider="openai", base_url="http://x/v1", model=n) for n in ("default", "big")}
    turn = lambda model: TurnInput(turn_id="t", agent="a", text="x", model=model)  # noqa: E731
    assert model_refusal(agent, turn(None), endpoints) is None and model_refusal(agent, turn("big"), endpoints) is None
    assert "does not allow" in model_refusal(agent, turn("other"), endpoints)
    assert "not configured" in model_refusal(agent, turn("gone"), endpoints)
    task = TaskInput(turn_id="t", agent="a", text="x", model="other")  # a child runs on its delegation's model
    assert model_refusal(agent, task, endpoints) is None
    d = decide([turn("other")], lambda name: agent)
    assert isinstance(d, FailTurn) and d.code == "bad_turn" and "`model`" in d.reason


def test_an_agent_without_a_default_model_refuses_a_turn_that_names_none():
    from agentstream.errors import ConfigError, TurnRejected
    from agentstream.steps.decision import model_refusal
    from agentstream.wire.events import TurnMessage

    agent = Agent(name="a", system_prompt="S", model=None, models=["big", "small"])
    assert agent.allowed_models == ("big", "small")
    unnamed = TurnInput(turn_id="t", agent="a", text="x")
    why = model_refusal(agent, unnamed, None)
    assert "names no model in its field `model`" in why and "no default model" in why and "big, small" in why
    assert model_refusal(agent, TurnInput(turn_id="t", agent="a", text="x", model="small"), None) is None
    assert "does not allow" in model_refusal(agent, TurnInput(turn_id="t", agent="a", text="x", model="default"), None)
    d = decide([unnamed], lambda name: agent)
    assert isinstance(d, FailTurn) and d.code == "bad_turn" and d.reason == why
    app = App(agents=[agent])
    with pytest.raises(TurnRejected) as info:  # refused on admission, before anything is stored
        app.turn_input(TurnMessage(trace_id="c", turn_id="t", agent="a", text="x"))
    assert info.value.code == "bad_turn" and "no default model" in str(info.value)
    with pytest.raises(ConfigError, match="no default model"):
        Agent(name="b", system_prompt="S", model=None)  # nothing a turn could run on
