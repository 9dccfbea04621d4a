"""Tool calls that wait for a person (:mod:`agentstream.steps.approvals`), without Redis: each
test is named "when X, the step does Y"."""

from __future__ import annotations

import json

import msgspec
import pytest

from agentstream.declarations.agents import Agent
from agentstream.declarations.mcp_servers import McpServer
from agentstream.declarations.tools import tool
from agentstream.steps.approvals import (
    DENIED_ERROR,
    TIMEOUT_BY,
    AlreadyDecided,
    AwaitApproval,
    RecordApprovals,
    Refused,
    approval_history,
    decide_message,
)
from agentstream.steps.decision import RecordResults, RunTools, decide, decide_view
from agentstream.steps.effects import Effects, output_effects
from agentstream.steps.trace_fold import fold_events
from agentstream.wire import codec
from agentstream.wire.checks import WireLimits, validate_approval
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    Event,
    ModelOutput,
    OfferedTool,
    ToolCall,
    ToolOutput,
    ToolsOffered,
    TurnInput,
    TurnMessage,
)


@tool(needs_approval=True, approval_edits=True)
def pay(amount: int) -> str:
    "Pay an amount."
    return f"paid {amount}"


@tool(needs_approval=lambda args: args.get("path", "").startswith("/etc"))
def delete(path: str) -> str:
    "Delete a file."
    return path


@tool
def look(q: str) -> str:
    "Look something up."
    return q


AGENT = Agent(name="a", system_prompt="S", tools=[pay, delete, look], model="m", approval_timeout_s=60)
AGENTS = {"a": AGENT}.get
TURN = TurnInput(turn_id="t1", agent="a", text="hi")
NOW = 1_000_000


def output(*calls: ToolCall, step: int = 0) -> ModelOutput:
    return ModelOutput(turn_id="t1", step=step, tool_calls=calls, stop_reason="tool_calls")


PAY = ToolCall(id="c1", name="pay", arguments='{"amount": 5}')
LOOK = ToolCall(id="c2", name="look", arguments='{"q": "x"}')


def decide_at(events: list[Event], now_ms: int | None = NOW):
    """The decision from a fold of ``events`` (the agent loop's path) at ``now_ms``; checked
    against the decision from a scan of the whole trace."""
    fold = fold_events("tr", [(f"{i + 1}-0", e) for i, e in enumerate(events)])
    from_fold = fold.decide(AGENTS, now_ms=now_ms)
    import dataclasses

    from agentstream.steps.decision import turn_view

    scanned = decide_view(dataclasses.replace(turn_view(events), now_ms=now_ms), AGENTS)
    assert scanned == from_fold
    return from_fold


def awaited(call: ToolCall = PAY, due_ms: int = NOW + 60_000, editable: bool = True) -> ApprovalAwaited:
    return ApprovalAwaited(turn_id="t1", call_id=call.id, name=call.name, due_ms=due_ms, editable=editable, why="w")


# --- a model output asks for a tool that needs approval ----------------------------------------


def test_when_a_model_output_asks_for_a_tool_that_needs_approval_the_step_appends_awaiting_and_publishes_no_job():
    decision = decide_at([TURN, output(PAY, LOOK)])
    assert isinstance(decision, AwaitApproval)
    [wait] = decision.awaited
    assert (wait.call_id, wait.name, wait.due_ms, wait.editable) == ("c1", "pay", NOW + 60_000, True)
    assert "tool 'pay'" in wait.why
    assert decision.due_ms == NOW + 60_000  # the trace is woken then


def test_when_calls_still_await_a_decision_the_step_waits_and_appends_nothing():
    decision = decide_at([TURN, output(PAY, LOOK), awaited()])
    assert decision == AwaitApproval(TURN, (), NOW + 60_000)  # no tool job: not even the free call's


