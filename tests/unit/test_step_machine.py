"""The agent loop's decisions around a model call (:mod:`agentstream.steps.machine`), without
Redis: each test is named "when X, the loop does Y"."""

from __future__ import annotations

import pytest

from agentstream.declarations.agents import Agent
from agentstream.declarations.mcp_servers import McpServer
from agentstream.declarations.tools import tool
from agentstream.errors import ModelDeadlineExceeded, ModelUnanswered
from agentstream.steps.machine import (
    KeepOffer,
    WaitForCatalogs,
    model_call_failure,
    offer_before_call,
    queue_full_refusal,
    stamped_output,
    turn_deadline_failure,
    turn_time_left_s,
    unknown_model_failure,
    unstorable_output_failure,
)
from agentstream.steps.offers import Catalog, offer_digest
from agentstream.wire.events import (
    ModelOutput,
    OfferedTool,
    ToolsOffered,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode


@tool
def get(k: str) -> str:
    "Get a value."
    return k


AGENT = Agent(name="a", system_prompt="S", tools=[get], model="m")
TURN = TurnInput(turn_id="t1", agent="a", text="hi")
STARTED = [("1000000-0", TURN)]  # the turn entered at 1 000 s (Unix)


def never(_event: object) -> None:
    return None


# --- 0. a turn's admission into a conversation's queue ------------------------------------------


@pytest.mark.parametrize(
    ("open_turns", "cap", "refused"),
    [
        (0, 1, False),  # an idle conversation takes a turn even at the smallest cap
        (1, 1, True),  # cap 1: nothing queues behind the running turn
        (63, 64, False),  # the last place in the queue
        (64, 64, True),  # the queue is full
        (500, 64, True),  # past it (a cap lowered while turns were queued)
    ],
)
def test_when_a_conversation_holds_the_most_open_turns_the_loop_refuses_a_new_one_busy(open_turns, cap, refused):
    failed = queue_full_refusal("c1", "t9", open_turns, cap)
    if not refused:
        assert failed is None
        return
    assert isinstance(failed, TurnFailed) and failed.turn_id == "t9" and failed.code == FailureCode.BUSY
    assert "'c1'" in failed.reason and f"AGENTSTREAM_MAX_QUEUED_TURNS={cap}" in failed.reason
    assert "new turn_id" in failed.reason


def test_when_the_queue_cap_is_below_one_the_rule_raises_naming_it():
    with pytest.raises(ValueError, match="max_queued_turns must be at least 1, got 0"):
        queue_full_refusal("c1", "t9", 0, 0)


# --- 1. the turn's deadline ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline_s", "now_s", "left_s"),
    [(None, 5000.0, None), (60.0, 1030.0, 30.0), (60.0, 1060.0, 0.0), (60.0, 1100.0, -40.0)],
)
def test_when_a_turn_has_a_deadline_the_loop_counts_from_its_input_entry(deadline_s, now_s, left_s) -> None:
    assert turn_time_left_s(STARTED, "t1", deadline_s, now_s) == left_s


def test_when_the_turns_input_entry_is_not_read_the_loop_sets_no_deadline() -> None:
    assert turn_time_left_s([("not-an-id", TURN)], "t1", 60.0, 5000.0) is None
    assert turn_time_left_s([], "t1", 60.0, 5000.0) is None


@pytest.mark.parametrize(("left_s", "fails"), [(None, False), (0.5, False), (0.0, True), (-3.0, True)])
def test_when_the_turn_has_no_time_left_the_loop_fails_it_instead_of_calling(left_s, fails) -> None:
    failed = turn_deadline_failure(TURN, left_s, 60.0, 2)
    assert (failed is not None) == fails
    if failed is not None:
        assert failed.code == FailureCode.DEADLINE and "60 s" in failed.reason and "model call 2" in failed.reason


# --- 2. the MCP tools offered ----------------------------------------------------------------

SERVER = McpServer(name="files", command=["files-server"])
MCP_AGENT = Agent(name="a", system_prompt="S", model="m", tools=[SERVER])
READ = OfferedTool(name="read", description="Read a file.", parameters={"type": "object"}, server="files")


