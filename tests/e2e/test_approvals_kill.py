"""Tool calls that wait for a person, with the services as separate OS processes: ``kill -9`` of
the agent loop while a call awaits approval, and at moments around the approval's arrival; the
call runs once, after its approval, which is recorded once (issue 36 item 1)."""

from __future__ import annotations

import json
import time

import pytest

from agentstream.wire.events import ApprovalAwaited, ApprovalDecided, ToolOutput
from agentstream.wire.keys import APPROVAL_FIELD, TURN_FIELD
from tests.support import apps
from tests.support.procs import Services, wait_replies, wait_until
from tests.support.procs import trace_events as events
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.e2e

FAST = {"AGENTSTREAM_MIN_IDLE_MS": "1000", "AGENTSTREAM_LEASE_TTL_MS": "1000"}


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
def services(redis_url, namespace, model, tmp_path):
    s = Services(
        redis_url=redis_url, namespace=namespace, model_url=model.base_url, log_dir=tmp_path, extra_env=dict(FAST)
    )
    yield s
    s.stop_all()


def runs(client, namespace, tool: str) -> int:
    counted = client.hgetall(apps.effects_key(namespace))
    return sum(int(v) for k, v in counted.items() if k.decode().endswith(f"/{tool}"))


def publish(client, keys, trace_id: str) -> None:
    turn = {
        "trace_id": trace_id,
        "turn_id": "t1",
        "agent": "plan",
        "text": "do: upsert(a) record(b)",
        "approval": ["record"],  # this turn's calls of record wait for a person
    }
    client.xadd(keys.turns_for(trace_id), {TURN_FIELD: json.dumps(turn)})


def approve(client, keys, trace_id: str, call_id: str) -> None:
    message = {"trace_id": trace_id, "call_id": call_id, "approved": True, "by": "ana"}
    client.xadd(keys.approvals, {APPROVAL_FIELD: json.dumps(message)})


def awaiting(client, keys, trace_id: str) -> ApprovalAwaited:
    return wait_until(
        lambda: next((e for e in events(client, keys, trace_id) if isinstance(e, ApprovalAwaited)), None),
        what=f"a call of {trace_id} awaiting approval",
    )


def test_kill_9_of_the_agent_loop_while_a_call_awaits_approval_runs_it_once_after_approval(
    client, keys, namespace, services
):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish(client, keys, "ap1")
    waiting = awaiting(client, keys, "ap1")
    assert waiting.name == "record"
    time.sleep(0.5)
    # nothing is held for the person: no lease, no pending turn or wake-up entry, no job, no run
    assert not client.exists(keys.lease("ap1"))
    assert client.xpending(keys.turns_for("ap1"), "agent-loop")["pending"] == 0
    assert runs(client, namespace, "record") == 0 and runs(client, namespace, "upsert") == 0
    services.stop("loop-1", kill=True)
    approve(client, keys, "ap1", waiting.call_id)  # while no agent loop runs, and twice
    approve(client, keys, "ap1", waiting.call_id)
    services.start("loop-2", "agent-loop")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended", reply
    time.sleep(1.0)  # a second run or reply would show now
    assert runs(client, namespace, "record") == 1 and runs(client, namespace, "upsert") == 1
    trace = events(client, keys, "ap1")
    assert [(d.call_id, d.by) for d in trace if isinstance(d, ApprovalDecided)] == [(waiting.call_id, "ana")]
    assert sorted(r.name for r in trace if isinstance(r, ToolOutput)) == ["record", "upsert"]
    assert client.xlen(keys.replies) == 1


@pytest.mark.parametrize("delay_s", [0.0, 0.03, 0.15])
def test_kill_9_of_the_agent_loop_as_the_approval_arrives_loses_no_approval_and_runs_once(
    client, keys, namespace, services, delay_s
):
    trace_id = f"ap-{int(delay_s * 1000)}"
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish(client, keys, trace_id)
    waiting = awaiting(client, keys, trace_id)
    approve(client, keys, trace_id, waiting.call_id)
    time.sleep(delay_s)
    services.stop("loop-1", kill=True)  # before, while or after it records the approval
    assert runs(client, namespace, "record") <= 1
    services.start("loop-2", "agent-loop")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended", reply
    time.sleep(1.0)
    assert runs(client, namespace, "record") == 1 and runs(client, namespace, "upsert") == 1
    decided = [d for d in events(client, keys, trace_id) if isinstance(d, ApprovalDecided)]
    assert len(decided) == 1 and decided[0].approved
