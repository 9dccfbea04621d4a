"""What one step writes as one value, and what the loop notes once Redis answered
(:mod:`agentstream.steps.effects`), without Redis: each test is named "when X, the loop does Y"."""

from __future__ import annotations

import pytest

from agentstream.declarations.agents import Agent
from agentstream.declarations.tools import tool
from agentstream.steps.decision import CancelTurn, EndTurn, FailTurn, RecordResults, RunTools
from agentstream.steps.effects import (
    AfterApply,
    Effects,
    Reply,
    after_apply,
    ending_effects,
    ending_kind,
    jobs_note,
    notes_before,
    output_effects,
    recorded,
    turn_ends,
)
from agentstream.steps.machine import storable_results
from agentstream.wire.events import (
    ApprovalDecided,
    ModelOutput,
    TaskInput,
    ToolCall,
    ToolOutput,
    TurnEnded,
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
CALL = ToolCall(id="c1", name="get", arguments='{"k":"A"}')
OUTPUT = ModelOutput(turn_id="t1", step=0, tool_calls=(CALL,))
ANSWER = ModelOutput(turn_id="t1", step=1, content="A")
ENDED = TurnEnded(turn_id="t1", answer="A")
RUN = RunTools(TURN, AGENT, 0, (CALL,))


def never(_event: object) -> None:
    return None


def effects_of(output, following, *, publish=True, owed=False, waiting=False, turn=TURN) -> Effects:
    return output_effects(
        turn,
        output,
        following,
        publish_with_append=publish,
        replies_owed=owed,
        others_waiting=waiting,
        unstorable=never,
    )


# --- 1. the effects of a decision ----------------------------------------------------------------


def test_when_the_output_calls_tools_the_loop_appends_publishes_and_releases_in_one_operation() -> None:
    effects = effects_of(OUTPUT, RUN)
    assert effects == Effects(TURN, (OUTPUT,), jobs=RUN)
    assert effects.releases and effects.marks == ("jobs:t1:0",)
    assert effects_of(OUTPUT, RUN, publish=False) == Effects(TURN, (OUTPUT,))  # a cluster: published next
    assert effects_of(OUTPUT, RUN, owed=True) == Effects(TURN, (OUTPUT,))  # earlier replies go out first


def test_when_the_output_answers_a_root_turn_the_loop_appends_the_ending_and_replies_in_one_operation() -> None:
    effects = effects_of(ANSWER, EndTurn(TURN, "A"))
    assert effects == Effects(TURN, (ANSWER,), (ENDED,), reply=Reply(TURN, ENDED))
    assert effects.releases and effects.marks == ("reply:t1",) and effects.ending == ENDED
    assert effects_of(ANSWER, EndTurn(TURN, "A"), waiting=True) == Effects(TURN, (ANSWER,), (ENDED,))  # next turn
    task = TaskInput(turn_id="t1", agent="a", text="x", parent_trace_id="p", call_id="c")
    assert effects_of(ANSWER, EndTurn(task, "A"), turn=task) == Effects(task, (ANSWER,), (ENDED,))  # a child answers


def test_when_the_answer_stopped_abnormally_its_reply_carries_the_stop_reason() -> None:
    cut = ModelOutput(turn_id="t1", step=1, content="A", stop_reason="length")
    effects = effects_of(cut, EndTurn(TURN, "A"))
    assert effects.reply == Reply(TURN, ENDED, "length")


def test_when_the_output_fails_the_turn_the_ending_goes_with_its_append() -> None:
    failed = TurnFailed(turn_id="t1", code="refusal", reason="no")
    effects = effects_of(ANSWER, FailTurn(TURN, FailureCode.REFUSAL, "no"))
    assert effects == Effects(TURN, (ANSWER,), (failed,)) and not effects.releases


def test_when_the_output_is_not_the_running_turns_it_is_appended_alone() -> None:
    assert effects_of(ANSWER, None) == Effects(TURN, (ANSWER,))


def test_when_calls_must_not_run_their_results_go_with_the_append_and_unstorable_ones_are_replaced() -> None:
    good = ToolOutput(turn_id="t1", call_id="c1", name="nope", text="unknown tool", error="unknown_tool")
    bad = ToolOutput(turn_id="t1", call_id="c2", name="nope", text="\ud800", error="unknown_tool")
    found = output_effects(
        TURN,
        OUTPUT,
        RecordResults(TURN, (good, bad)),
        publish_with_append=True,
        replies_owed=False,
        others_waiting=False,
        unstorable=lambda e: "a lone surrogate" if "\ud800" in getattr(e, "text", "") else None,
    )
    assert not found.releases and found.then[0] is good
    assert found.then[1].error == "invalid_result" and "could not be stored (a lone surrogate)" in found.then[1].text
    assert storable_results([good], never) == [good]


CANCELLED_RESULT = ToolOutput(turn_id="t1", call_id="c1", name="get", text="Cancelled.", error="cancelled")


@pytest.mark.parametrize(
    ("decision", "events"),
    [
        (EndTurn(TURN, "A", answer_call="c9"), (TurnEnded(turn_id="t1", answer="A", answer_call="c9"),)),
        (FailTurn(TURN, "passes_cap", "too many"), (TurnFailed(turn_id="t1", code="passes_cap", reason="too many"),)),
        (
            CancelTurn(TURN, (CANCELLED_RESULT,), "cancelled", "by user"),
            (CANCELLED_RESULT, TurnFailed(turn_id="t1", code="cancelled", reason="by user")),
        ),
    ],
)
def test_when_a_turn_ends_the_loop_appends_its_results_then_its_ending(decision, events) -> None:
    effects = ending_effects(decision)
    assert effects == Effects(TURN, events) and effects.ending == events[-1] and not effects.releases


def test_when_the_loop_fails_a_turn_itself_it_appends_the_ending_alone() -> None:
    failed = TurnFailed(turn_id="t1", code="deadline", reason="late")
    assert turn_ends(TURN, failed) == Effects(TURN, (failed,))


def test_when_a_step_records_results_or_approvals_it_appends_them_and_ends_no_turn() -> None:
    decided = ApprovalDecided(turn_id="t1", call_id="c1", name="get", approved=False, by="timeout")
    effects = recorded([decided])
    assert effects == Effects(events=(decided,)) and effects.ending is None and not effects.releases


# --- 2. and 3. around the operation --------------------------------------------------------------


def test_when_a_step_publishes_jobs_they_are_noted_published_before_redis_runs_it() -> None:
    assert notes_before(Effects(TURN, (OUTPUT,), jobs=RUN)) == {jobs_note("t1", 0): True}
    assert notes_before(Effects(TURN, (ANSWER,), (ENDED,), reply=Reply(TURN, ENDED))) == {}
    assert notes_before(Effects(TURN, (OUTPUT,))) == {}


JOBS = Effects(TURN, (OUTPUT,), jobs=RUN)
REPLYING = Effects(TURN, (ANSWER,), (ENDED,), reply=Reply(TURN, ENDED))


@pytest.mark.parametrize(
    ("case", "effects", "created", "outcome", "expected"),
    [
        (
            "jobs published and the lease released: the step loop ends",
            JOBS,
            [True],
            "released",
            AfterApply("released", {}),
        ),
        (
            "jobs published, a hint came: the step loop reads and decides again",
            JOBS,
            [True],
            "dirty",
            AfterApply("dirty", {}),
        ),
        (
            "jobs not published with a new output (another entry came first): nobody published them",
            JOBS,
            [True],
            None,
            AfterApply("again", {jobs_note("t1", 0): False}),
        ),
        (
            "jobs not published, the output there already: unknown, asked of Redis",
            JOBS,
            [False],
            None,
            AfterApply("again", {}, (jobs_note("t1", 0),)),
        ),
        (
            "an output with calls appended alone (a cluster): nobody published its jobs",
            Effects(TURN, (OUTPUT,)),
            [True],
            None,
            AfterApply("again", {jobs_note("t1", 0): False}),
        ),
        (
            "an output with calls there already: nothing noted",
            Effects(TURN, (OUTPUT,)),
            [False],
            None,
            AfterApply("again", {}),
        ),
        (
            "the reply went out with the ending: counted, nothing owed",
            REPLYING,
            [True, True],
            "released",
            AfterApply("released", {}, (), ENDED, REPLYING.reply),
        ),
        (
            "the ending appended, the reply not out: counted, the reply owed",
            REPLYING,
            [True, True],
            None,
            AfterApply("again", {("ended", "t1"): True}, (), ENDED),
        ),
        (
            "the ending left out (another entry came first): nothing ended",
            REPLYING,
            [True, None],
            None,
            AfterApply("again", {}),
        ),
        (
            "an ending there already (a step taken again): not counted twice",
            turn_ends(TURN, ENDED),
            [False],
            None,
            AfterApply("again", {}),
        ),
        (
            "a cancel's results and ending appended: counted, the reply owed",
            ending_effects(CancelTurn(TURN, (CANCELLED_RESULT,), "cancelled", "by user")),
            [True, True],
            None,
            AfterApply(
                "again",
                {("ended", "t1"): True},
                (),
                TurnFailed(turn_id="t1", code="cancelled", reason="by user"),
            ),
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_when_redis_answered_the_loop_goes_on_and_notes_what_it_says(case, effects, created, outcome, expected) -> None:
    assert after_apply(effects, created, outcome) == expected, case


@pytest.mark.parametrize(
    ("ending", "kind"),
    [
        (ENDED, "ended"),
        (TurnFailed(turn_id="t1", code=FailureCode.CANCELLED, reason="by user"), "cancelled"),
        (TurnFailed(turn_id="t1", code=FailureCode.DEADLINE, reason="late"), "failed"),
    ],
)
def test_when_a_turn_ends_the_loop_counts_it_as_ended_cancelled_or_failed(ending, kind) -> None:
    assert ending_kind(ending) == kind
