"""Delivery guarantees with the services as separate OS processes (issue 4): graceful shutdown on
SIGTERM, a Redis restart with AOF, kill -9 mid-run of a side-effect tool, a poison job that
kills its worker, the ``agentstream cancel`` command, and publish order with two agent loops."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis as redis_sync

from agentstream.wire import codec
from agentstream.wire.events import ToolOutput, ToolStarted, TurnEnded, TurnFailed, TurnInput, TurnMessage
from agentstream.wire.keys import TURN_FIELD
from tests.support import apps
from tests.support.procs import ROOT, Services, publish_turn, wait_replies, wait_until
from tests.support.procs import trace_events as events
from tests.support.redis_server import RestartableRedis
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


def effects(client, namespace) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(apps.effects_key(namespace)).items()}


def runs(client, namespace, tool: str) -> int:
    return sum(v for k, v in effects(client, namespace).items() if k.endswith(f"/{tool}"))


def test_sigterm_finishes_the_tool_call_in_hand_then_exits(client, keys, namespace, services):
    services.start("loop-1", "agent-loop")
    worker = services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="g1", turn_id="t1", agent="plan", text="do: work(2500)")
    wait_until(lambda: runs(client, namespace, "work"), what="the tool running")
    worker.terminate()  # SIGTERM mid-call: stop taking entries, finish this one, exit
    assert worker.wait(timeout=30) == 0
    services.procs.pop("tools-1")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended" and reply.answer == "Results: worked 2500 ms"
    assert runs(client, namespace, "work") == 1  # finished by the stopping worker, not run again
    assert client.xpending(keys.tools_for("default", "g1"), "tool-workers")["pending"] == 0


def test_sigterm_past_the_grace_period_releases_the_call_for_another_worker(client, keys, namespace, services):
    # One hour of min_idle: only the release on shutdown lets the second worker take the job now.
    services.env["AGENTSTREAM_MIN_IDLE_MS"] = "3600000"
    services.start("loop-1", "agent-loop")
    worker = services.start(
        "tools-1", "tool-worker", env={"AGENTSTREAM_SHUTDOWN_GRACE_S": "0.5", "AGENTSTREAM_TEST_RECORD_S": "60"}
    )
    publish_turn(client, keys, trace_id="g2", turn_id="t1", agent="plan", text="do: record(invoice-7)")
    wait_until(lambda: any(isinstance(e, ToolStarted) for e in events(client, keys, "g2")), what="record started")
    worker.terminate()
    assert worker.wait(timeout=30) == 0  # the sync tool's thread does not hold the exit
    services.procs.pop("tools-1")
    services.start("tools-2", "tool-worker")
    (reply,) = wait_replies(client, keys, 1, timeout_s=40)
    (result,) = [e for e in events(client, keys, "g2") if isinstance(e, ToolOutput)]
    # record has side effects and had started: it is not run again, its outcome is unknown
    assert result.error == "outcome_unknown" and reply.status == "ended"


def test_kill_9_mid_run_side_effects_are_not_repeated_unless_retry_safe(client, keys, namespace, services):
    services.start("loop-1", "agent-loop")
    slow = {"AGENTSTREAM_TEST_RECORD_S": "30", "AGENTSTREAM_TEST_UPSERT_S": "30"}
    services.start("tools-1", "tool-worker", env=slow)
    publish_turn(client, keys, trace_id="g3", turn_id="t1", agent="plan", text="do: record(a) upsert(b) work(1)")
    wait_until(lambda: sum(isinstance(e, ToolStarted) for e in events(client, keys, "g3")) == 2, what="both started")
    services.stop("tools-1", kill=True)
    services.start("tools-2", "tool-worker")
    (reply,) = wait_replies(client, keys, 1, timeout_s=40)
    results = {e.name: e for e in events(client, keys, "g3") if isinstance(e, ToolOutput)}
    assert results["record"].error == "outcome_unknown" and "unknown" in results["record"].text
    assert results["upsert"].text == "upserted b" and results["work"].text == "worked 1 ms"
    assert runs(client, namespace, "record") == 0 and runs(client, namespace, "upsert") == 1
    assert reply.status == "ended" and "outcome of this call is unknown" in reply.answer


def test_poison_job_that_kills_its_worker_is_dead_lettered_and_the_model_sees_an_error(
    client, keys, namespace, services
):
    services.env["AGENTSTREAM_MAX_DELIVERIES"] = "2"
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="g4", turn_id="t1", agent="plan", text="do: crash(x) work(1)")
    deadline = time.monotonic() + 60
    restarts = 0
    while not client.xrange(keys.replies) and time.monotonic() < deadline:
        proc = services.procs["tools-1"]
        if proc.poll() is not None:  # the worker died on the poison job: its supervisor restarts it
            services.procs.pop("tools-1")
            services.start("tools-1", "tool-worker")
            restarts += 1
        time.sleep(0.05)
    (reply,) = wait_replies(client, keys, 1, timeout_s=5)
    assert reply.status == "ended" and "could not be run" in reply.answer and "worked 1 ms" in reply.answer
    assert runs(client, namespace, "crash") == 2 == restarts  # two real deliveries, then the dead letter
    (dead,) = client.xrange(keys.dead(keys.tools_for("default", "g4")))
    assert dead[1][b"dead_deliveries"] == b"2" and dead[1][b"dead_error"].startswith(b"unknown")


def test_agentstream_cancel_stops_a_turn_and_waits_for_its_end(client, keys, services, model):
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker")
    publish_turn(client, keys, trace_id="g5", turn_id="t1", agent="plan", text="SLOW do: work(1)")
    wait_until(lambda: any(b"SLOW" in r for r in model.requests), what="the slow model request")
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "cancel", "g5", "--reason", "no longer needed"],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "turn failed (cancelled)" in proc.stdout and "no longer needed" in proc.stdout
    wait_replies(client, keys, 1)
    time.sleep(0.5)  # a second reply (the cancel's hint racing the step loop's release) would be here by now
    (reply,) = wait_replies(client, keys, 1)
    assert reply.code == "cancelled"


def test_redis_restart_with_aof_every_turn_still_finishes(namespace, keys, model, tmp_path):
    with RestartableRedis() as server:
        client = redis_sync.Redis.from_url(server.url)
        services = Services(
            redis_url=server.url, namespace=namespace, model_url=model.base_url, log_dir=tmp_path, extra_env=dict(FAST)
        )
        try:
            services.start("loop-1", "agent-loop")
            services.start("loop-2", "agent-loop")
            services.start("tools-1", "tool-worker")
            turns = []
            for i in range(24):
                trace, turn = f"r{i % 8}", f"t{i}"
                publish_turn(
                    client, keys, trace_id=trace, turn_id=turn, agent="plan", text=f"{turn} do: work(150) work(20)"
                )
                turns.append((trace, turn))
            wait_until(lambda: client.xlen(keys.replies) >= 4, what="the first replies")
            in_flight = len(turns) - client.xlen(keys.replies)
            for _ in range(2):
                server.kill()  # kill -9 while turns are in flight
                time.sleep(1.0)
                server.start()
                time.sleep(1.5)
            replies = wait_replies(client, keys, len(turns), timeout_s=120)
            assert {r.turn_id for r in replies} == {t for _, t in turns}  # every turn ended
            assert all(r.status == "ended" for r in replies)
            for trace in {t for t, _ in turns}:
                trace_events = events(client, keys, trace)
                results = [e for e in trace_events if isinstance(e, ToolOutput) and not e.late]
                calls = [c.id for e in trace_events if type(e).__name__ == "ModelOutput" for c in e.tool_calls]
                assert sorted(r.call_id for r in results) == sorted(calls)  # one result per call
                endings = [e.turn_id for e in trace_events if isinstance(e, (TurnEnded, TurnFailed))]
                assert len(endings) == len(set(endings)) == 3
            assert in_flight > 0  # the restarts hit work in flight
            logs = services.log("loop-1") + services.log("loop-2")
            assert "reconnecting" in logs or "lost Redis" in logs  # and the handlers that lost Redis ran again
        finally:
            services.stop_all()
            client.close()


def test_kill_9_of_the_process_that_queued_a_busy_conversations_turns_loses_none(client, keys, services):
    # the queued turns entered the trace and their entries were acknowledged; the process that
    # holds the conversation dies mid-call: another one answers every turn, once, in publish order
    from tests.integration.test_busy_fairness import GatedModel, turn

    with GatedModel() as model:
        services.env["OPENAI_BASE_URL"] = model.base_url
        services.start("loop-1", "agent-loop", env={"AGENTSTREAM_CONCURRENCY": "3"})
        published = [f"k{i}" for i in range(10)]
        for turn_id in published:
            client.xadd(keys.turns_for("crash"), {TURN_FIELD: turn("crash", turn_id)})
        wait_until(lambda: model.held == 1, what="the first turn's model call held")
        wait_until(
            lambda: (
                sum(isinstance(e, TurnInput) for e in events(client, keys, "crash")) == len(published)
                and client.xpending(keys.turns_for("crash"), "agent-loop")["pending"] == 1
            ),
            what="every turn in the trace, only the running one's entry pending",
        )
        services.stop("loop-1", kill=True)
        services.start("loop-2", "agent-loop")
        model.gate.set()
        replies = wait_replies(client, keys, len(published), timeout_s=60)
        assert [r.turn_id for r in replies] == published and {r.status for r in replies} == {"ended"}
        time.sleep(1.0)  # a second reply published late would show now
        assert client.xlen(keys.replies) == len(published)


def test_two_agent_loop_processes_admit_a_conversations_turns_in_publish_order(client, keys, services):
    # issue 36: pairs of turns of one conversation published back to back, each pair once both
    # processes wait on the stream (each reads one of the two), enter in publish order
    services.start("loop-1", "agent-loop")
    services.start("loop-2", "agent-loop")
    rounds = 20
    for r in range(rounds):
        pipe = client.pipeline(transaction=False)
        for turn_id in (f"a{r}", f"b{r}"):
            body = TurnMessage(trace_id=f"pair-{r}", turn_id=turn_id, agent="plan", text="say: hi")
            pipe.xadd(keys.turns_for(f"pair-{r}"), {TURN_FIELD: codec.encode(body)})
        pipe.execute()
        replies = wait_replies(client, keys, 2 * (r + 1), timeout_s=60)
    assert {r.status for r in replies} == {"ended"}
    wrong = [
        r
        for r in range(rounds)
        if [e.turn_id for e in events(client, keys, f"pair-{r}") if isinstance(e, TurnInput)] != [f"a{r}", f"b{r}"]
    ]
    assert wrong == [], f"{len(wrong)} of {rounds} pairs entered out of publish order"