def test_when_the_output_is_appended_the_plan_publishes_no_job_with_it():
    view = fold_events("tr", [("1-0", TURN)]).view(NOW)
    following = decide_view(view.with_output(output(PAY)), AGENTS)
    assert isinstance(following, AwaitApproval)
    effects = output_effects(
        TURN,
        output(PAY),
        following,
        publish_with_append=True,
        replies_owed=False,
        others_waiting=False,
        unstorable=lambda e: None,
    )
    assert effects == Effects(TURN, (output(PAY),))


@pytest.mark.parametrize(
    ("path", "waits"),
    [("/etc/passwd", True), ("/tmp/x", False)],
)
def test_when_a_tool_asks_approval_for_some_calls_only_those_wait(path, waits):
    call = ToolCall(id="c3", name="delete", arguments=json.dumps({"path": path}))
    decision = decide_at([TURN, output(call)])
    assert isinstance(decision, AwaitApproval) == waits
    if not waits:
        assert decision == RunTools(TURN, AGENT, 0, (call,))


def test_when_a_tool_that_asks_for_some_calls_gets_arguments_that_are_not_an_object_the_call_waits():
    call = ToolCall(id="c3", name="delete", arguments="[1")
    assert isinstance(decide_at([TURN, output(call)]), AwaitApproval)


@pytest.mark.parametrize(
    ("turn_approval", "agent_approval", "waits"),
    [
        ((), False, False),
        (("look",), False, True),  # the turn asks for this tool
        (("*",), False, True),  # the turn asks for every tool
        ((), ("look",), True),  # the agent asks for this tool
        ((), True, True),  # the agent asks for every tool
        (("other",), ("other",), False),
    ],
)
def test_when_the_turn_or_the_agent_asks_approval_the_call_waits(turn_approval, agent_approval, waits):
    agent = Agent(name="a", system_prompt="S", tools=[look], model="m", needs_approval=agent_approval)
    turn = TurnInput(turn_id="t1", agent="a", text="hi", approval=turn_approval)
    decision = decide([turn, output(LOOK)], {"a": agent}.get)
    assert isinstance(decision, AwaitApproval) == waits


def test_when_an_mcp_server_asks_approval_for_a_tool_its_calls_wait_and_are_not_editable():
    server = McpServer(name="fs", command=["srv"], needs_approval=["rm"])
    agent = Agent(name="a", system_prompt="S", model="m", mcp_servers=[server])
    offer = ToolsOffered(
        turn_id="t1",
        step=0,
        agent="a",
        tools=(OfferedTool(name="rm", server="fs"), OfferedTool(name="ls", server="fs")),
        digest="d",
    )
    rm, ls = ToolCall(id="c1", name="rm", arguments="{}"), ToolCall(id="c2", name="ls", arguments="{}")
    decision = decide([TURN, offer, output(rm, ls)], {"a": agent}.get)
    assert isinstance(decision, AwaitApproval)
    [wait] = decision.awaited
    assert (wait.call_id, wait.editable) == ("c1", False) and "MCP server 'fs'" in wait.why


# --- a decision arrives ---------------------------------------------------------------------------


def decided(approved: bool, **kw) -> ApprovalDecided:
    return ApprovalDecided(turn_id="t1", call_id="c1", name="pay", approved=approved, by="ana", **kw)


def test_when_every_call_is_approved_the_calls_run_together_once():
    decision = decide_at([TURN, output(PAY, LOOK), awaited(), decided(True)])
    assert decision == RunTools(TURN, AGENT, 0, (PAY, LOOK))


def test_when_an_approval_edits_the_arguments_the_call_runs_with_them():
    decision = decide_at([TURN, output(PAY), awaited(), decided(True, arguments='{"amount": 3}')])
    assert isinstance(decision, RunTools)
    assert decision.calls == (ToolCall(id="c1", name="pay", arguments='{"amount": 3}'),)


def test_when_a_call_is_denied_its_error_result_is_recorded_for_the_model():
    decision = decide_at([TURN, output(PAY, LOOK), awaited(), decided(False, reason="too much")])
    assert isinstance(decision, RecordResults)
    [result] = decision.results
    assert result.call_id == "c1" and result.error == DENIED_ERROR
    assert "denied by ana" in result.text and "too much" in result.text