def catalog(*tools: OfferedTool) -> Catalog:
    return Catalog(server="files", tools=tools, digest=offer_digest(tools))


def test_when_an_agent_has_no_mcp_servers_and_never_had_the_loop_calls_the_model() -> None:
    assert offer_before_call([TURN], AGENT, TURN, 0, None, waited_s=0, wait_s=30) == (KeepOffer(), [])


def test_when_a_server_has_not_published_its_tools_the_loop_waits_then_fails_the_turn() -> None:
    waiting, _ = offer_before_call([TURN], MCP_AGENT, TURN, 0, {"files": None}, waited_s=2, wait_s=30)
    assert isinstance(waiting, WaitForCatalogs) and waiting.delay_s == 1.0 and "'files'" in waiting.reason
    failed, _ = offer_before_call([TURN], MCP_AGENT, TURN, 0, {"files": None}, waited_s=31, wait_s=30)
    assert isinstance(failed, TurnFailed) and failed.code == FailureCode.TOOLS_UNAVAILABLE


def test_when_the_servers_tools_changed_the_loop_records_them_before_calling() -> None:
    offered, _ = offer_before_call([TURN], MCP_AGENT, TURN, 3, {"files": catalog(READ)}, waited_s=0, wait_s=30)
    assert isinstance(offered, ToolsOffered) and [t.name for t in offered.tools] == ["read"] and offered.step == 3
    again, _ = offer_before_call([TURN, offered], MCP_AGENT, TURN, 4, {"files": catalog(READ)}, waited_s=0, wait_s=30)
    assert again == KeepOffer()


def test_when_the_app_takes_the_mcp_servers_away_the_loop_records_an_empty_offer() -> None:
    before = ToolsOffered(
        turn_id="t0", step=0, agent="a", tools=(OfferedTool(name="read", server="files"),), digest="d"
    )
    withdrawn, _ = offer_before_call([before, TURN], AGENT, TURN, 0, None, waited_s=0, wait_s=30)
    assert isinstance(withdrawn, ToolsOffered) and withdrawn.tools == ()


# --- 4. to 7. the model and its output ---------------------------------------------------------


def test_when_the_agent_names_a_model_not_configured_the_loop_fails_the_turn() -> None:
    assert unknown_model_failure(AGENT, {"m": object()}, TURN) is None
    failed = unknown_model_failure(AGENT, {"other": object()}, TURN)
    assert failed is not None and failed.code == FailureCode.CONFIG and "'m'" in failed.reason


@pytest.mark.parametrize(
    ("exc", "bounded", "code"),
    [
        (TimeoutError(), True, FailureCode.DEADLINE),  # the turn's deadline bounded the call
        (TimeoutError(), False, None),  # not the turn's: the loop raises it again
        (ModelDeadlineExceeded("late", deadline_s=5), False, FailureCode.DEADLINE),
        (ModelUnanswered("503 three times"), True, FailureCode.MODEL_ERROR),
        (RuntimeError("a bug"), True, None),
    ],
)
def test_when_the_model_call_raises_the_loop_ends_the_turn_with_the_deadline_or_model_error(exc, bounded, code):
    failed = model_call_failure(exc, TURN, 1, turn_deadline_s=60.0, bounded=bounded)
    assert (failed.code if failed is not None else None) == code


def test_when_the_output_cannot_be_stored_the_loop_fails_the_turn_instead_of_calling_again() -> None:
    assert unstorable_output_failure(None, TURN, 0) is None
    failed = unstorable_output_failure("a lone surrogate", TURN, 0)
    assert failed is not None and failed.code == FailureCode.MODEL_ERROR and "a lone surrogate" in failed.reason


def test_when_the_prompt_comes_from_files_the_output_records_their_digest() -> None:
    output = ModelOutput(turn_id="t1", step=0, content="x")
    assert stamped_output(output, AGENT) is output  # no prompt file: nothing to record

    class Filed(Agent):
        prompt_digest = "abc"  # as an agent whose system prompt is a prompt file has it

    assert stamped_output(output, Filed(name="f", system_prompt="S", model="m")).prompt_digest == "abc"
