"""End to end: the agent loop and the tool worker as separate OS processes, a real Redis, and a
scripted OpenAI-compatible model over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis as redis_sync

from agentstream.wire.events import ModelOutput, ToolOutput, TurnEnded
from tests.support.procs import ROOT, Services, publish_turn, trace_events, wait_replies

pytestmark = pytest.mark.e2e


@pytest.fixture
def services(redis_url, namespace, scripted_model, tmp_path):
    s = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    yield s
    s.stop_all()


def test_turn_answered_by_two_processes(client, keys, services):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="c1", turn_id="t1", agent="calc", text="What is 6*7?")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended" and "42" in reply.answer
    events = trace_events(client, keys, "c1")
    assert [type(e).__name__ for e in events] == ["TurnInput", "ModelOutput", "ToolOutput", "ModelOutput", "TurnEnded"]


def test_plain_json_xadd_as_the_readme_shows_is_answered(client, keys, services):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    # Exactly what another backend does: one field `turn` holding JSON, no envelope.
    turn = '{"trace_id":"conv-42","turn_id":"turn-1","agent":"calc","text":"What is 2+3?","metadata":{"user":"u7"}}'
    client.execute_command("XADD", keys.turns, "*", "turn", turn)
    (reply,) = wait_replies(client, keys, 1)
    raw = json.loads(client.xrange(keys.replies)[0][1][b"reply"])
    assert raw["status"] == "ended" and "5" in raw["answer"] and raw["metadata"] == {"user": "u7"}
    assert reply.turn_id == "turn-1"


def test_bad_turns_are_reported_and_do_not_block_the_stream(client, keys, services):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    client.xadd(keys.turns, {"turn": b"{not json"})
    client.xadd(keys.turns, {"other": b"x"})
    client.xadd(keys.turns, {"turn": b'{"trace_id":"c2","turn_id":"t-bad","agent":"nobody","text":"x"}'})
    client.xadd(keys.turns, {"turn": b'{"trace_id":"c3","turn_id":"t-miss","agent":"calc"}'})
    publish_turn(client, keys, trace_id="c4", turn_id="t-good", agent="calc", text="What is 1+1?")
    replies = {r.turn_id: r for r in wait_replies(client, keys, 3)}
    assert replies["t-good"].status == "ended"
    assert replies["t-bad"].status == "failed" and "nobody" in replies["t-bad"].reason
    assert replies["t-miss"].code == "bad_turn" and "text" in replies["t-miss"].reason
    errors = [fields[b"error"].decode() for _, fields in client.xrange(keys.errors)]
    assert any("not valid JSON" in e for e in errors) and any("no field 'turn'" in e for e in errors)
    assert client.xpending(keys.turns, "agent-loop")["pending"] == 0


def test_a_turn_published_twice_is_answered_once(client, keys, services):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    for _ in range(2):
        publish_turn(client, keys, trace_id="c5", turn_id="same", agent="calc", text="What is 3*3?")
    wait_replies(client, keys, 1)
    time.sleep(0.5)
    assert len(client.xrange(keys.replies)) == 1
    assert sum(isinstance(e, TurnEnded) for e in trace_events(client, keys, "c5")) == 1


def test_tool_worker_stopped_before_it_takes_the_job_then_started(client, keys, services):
    services.start("loop-1", "agent-loop")
    publish_turn(client, keys, trace_id="c6", turn_id="t1", agent="calc", text="What is 10-4?")
    deadline = time.monotonic() + 20
    while not client.xlen(keys.tools_for("default", "c6")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.xlen(keys.tools_for("default", "c6")) == 1  # the job waits; nobody runs it
    time.sleep(0.3)
    assert not client.xrange(keys.replies)
    services.start("tools-1", "tool-worker")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended" and "6" in reply.answer


def test_tool_worker_killed_mid_job_its_job_is_reclaimed(client, keys, services):
    services.env["AGENTSTREAM_TEST_TOOL_DELAY_S"] = "3"
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="c7", turn_id="t1", agent="calc", text="What is 5*5?")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if client.xpending(keys.tools("default"), "tool-workers")["pending"]:
                break
        except redis_sync.ResponseError:  # the worker has not created its group yet
            pass
        time.sleep(0.05)
    services.stop("tools-1", kill=True)
    services.env["AGENTSTREAM_TEST_TOOL_DELAY_S"] = "0"
    services.env["AGENTSTREAM_MIN_IDLE_MS"] = "500"
    services.start("tools-2", "tool-worker")
    (reply,) = wait_replies(client, keys, 1, timeout_s=40)
    assert reply.status == "ended" and "25" in reply.answer
    results = [e for e in trace_events(client, keys, "c7") if isinstance(e, ToolOutput)]
    assert len(results) == 1


def test_every_model_call_rebuilds_to_its_fingerprint_in_a_fresh_process(client, keys, services, scripted_model):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="c8", turn_id="t1", agent="calc", text="What is 2*21?")
    wait_replies(client, keys, 1)
    publish_turn(client, keys, trace_id="c8", turn_id="t2", agent="calc", text="And 3*3?")
    wait_replies(client, keys, 2)
    outputs = [e for e in trace_events(client, keys, "c8") if isinstance(e, ModelOutput)]
    assert len(outputs) == 4
    # the recorded fingerprints are the sha256 of the bytes the model server received
    import hashlib

    assert [o.request_sha256 for o in outputs] == [hashlib.sha256(b).hexdigest() for b in scripted_model.requests]
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "trace", "verify", "c8", "--app", "tests.support.apps:app"],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4/4 model calls rebuilt from the stored trace match" in proc.stderr