def test_when_a_denial_is_recorded_the_other_calls_run():
    denial = ToolOutput(turn_id="t1", call_id="c1", name="pay", text="Error: denied", error=DENIED_ERROR)
    decision = decide_at([TURN, output(PAY, LOOK), awaited(), decided(False), denial])
    assert decision == RunTools(TURN, AGENT, 0, (LOOK,))


def test_when_a_second_decision_of_a_call_is_in_the_trace_the_first_stands():
    decision = decide_at([TURN, output(PAY), awaited(), decided(False), decided(True)])
    assert isinstance(decision, RecordResults)


# --- the deadline passes ---------------------------------------------------------------------------


def test_when_the_approval_deadline_passes_the_step_denies_the_call_by_timeout():
    decision = decide_at([TURN, output(PAY), awaited(due_ms=NOW)], now_ms=NOW)
    assert isinstance(decision, RecordApprovals)
    [denial] = decision.decisions
    assert (denial.call_id, denial.approved, denial.by, denial.timed_out) == ("c1", False, TIMEOUT_BY, True)
    assert "60 s" in denial.reason
    after = decide_at([TURN, output(PAY), awaited(due_ms=NOW), denial], now_ms=NOW)
    assert isinstance(after, RecordResults) and "nobody approved it in time" in after.results[0].text


def test_when_the_deadline_has_not_passed_or_no_clock_is_given_nothing_is_due():
    assert decide_at([TURN, output(PAY), awaited(due_ms=NOW + 1)], now_ms=NOW) == AwaitApproval(TURN, (), NOW + 1)
    assert isinstance(decide_at([TURN, output(PAY), awaited(due_ms=NOW)], now_ms=None), AwaitApproval)


def test_when_a_turn_awaiting_approval_is_cancelled_the_call_gets_a_cancelled_result():
    from agentstream.steps.decision import CancelTurn
    from agentstream.wire.events import CancelRequested

    decision = decide_at([TURN, output(PAY), awaited(), CancelRequested(turn_id="t1", by="u")])
    assert isinstance(decision, CancelTurn) and [r.call_id for r in decision.results] == ["c1"]


def test_when_a_turn_is_cancelled_while_calls_await_approval_their_results_say_they_did_not_run():
    from agentstream.steps.decision import CancelTurn, cancel_turn
    from agentstream.wire.events import CancelRequested

    cancel = CancelRequested(turn_id="t1", by="u")
    # the free call of the same output did not run either: the output's jobs wait for every decision
    held = [TURN, output(PAY, LOOK), awaited(), cancel]
    decision = decide_at(held)
    assert isinstance(decision, CancelTurn) and [r.call_id for r in decision.results] == ["c1", "c2"]
    assert all("did not run" in r.text and "partly" not in r.text for r in decision.results)
    assert "this call awaited" in decision.results[0].text  # pay: it needed the person
    assert "another call of the same model output awaited" in decision.results[1].text  # look: it waited beside
    assert cancel_turn(held, TURN, cancel) == decision  # the scan and the fold agree
    # once approved, its job went out: it may have partly run
    ran = [TURN, output(PAY, LOOK), awaited(), decided(True), cancel]
    later = decide_at(ran)
    assert isinstance(later, CancelTurn) and all("may have partly run" in r.text for r in later.results)


# --- an approval message arrives ----------------------------------------------------------------


def message(**kw) -> ApprovalMessage:
    return ApprovalMessage(**{"trace_id": "tr", "call_id": "c1", "approved": True, **kw})


def test_when_an_approval_arrives_for_a_call_awaiting_one_its_decision_is_appended_with_the_sender():
    outcome = decide_message(message(reason="ok"), awaited=awaited(), decided=None, turn_open=True, by="ana")
    assert outcome == ApprovalDecided(turn_id="t1", call_id="c1", name="pay", approved=True, by="ana", reason="ok")


