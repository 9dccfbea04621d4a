"""Which tool jobs may run (agentstream.runtime.call_runs.job_problem): pure, no Redis."""

from agentstream.runtime.call_runs import job_problem
from agentstream.wire.events import ModelOutput, ToolCall, ToolJob, TurnEnded, TurnInput

TRACE = [
    TurnInput(turn_id="t1", agent="a", text="x"),
    ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="work"),)),
    TurnEnded(turn_id="t1", answer="done"),
    TurnInput(turn_id="t2", agent="a", text="y"),
    ModelOutput(turn_id="t2", step=0, tool_calls=(ToolCall(id="c2", name="work"),)),
    TurnInput(turn_id="t3", agent="a", text="queued"),
]


def job(turn_id="t2", call_id="c2", name="work", trace_id="tr", arguments=""):
    return ToolJob(trace_id=trace_id, turn_id=turn_id, call_id=call_id, name=name, arguments=arguments)


def test_a_call_of_the_running_turn_may_run():
    assert job_problem(TRACE, job()) == ""


def test_a_call_of_an_ended_turn_is_left_to_the_claim_which_skips_it():
    assert job_problem(TRACE, job(turn_id="t1", call_id="c1")) == ""


def test_a_call_an_ended_turn_never_made_is_named():
    assert "made no call 'forged'" in job_problem(TRACE, job(turn_id="t1", call_id="forged"))
    assert "not 'record'" in job_problem(TRACE, job(turn_id="t1", call_id="c1", name="record"))


def test_jobs_for_anything_else_are_named_with_the_reason():
    assert "does not exist" in job_problem([], job())
    assert "has no turn 't9'" in job_problem(TRACE, job(turn_id="t9"))
    assert "is not the running turn" in job_problem(TRACE, job(turn_id="t3"))
    assert "made no call 'forged'" in job_problem(TRACE, job(call_id="forged"))
    assert "not 'record'" in job_problem(TRACE, job(name="record"))
    assert "other arguments than the job's" in job_problem(TRACE, job(arguments='{"ms": 1}'))
