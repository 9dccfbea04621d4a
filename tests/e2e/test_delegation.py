"""End to end: delegation to subagents on child traces, with the agent loop, a tool worker and
the delegation service as separate OS processes, a real Redis and a scripted model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentstream.delegation import child_trace_id
from agentstream.wire import codec
from agentstream.wire.events import CancelMessage, ModelOutput, TaskInput, ToolOutput, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.keys import CANCEL_FIELD
from tests.support import delegation_apps
from tests.support.procs import ROOT, Services, publish_turn, wait_replies
from tests.support.procs import trace_events as events_of
from tests.support.procs import wait_until as wait_for

pytestmark = pytest.mark.e2e

APP = "tests.support.delegation_apps:app"


@pytest.fixture
def services(redis_url, namespace, scripted_model, tmp_path):
    scripted_model.rule = delegation_apps.rule
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=scripted_model.base_url,
        app=APP,
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_SHUTDOWN_GRACE_S": "2", "AGENTSTREAM_SUPERVISE_INTERVAL_MS": "200"},
    )
    yield s
    s.stop_all()


def start_all(services: Services) -> None:
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker", "--queue", "default")
    services.start("delegation-1", "delegation")


def endings(events):
    return [e for e in events if isinstance(e, (TurnEnded, TurnFailed))]


def test_a_parent_delegates_two_tasks_in_parallel_and_answers_from_their_results(client, keys, services):
    services.env["AGENTSTREAM_TEST_LOOKUP_A_S"] = "1"  # A's child finishes after B's
    start_all(services)
    publish_turn(client, keys, trace_id="p1", turn_id="t1", agent="lead", text="Compare A and B")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended", reply
    assert reply.answer == "A: alpha is the first letter | B: beta is the second letter"  # call order

    parent = events_of(client, keys, "p1")
    (asked,) = [e for e in parent if isinstance(e, ModelOutput) and e.tool_calls]
    assert [c.name for c in asked.tool_calls] == ["research", "research"]
    results = [e for e in parent if isinstance(e, ToolOutput)]
    assert {r.call_id for r in results} == {c.id for c in asked.tool_calls}
    assert all(r.error is None for r in results)
    for call, topic in zip(asked.tool_calls, ["A", "B"], strict=True):
        child = events_of(client, keys, child_trace_id("p1", call.id))
        task = child[0]
        assert isinstance(task, TaskInput)
        assert (task.call_id, task.parent_trace_id, task.parent_turn_id, task.root_trace_id, task.depth) == (
            call.id,
            "p1",
            "t1",
            "p1",
            1,
        )
        assert task.agent == "researcher" and task.text == topic
        assert len(endings(child)) == 1 and isinstance(endings(child)[0], TurnEnded)
    # the children ran concurrently: B's child ended before A's, yet the results read in call order
    assert len(client.xrange(keys.replies)) == 1  # children answer their parent, not the replies stream
    # a child's model calls rebuild from its own trace like any other
    child = child_trace_id("p1", asked.tool_calls[0].id)
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "trace", "verify", child, "--app", APP],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "2/2 model calls rebuilt" in proc.stderr, proc.stdout + proc.stderr


def test_c30_a_chain_stops_at_the_depth_limit(client, keys, services):
    start_all(services)
    publish_turn(client, keys, trace_id="d1", turn_id="t1", agent="digger", text="M")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended" and reply.answer == "dug: dug: dug: deep fact about M++"
    root = events_of(client, keys, "d1")
    (call,) = next(e for e in root if isinstance(e, ModelOutput) and e.tool_calls).tool_calls
    level1_id = child_trace_id("d1", call.id)
    level1 = events_of(client, keys, level1_id)
    (call2,) = next(e for e in level1 if isinstance(e, ModelOutput) and e.tool_calls).tool_calls
    level2 = events_of(client, keys, child_trace_id(level1_id, call2.id))
    task = level2[0]
    assert isinstance(task, TaskInput) and task.depth == 2 and task.root_trace_id == "d1"
    # at depth 2 the dig tool was withheld: the grandchild looked the topic up itself
    (call3,) = next(e for e in level2 if isinstance(e, ModelOutput) and e.tool_calls).tool_calls
    assert call3.name == "slow_lookup"


def test_c28_a_hung_child_is_ended_by_the_supervisor_and_the_parent_hears(client, keys, services):
    start_all(services)
    publish_turn(client, keys, trace_id="h1", turn_id="t1", agent="boss", text="X")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended" and "did not finish" in reply.answer and "deadline" in reply.answer
    parent = events_of(client, keys, "h1")
    (result,) = [e for e in parent if isinstance(e, ToolOutput)]
    assert result.error == "timed_out"
    child = events_of(client, keys, child_trace_id("h1", result.call_id))
    (ending,) = endings(child)  # exactly one final event
    assert isinstance(ending, TurnFailed) and ending.code == "timed_out"
    assert client.zcard(keys.delegation_deadlines) == 0


def test_cancelling_a_parent_cancels_every_descendant(client, keys, services):
    services.env["AGENTSTREAM_TEST_SLOW_S"] = "60"  # the grandchild's lookup runs until cancelled
    start_all(services)
    publish_turn(client, keys, trace_id="c1", turn_id="t1", agent="digger", text="M")

    def grandchild():
        root = events_of(client, keys, "c1")
        outputs = [e for e in root if isinstance(e, ModelOutput) and e.tool_calls]
        if not outputs:
            return None
        level1_id = child_trace_id("c1", outputs[0].tool_calls[0].id)
        level1 = [e for e in events_of(client, keys, level1_id) if isinstance(e, ModelOutput) and e.tool_calls]
        if not level1:
            return None
        level2_id = child_trace_id(level1_id, level1[0].tool_calls[0].id)
        running = [e for e in events_of(client, keys, level2_id) if isinstance(e, ModelOutput) and e.tool_calls]
        return (level1_id, level2_id) if running else None

    level1_id, level2_id = wait_for(grandchild, 60, "the grandchild's slow lookup")
    client.xadd(
        keys.cancel, {CANCEL_FIELD: codec.encode(CancelMessage(trace_id="c1", by="user", reason="changed my mind"))}
    )
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "failed" and reply.code == "cancelled"
    for trace_id in (level1_id, level2_id):
        (ending,) = wait_for(
            lambda trace_id=trace_id: endings(events_of(client, keys, trace_id)), 60, f"the end of {trace_id}"
        )
        assert isinstance(ending, TurnFailed) and ending.code == "cancelled", ending
    # the parent's open call got a final result, and the root's history is valid
    root = events_of(client, keys, "c1")
    (call,) = next(e for e in root if isinstance(e, ModelOutput) and e.tool_calls).tool_calls
    assert [r.error for r in root if isinstance(r, ToolOutput) and r.call_id == call.id][0] == "cancelled"
    assert sum(isinstance(e, TurnInput) for e in root) == 1
