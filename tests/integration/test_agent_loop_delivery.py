"""The agent loop and tool worker on real Redis, in process: leases, busy policies, cancellation,
once-only tool runs, side effects, dead letters (issue 4; field cases C17, C27)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from agentstream.wire import codec
from agentstream.wire.events import (
    ModelOutput,
    ToolCall,
    ToolJob,
    ToolOutput,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.keys import JOB_FIELD, TURN_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, publish, wait_for, wait_reply
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
async def services(redis_url, namespace, model, monkeypatch):
    # the test tools count their effects in Redis under this namespace
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    s = InProcess(apps.app, redis_url, namespace, model.base_url)
    yield s
    await s.stop_all()


async def effects(redis, namespace) -> dict[str, int]:
    raw = await redis.hgetall(apps.effects_key(namespace))
    return {k.decode(): int(v) for k, v in raw.items()}


def runs_of(counts: dict[str, int], tool: str) -> int:
    return sum(v for k, v in counts.items() if k.endswith(f"/{tool}"))


async def test_a_parallel_turn_is_answered_with_results_in_call_order(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c1", turn_id="t1", agent="plan", text="do: work(30) work(1) record(a)")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended"
    assert reply.answer == "Results: worked 30 ms | worked 1 ms | recorded a"
    kinds = [type(e).__name__ for e in await events_of(store, "c1")]
    assert kinds.count("ToolOutput") == 3 and kinds.count("ToolStarted") == 1  # record has side effects


async def test_a_hint_for_a_trace_held_by_a_dead_worker_survives_until_its_lease_expires(redis, keys, services, store):
    # A worker died holding the trace's lease (no release). The turn's hint arrives meanwhile:
    # it must not be dropped, or nobody ever looks at the trace again.
    await redis.set(keys.lease("c2"), b"999999", px=1500)
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c2", turn_id="t1", agent="plan", text="do: work(1)")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended"
    loop = services.procs["p1"].loop
    assert loop is not None


async def test_queue_policy_answers_a_second_turn_after_the_first(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c3", turn_id="t1", agent="plan", text="do: work(400)")
    await publish(redis, keys, trace_id="c3", turn_id="t2", agent="plan", text="do: work(1)")
    await wait_reply(redis, keys, "t1")
    await wait_reply(redis, keys, "t2")
    events = await events_of(store, "c3")
    endings = [e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))]
    inputs = [e.turn_id for e in events if isinstance(e, TurnInput)]
    assert endings == inputs and sorted(inputs) == ["t1", "t2"]  # one at a time, in trace order
    first_end = next(i for i, e in enumerate(events) if isinstance(e, TurnEnded))
    second = next(e for e in events if isinstance(e, ModelOutput) and e.turn_id == inputs[1])
    assert events.index(second) > first_end  # the second turn's first model call waited for the first's end


async def test_reject_policy_fails_a_turn_on_a_busy_conversation(redis, keys, services, store):
    services.env["AGENTSTREAM_BUSY_POLICY"] = "reject"
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c4", turn_id="t1", agent="plan", text="do: work(800)")
    await wait_for(lambda: _has(store, "c4", ModelOutput), what="t1's first model output")
    await publish(redis, keys, trace_id="c4", turn_id="t2", agent="plan", text="do: work(1)")
    rejected = await wait_reply(redis, keys, "t2")
    assert rejected.status == "failed" and rejected.code == "busy" and "t1" in rejected.reason
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    inputs = [e.turn_id for e in await events_of(store, "c4") if isinstance(e, TurnInput)]
    assert inputs == ["t1"]  # a rejected turn never enters the conversation's history


async def test_interrupt_policy_cancels_the_running_turn_and_runs_the_new_one(redis, keys, services, store, model):
    services.env["AGENTSTREAM_BUSY_POLICY"] = "interrupt"
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c5", turn_id="t1", agent="plan", text="SLOW do: work(1)")  # a 60 s model call
    await wait_for(lambda: _model_saw(model, "SLOW"), what="the slow model request")
    await publish(redis, keys, trace_id="c5", turn_id="t2", agent="plan", text="do: work(1)")
    first = await wait_reply(redis, keys, "t1", timeout_s=30)
    assert first.status == "failed" and first.code == "cancelled" and "interrupt" in first.reason
    assert (await wait_reply(redis, keys, "t2", timeout_s=30)).status == "ended"
    assert not any(isinstance(e, ModelOutput) and e.turn_id == "t1" for e in await events_of(store, "c5"))


async def test_cancel_aborts_the_in_flight_model_request(redis, keys, services, store, model):
    from agentstream.runtime.cancel import publish_cancel
    from agentstream.wire.events import CancelMessage

    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c6", turn_id="t1", agent="plan", text="SLOW do: work(1)")
    await wait_for(lambda: _model_saw(model, "SLOW"), what="the slow model request")
    await publish_cancel(redis, keys, CancelMessage(trace_id="c6", by="user", reason="changed my mind"))
    reply = await wait_reply(redis, keys, "t1", timeout_s=30)  # the model would answer after 60 s
    assert reply.status == "failed" and reply.code == "cancelled" and "changed my mind" in reply.reason
    events = await events_of(store, "c6")
    assert [type(e).__name__ for e in events] == ["TurnInput", "CancelRequested", "TurnFailed"]


async def test_c27_cancel_while_tools_run_queued_skipped_running_told_late_result_kept_out(
    redis, keys, services, store, model, namespace
):
    # One tool slot: sleepy (sync, ignores cancels) runs, record and work wait in the queue.
    os.environ["AGENTSTREAM_TEST_SLEEPY_S"] = "1.5"
    try:
        services.env["AGENTSTREAM_CONCURRENCY"] = "1"
        await services.start("p1", "agent-loop", "tool-worker")
        await publish(redis, keys, trace_id="c7", turn_id="t1", agent="plan", text="do: sleepy(a) record(b) work(10)")
        await wait_for(lambda: _effect(redis, namespace, "sleepy"), what="sleepy running")
        from agentstream.runtime.cancel import publish_cancel
        from agentstream.wire.events import CancelMessage

        await publish_cancel(redis, keys, CancelMessage(trace_id="c7", by="user"))
        reply = await wait_reply(redis, keys, "t1")
        assert reply.code == "cancelled"

        async def late_recorded():
            return [e for e in await events_of(store, "c7") if isinstance(e, ToolOutput) and e.late]

        (late,) = await wait_for(late_recorded, what="sleepy's late result")
        assert late.text == "slept for a"
        counts = await effects(redis, namespace)
        assert runs_of(counts, "record") == 0 and runs_of(counts, "work") == 0  # queued jobs skipped
        results = [e for e in await events_of(store, "c7") if isinstance(e, ToolOutput) and not e.late]
        assert [r.error for r in results] == ["cancelled"] * 3

        # The next turn: every call of t1 has exactly one (cancelled) result, in call order, before
        # the new user message; the late result is nowhere.
        await publish(redis, keys, trace_id="c7", turn_id="t2", agent="plan", text="Actually, just do: work(1)")
        assert (await wait_reply(redis, keys, "t2")).status == "ended"
        body = json.loads(model.requests[-2])  # t2's first model call
        roles = [(m["role"], m.get("tool_call_id")) for m in body["messages"] if m["role"] != "system"]
        t1_calls = [c["id"] for c in body["messages"][2]["tool_calls"]]
        assert roles == [("user", None), ("assistant", None), *[("tool", c) for c in t1_calls], ("user", None)]
        assert all(m["content"].startswith("Cancelled") for m in body["messages"] if m["role"] == "tool")
        assert "slept for a" not in model.requests[-2].decode()
    finally:
        os.environ.pop("AGENTSTREAM_TEST_SLEEPY_S", None)


async def test_running_tools_are_told_of_a_cancel(redis, keys, services, store, namespace):
    # An async tool's task is cancelled; a sync tool sees current_call().cancelled and stops early.
    os.environ["AGENTSTREAM_TEST_RECORD_S"] = "20"
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await publish(redis, keys, trace_id="c8", turn_id="t1", agent="plan", text="do: work(20000) record(x)")
        await wait_for(lambda: _effect(redis, namespace, "work"), what="work running")
        await wait_for(lambda: _has(store, "c8", ToolStarted), what="record started")
        from agentstream.runtime.cancel import publish_cancel
        from agentstream.wire.events import CancelMessage

        await publish_cancel(redis, keys, CancelMessage(trace_id="c8"))
        assert (await wait_reply(redis, keys, "t1")).code == "cancelled"
        await wait_for(lambda: _effect(redis, namespace, "record-saw-cancel"), what="record seeing the cancel")
        worker = services.procs["p1"].worker
        await wait_for(lambda: _true(not worker._running), what="the worker's calls to stop")
    finally:
        os.environ.pop("AGENTSTREAM_TEST_RECORD_S", None)


async def test_a_tool_job_delivered_twice_runs_once(redis, keys, services, store, namespace):
    trace, call = await _one_call(store, "c9", "work", '{"ms": 300}')
    job = codec.encode(ToolJob(trace_id=trace, turn_id="t1", call_id=call, name="work", arguments='{"ms": 300}'))
    for _ in range(2):  # published twice (say, by a stale lease holder)
        await redis.xadd(keys.tools_for("default", trace), {JOB_FIELD: job})
    await services.start("w1", "tool-worker")
    await services.start("w2", "tool-worker")

    async def answered():
        return [e for e in await events_of(store, trace) if isinstance(e, ToolOutput)]

    await wait_for(answered, what="the result")
    await asyncio.sleep(0.5)
    assert len(await answered()) == 1
    assert runs_of(await effects(redis, namespace), "work") == 1
    pending = await redis.xpending(keys.tools_for("default", trace), "tool-workers")
    assert pending["pending"] == 0


@pytest.mark.parametrize(
    ("tool", "runs", "error"),
    [("record", 0, "outcome_unknown"), ("upsert", 1, None), ("work", 1, None)],
)
async def test_redelivery_after_a_crash_mid_run_of_a_side_effect_tool(
    redis, keys, services, store, namespace, tool, runs, error
):
    # The first delivery claimed the call and (side effects) wrote tool_started, then its worker
    # died. The re-delivery must not run a side-effect tool again unless it is retry_safe.
    arguments = '{"ms": 1}' if tool == "work" else '{"key": "k"}'
    trace, call = await _one_call(store, f"c10-{tool}", tool, arguments)
    stream = keys.tools_for("default", trace)
    entry = await redis.xadd(
        stream,
        {JOB_FIELD: codec.encode(ToolJob(trace_id=trace, turn_id="t1", call_id=call, name=tool, arguments=arguments))},
    )
    ref = f"{stream}/{entry.decode()}"
    state = await store.begin_call(trace, "t1", call, ref)
    assert state.claimed
    if tool != "work":
        await store.append(trace, ToolStarted(turn_id="t1", call_id=call, name=tool, worker="dead", job=ref))
    await services.start("w1", "tool-worker")

    async def answered():
        return [e for e in await events_of(store, trace) if isinstance(e, ToolOutput)]

    (result,) = await wait_for(answered, what="the result")
    assert result.error == error
    assert runs_of(await effects(redis, namespace), tool) == runs
    if error:
        assert "unknown" in result.text


async def test_a_tool_job_that_fails_every_delivery_gives_the_model_an_error_result(
    redis, keys, services, store, monkeypatch
):
    services.env.update({"AGENTSTREAM_MAX_DELIVERIES": "2", "AGENTSTREAM_MIN_IDLE_MS": "200"})
    proc = await services.start("p1", "agent-loop", "tool-worker")
    worker = proc.worker
    real = worker.store.begin_call

    async def broken(trace_id, turn_id, call_id, job, **options):
        if trace_id == "c11":
            raise RuntimeError("disk on fire")
        return await real(trace_id, turn_id, call_id, job, **options)

    monkeypatch.setattr(worker.store, "begin_call", broken)
    await publish(redis, keys, trace_id="c11", turn_id="t1", agent="plan", text="do: work(1)")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and "disk on fire" in reply.answer  # the model saw the error
    (result,) = [e for e in await events_of(store, "c11") if isinstance(e, ToolOutput)]
    assert result.error == "dead_letter"
    (dead,) = await redis.xrange(keys.dead(keys.tools_for("default", "c11")))
    assert dead[1][b"dead_deliveries"] == b"2" and b"disk on fire" in dead[1][b"dead_error"]


async def test_a_wake_up_that_fails_every_delivery_ends_its_turn_with_a_reason(
    redis, keys, services, store, monkeypatch
):
    services.env.update({"AGENTSTREAM_MAX_DELIVERIES": "2", "AGENTSTREAM_MIN_IDLE_MS": "200"})
    proc = await services.start("p1", "agent-loop", "tool-worker")
    loop = proc.loop
    real = loop.advance
    calls = []

    async def broken(trace_id, **kwargs):
        calls.append(trace_id)
        if trace_id == "c12":  # the turn starts (its entry takes the trace itself); every wake-up then fails
            raise RuntimeError("context builder crashed")
        return await real(trace_id, **kwargs)

    monkeypatch.setattr(loop, "advance", broken)
    await publish(redis, keys, trace_id="c12", turn_id="t1", agent="plan", text="do: work(1)")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "failed" and reply.code == "dead_letter" and "context builder crashed" in reply.reason


async def test_trace_retention_is_an_explicit_setting(redis, keys, services, store):
    services.env["AGENTSTREAM_TRACE_RETENTION_S"] = "3600"
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c13", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_reply(redis, keys, "t1")
    assert 0 < await redis.ttl(keys.trace("c13")) <= 3600
    assert 0 < await redis.ttl(keys.trace_keys("c13")) <= 3600


async def test_traces_are_kept_forever_by_default(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c14", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_reply(redis, keys, "t1")
    assert await redis.ttl(keys.trace("c14")) == -1


# --- helpers ----------------------------------------------------------------------------------


async def _has(store, trace_id, event_type):
    return any(isinstance(e, event_type) for e in await events_of(store, trace_id))


async def _model_saw(model, text):
    return any(text.encode() in r for r in model.requests)


async def _effect(redis, namespace, tool):
    return runs_of(await effects(redis, namespace), tool) > 0


async def _true(value):
    return value


async def _one_call(store, trace_id, tool, arguments):
    call_id = f"call-{trace_id}"
    await store.append(trace_id, TurnInput(turn_id="t1", agent="plan", text="x"))
    await store.append(
        trace_id,
        ModelOutput(
            turn_id="t1",
            step=0,
            tool_calls=(ToolCall(id=call_id, name=tool, arguments=arguments),),
            stop_reason="tool_calls",
        ),
    )
    return trace_id, call_id


async def test_a_dead_lettered_turn_leaves_no_call_without_a_result(redis, keys, services, store):
    from agentstream.wire.events import Wake
    from agentstream.wire.keys import WAKE_FIELD

    proc = await services.start("p1", "agent-loop")
    trace, call = await _one_call(store, "c15", "work", '{"ms": 1}')
    await proc.loop.on_dead_wake("1-0", {WAKE_FIELD: codec.encode(Wake(trace_id=trace))}, "boom")
    events = await events_of(store, trace)
    assert [type(e).__name__ for e in events[-2:]] == ["ToolOutput", "TurnFailed"]
    assert events[-2].call_id == call and events[-2].error == "dead_letter"
    assert events[-1].code == "dead_letter" and "boom" in events[-1].reason


async def test_a_queued_job_of_a_cancelled_turn_is_skipped_by_the_cancel_key(redis, keys, services, store, namespace):
    # The cancel is in the trace but the agent loop has not written the cancelled results yet
    # (it is busy elsewhere): the worker checks the trace's cancel key and never runs the job.
    from agentstream.wire.events import CancelRequested

    trace, call = await _one_call(store, "c16", "work", '{"ms": 1}')
    await store.append(trace, CancelRequested(turn_id="t1", by="user"))
    await redis.xadd(
        keys.tools_for("default", trace),
        {
            JOB_FIELD: codec.encode(
                ToolJob(trace_id=trace, turn_id="t1", call_id=call, name="work", arguments='{"ms": 1}')
            )
        },
    )
    proc = await services.start("w1", "tool-worker")
    await wait_for(lambda: _true(proc.worker.skipped == 1), what="the job skipped")
    assert runs_of(await effects(redis, namespace), "work") == 0
    assert not [e for e in await events_of(store, trace) if isinstance(e, ToolOutput)]


async def test_an_agent_loop_stopped_mid_model_call_gives_back_the_lease_and_the_entry(
    redis, keys, services, store, model
):
    # SIGTERM and the grace period runs out during a (60 s) model call: the step is cancelled,
    # the trace's lease is released and the turn entry is released for another agent loop.
    services.env["AGENTSTREAM_SHUTDOWN_GRACE_S"] = "0.3"
    services.env["AGENTSTREAM_MIN_IDLE_MS"] = "3600000"
    await services.start("p1", "agent-loop")
    await publish(redis, keys, trace_id="c17", turn_id="t1", agent="plan", text="SLOW do: work(1)")
    await wait_for(lambda: _model_saw(model, "SLOW"), what="the slow model request")
    assert await redis.exists(keys.lease("c17"))
    await services.stop("p1")
    assert not await redis.exists(keys.lease("c17"))
    (pending,) = await redis.xpending_range(keys.turns_for("c17"), "agent-loop", min="-", max="+", count=10)
    assert pending["time_since_delivered"] >= 1_000_000_000  # released: any loop claims it at once


async def test_a_lease_is_renewed_while_a_model_call_outlasts_it(redis, keys, services, store, model):
    # A model call of 60 s under a lease of 1 s (the least the settings take): the holder renews it every third of its time
    # to live (from a timer, which starts the renewing task only once a hold lasts that long), so
    # the trace stays held by the same token, and the entry is not taken from under the step.
    services.env["AGENTSTREAM_LEASE_TTL_MS"] = "1000"
    services.env["AGENTSTREAM_SHUTDOWN_GRACE_S"] = "0.3"
    await services.start("p1", "agent-loop")
    await publish(redis, keys, trace_id="c19", turn_id="t1", agent="plan", text="SLOW do: work(1)")
    await wait_for(lambda: _model_saw(model, "SLOW"), what="the slow model request")
    token = await redis.get(keys.lease("c19"))
    assert token is not None
    await asyncio.sleep(3.0)  # three times the lease's time to live
    assert await redis.get(keys.lease("c19")) == token
    assert 0 < await redis.pttl(keys.lease("c19")) <= 1000
    await services.stop("p1")


async def test_a_reply_lost_between_a_turns_end_and_its_publication_still_goes_out(redis, keys, services, store):
    # A worker appended t1's ending and died before publishing its reply; t2 was queued behind it.
    await store.append("c18", TurnInput(turn_id="t1", agent="plan", text="x"))
    await store.append("c18", TurnEnded(turn_id="t1", answer="first"))
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c18", turn_id="t2", agent="plan", text="do: work(1)")
    assert (await wait_reply(redis, keys, "t2")).status == "ended"
    assert (await wait_reply(redis, keys, "t1")).answer == "first"


async def test_turns_of_one_conversation_published_back_to_back_enter_its_trace_in_order(redis, keys, services, store):
    """A chat user who sends several messages at once: the turns enter the trace, and are
    answered, in the order they were published (one agent-loop process)."""
    await services.start("p1", "agent-loop", "tool-worker")
    turn_ids = [f"t{i}" for i in range(6)]
    pipe = redis.pipeline(transaction=False)
    for turn_id in turn_ids:
        body = {"trace_id": "c-order", "turn_id": turn_id, "agent": "plan", "text": "do: work(1)"}
        pipe.xadd(keys.turns_for("c-order"), {TURN_FIELD: json.dumps(body).encode()})
    await pipe.execute()
    for turn_id in turn_ids:
        await wait_reply(redis, keys, turn_id)
    events = await events_of(store, "c-order")
    assert [e.turn_id for e in events if isinstance(e, TurnInput)] == turn_ids
    assert [e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))] == turn_ids