def test_when_an_approval_arrives_for_an_unknown_call_it_is_refused():
    outcome = decide_message(message(), awaited=None, decided=None, turn_open=False, by="ana")
    assert isinstance(outcome, Refused) and "does not await approval" in outcome.reason


def test_when_an_approval_arrives_for_an_already_decided_call_nothing_is_appended():
    first = decided(False)
    outcome = decide_message(message(), awaited=awaited(), decided=first, turn_open=True, by="bob")
    assert outcome == AlreadyDecided(first)


def test_when_an_approval_arrives_after_its_turn_ended_it_is_refused():
    outcome = decide_message(message(), awaited=awaited(), decided=None, turn_open=False, by="ana")
    assert isinstance(outcome, Refused) and "has ended" in outcome.reason


def test_when_an_approval_edits_arguments_of_a_tool_that_does_not_allow_it_it_is_refused():
    outcome = decide_message(
        message(arguments="{}"), awaited=awaited(editable=False), decided=None, turn_open=True, by="ana"
    )
    assert isinstance(outcome, Refused) and "does not let its arguments be edited" in outcome.reason
    denial = decide_message(
        message(approved=False, arguments="{}"), awaited=awaited(), decided=None, turn_open=True, by="a"
    )
    assert isinstance(denial, Refused)


def test_when_a_call_awaits_approval_the_schema_an_edit_must_match_is_recorded_only_if_editable():
    decision = decide_at([TURN, output(PAY, ToolCall(id="c3", name="delete", arguments='{"path": "/etc/x"}'))])
    assert isinstance(decision, AwaitApproval)
    pay_wait, delete_wait = decision.awaited
    assert pay_wait.parameters == pay.parameters  # an edit is checked against it, wherever it is decided
    assert delete_wait.parameters is None  # not editable: no schema to carry


def schema_awaited() -> ApprovalAwaited:
    return ApprovalAwaited(
        turn_id="t1", call_id="c1", name="pay", due_ms=NOW + 60_000, editable=True, why="w", parameters=pay.parameters
    )


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ('{"amount": "a lot"}', "$.amount"),  # wrong type
        ("{}", "$"),  # a required argument missing
        ('{"amount": ' + "[" * 5000 + "]" * 5000 + "}", "cannot be checked"),  # too deep to check
    ],
)
def test_when_an_approval_edits_arguments_that_do_not_match_the_tools_schema_it_is_refused_and_decides_nothing(
    arguments, where
):
    outcome = decide_message(
        message(arguments=arguments), awaited=schema_awaited(), decided=None, turn_open=True, by="ana"
    )
    assert isinstance(outcome, Refused)
    assert where in outcome.reason and "'c1'" in outcome.reason
    assert len(outcome.reason) < 600  # the checker's message is cut: the value is not echoed whole


def test_when_an_approval_edits_arguments_that_match_the_tools_schema_the_decision_carries_them():
    outcome = decide_message(
        message(arguments='{"amount": 3}'), awaited=schema_awaited(), decided=None, turn_open=True, by="ana"
    )
    assert isinstance(outcome, ApprovalDecided) and outcome.arguments == '{"amount": 3}'


def test_when_the_recorded_schema_is_not_a_schema_an_edit_is_refused_not_let_through():
    broken = msgspec.structs.replace(schema_awaited(), parameters={"type": 12})
    outcome = decide_message(message(arguments="{}"), awaited=broken, decided=None, turn_open=True, by="ana")
    assert isinstance(outcome, Refused) and "cannot be checked" in outcome.reason


def test_when_a_trace_recorded_no_schema_an_edit_is_decided_and_the_tool_checks_it_when_it_runs():
    outcome = decide_message(message(arguments="{}"), awaited=awaited(), decided=None, turn_open=True, by="ana")
    assert isinstance(outcome, ApprovalDecided)


# --- the approval message on the wire ------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"not json", "JSON"),
        (b'{"trace_id": "tr", "call_id": "c1"}', "approved"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "extra": 1}', "extra"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": "yes"}', "approved"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "approved": false}', "twice"),
        (b'{"trace_id": "t\\u0007r", "call_id": "c1", "approved": true}', "trace_id"),
        (b'{"trace_id": "tr", "call_id": "", "approved": true}', "call_id"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "arguments": "[1]"}', "JSON object"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "arguments": "{"}', "not JSON"),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "by": "' + b"x" * 300 + b'"}', "by"),
        (b'{"trace_id": "tr", "call_id": "' + b"c" * 300 + b'", "approved": true}', "MAX_ID_BYTES"),
        (
            b'{"trace_id": "tr", "call_id": "c1", "approved": true, "reason": "' + b"r" * 600_000 + b'"}',
            "MAX_TURN_BYTES",
        ),
        (b'{"trace_id": "tr", "call_id": "c1", "approved": true, "x": ' + b"[" * 40 + b"]" * 40 + b"}", "nesting"),
    ],
)
def test_a_malformed_or_oversized_approval_message_is_refused_saying_what_and_where(payload, problem):
    with pytest.raises(msgspec.DecodeError) as caught:
        validate_approval(payload, WireLimits())
    assert problem in str(caught.value)


def test_a_well_formed_approval_message_reads_back():
    text = b'{"trace_id": "tr", "call_id": "c1", "approved": true, "by": "ana", "arguments": "{\\"amount\\": 3}"}'
    read = validate_approval(text, WireLimits())
    assert (read.by, read.arguments) == ("ana", '{"amount": 3}')


def test_the_turn_message_takes_approval_and_refuses_too_many_names():
    turn = codec.decode_turn(b'{"trace_id": "c", "turn_id": "t", "agent": "a", "text": "x", "approval": ["*"]}')
    assert turn.approval == ["*"]
    with pytest.raises(Exception, match="approval"):
        codec.decode_turn(
            msgspec.json.encode(TurnMessage(trace_id="c", turn_id="t", agent="a", text="x", approval=["x"] * 65))
        )


def test_the_history_says_who_decided_what_and_when():
    entries = [("1700000000000-0", awaited()), ("1700000060000-0", decided(True, reason="fine"))]
    lines = approval_history(entries, "t1")
    assert lines[0].startswith("2023-11-14 22:13:20 UTC") and "awaits approval" in lines[0]
    assert "approved by ana: fine" in lines[1] and "22:14:20" in lines[1]


# --- what the model sees of an edited call ----------------------------------------------------------


def test_when_a_call_ran_with_edited_arguments_the_model_sees_its_result_say_so_and_its_own_call_unchanged():
    from agentstream.context import build_context

    ran = ToolOutput(turn_id="t1", call_id="c1", name="pay", text="paid 3")
    looked = ToolOutput(turn_id="t1", call_id="c2", name="look", text="price")
    events = [TURN, output(PAY, LOOK), awaited(), decided(True, arguments='{"amount": 3}'), ran, looked]
    built = build_context(events, AGENT, turn_id="t1", step=1, limits=None)
    shown = [msgspec.json.decode(msgspec.json.encode(m)) for m in built.request.messages]
    [assistant] = [m for m in shown if m.get("tool_calls")]
    assert assistant["tool_calls"][0]["arguments"] == '{"amount": 5}'  # the model's own call, as it wrote it
    results = {m["call_id"]: m["text"] for m in shown if m["type"] == "tool"}
    assert results["c1"] == '[A person approved this call with edited arguments; it ran with: {"amount": 3}]\npaid 3'
    assert results["c2"] == "price"  # an unedited call of the same output: as it returned
    approved_as_made = [TURN, output(PAY), awaited(), decided(True), ran]
    plain = build_context(approved_as_made, AGENT, turn_id="t1", step=1, limits=None)
    assert "edited" not in msgspec.json.encode(plain.request.messages).decode()
