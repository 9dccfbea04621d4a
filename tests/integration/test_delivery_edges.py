"""Delivery at the edges, on a real Redis (issue 10): failures of any kind reach the dead-letter
stream, replies are marked sent only once written, a malformed copy of a running turn leaves it
running, and the consumers of dead pods are deleted when they own nothing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from redis.exceptions import ResponseError

from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolJob, ToolOutput, TurnFailed
from agentstream.wire.keys import AGENT_LOOP_GROUP, JOB_FIELD, TOOL_WORKER_GROUP, TURN_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, publish, wait_for, wait_reply
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration

DEEP = b'{"trace_id":"x","z":' + b"[" * 3000 + b"]" * 3000 + b"}"


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
async def services(redis_url, namespace, model, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    s = InProcess(apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_MAX_DELIVERIES": "2"})
    yield s
    await s.stop_all()


def consumer(redis, keys, name, handler, on_dead_letter=None, **config):
    stream = f"{keys.namespace}:work"
    return StreamConsumer(
        redis,
        stream=stream,
        group="g",
        consumer=name,
        handler=handler,
        dead_stream=keys.dead(stream),
        on_dead_letter=on_dead_letter,
        config=ConsumerConfig(
            **{
                "block_ms": 50,
                "min_idle_ms": 5_000,
                "reclaim_interval_ms": 50,
                "retry_delay_s": 0.02,
                "max_deliveries": 3,
                **config,
            }
        ),
    )


async def run_until(consumer_, predicate, timeout_s=10.0):
    stop = asyncio.Event()
    task = asyncio.create_task(consumer_.run(stop))
    try:
        return await wait_for(predicate, timeout_s)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


ENTRIES = 128

# --- 1. a consumer holds no more than it can start, renews all it holds, confirms before it starts --


@pytest.mark.slow
@pytest.mark.parametrize("handler_s", [(0.7, 1.3), (1.5, 3.0)], ids=["around-the-idle-time", "over-the-idle-time"])
async def test_no_entry_is_handled_twice_with_handlers_near_or_over_the_idle_time(redis, keys, handler_s):
    # the services' own concurrency (16) and batch size (32), an idle time of 1 s, two consumers
    stream = f"{keys.namespace}:work"
    starts: Counter = Counter()
    rng = random.Random(5)

    async def handler(entry_id, fields):
        starts[entry_id] += 1
        await asyncio.sleep(rng.uniform(*handler_s))

    consumers = [
        consumer(
            redis, keys, f"w{i}", handler, min_idle_ms=1000, concurrency=16, batch_size=32, reclaim_interval_ms=100
        )
        for i in range(2)
    ]
    await consumers[0].ensure_group()
    for i in range(ENTRIES):
        await redis.xadd(stream, {b"x": str(i).encode()})
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]

    async def all_done():
        return sum(c.handled for c in consumers) >= ENTRIES and (await redis.xpending(stream, "g"))["pending"] == 0

    try:
        await wait_for(all_done, 60, "every entry handled")
        await asyncio.sleep(1.5)  # time for a late claim to show up
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert len(starts) == ENTRIES
    assert [e for e, n in starts.items() if n > 1] == []  # handled twice: none
    assert sum(c.reclaimed for c in consumers) == 0


async def test_an_entry_claimed_by_another_consumer_before_its_handler_starts_is_not_run(redis, keys):
    stream = f"{keys.namespace}:work"
    ran = []

    async def handler(entry_id, fields):
        ran.append(entry_id)

    c = consumer(redis, keys, "w1", handler, min_idle_ms=1000)
    await c.ensure_group()
    entry = (await redis.xadd(stream, {b"x": b"1"})).decode()
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)
    await redis.xclaim(stream, "g", "w2", 0, [entry])  # another consumer took it meanwhile
    await c._dispatch(entry, {b"x": b"1"})
    await asyncio.gather(*c._inflight.values())
    assert ran == [] and c.taken_before_start == 1
    (row,) = await redis.xpending_range(stream, "g", "-", "+", 10)
    assert row["consumer"] == b"w2"  # left to its new owner, not acknowledged
    assert await redis.hget(c.attempts_key, entry) is None  # no delivery counted


async def effects(redis, namespace) -> dict[str, int]:
    raw = await redis.hgetall(apps.effects_key(namespace))
    return {k.decode(): int(v) for k, v in raw.items()}


async def test_a_tool_call_runs_once_when_its_job_is_claimed_by_another_worker_mid_run(
    redis, keys, namespace, services, store, monkeypatch
):
    # Tools slower than the claim idle time (1 s), and their job entries taken from the worker
    # that runs them (as when its claim renewals lapse): no second run, no false outcome unknown.
    monkeypatch.setenv("AGENTSTREAM_TEST_SLEEPY_S", "2.5")
    monkeypatch.setenv("AGENTSTREAM_TEST_RECORD_S", "2.5")
    services.env["AGENTSTREAM_LEASE_TTL_MS"] = "4000"  # the run keys' TTL: margin for a loaded machine
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c1", turn_id="t1", agent="plan", text="do: sleepy(a) record(b)")
    stream = keys.tools_for("default", "c1")

    async def running():
        try:
            rows = await redis.xpending_range(stream, TOOL_WORKER_GROUP, "-", "+", 10)
        except ResponseError:  # NOGROUP: the worker has not created its group yet
            return None
        sleepy_started = any(k.endswith("/sleepy") for k in await effects(redis, namespace))
        record_started = any(k.startswith(b"started:") for k in await redis.hkeys(keys.trace_keys("c1")))
        return rows if len(rows) == 2 and sleepy_started and record_started else None

    rows = await wait_for(running, 15, "both calls running")
    await asyncio.sleep(0.3)
    for row in rows:  # taken away from the worker that runs them, by a worker that then starts
        await redis.xclaim(stream, TOOL_WORKER_GROUP, "p2", 0, [row["message_id"]])
    await services.start("p2", "tool-worker")  # it drains its pending entries: these two jobs
    reply = await wait_reply(redis, keys, "t1", timeout_s=30)
    assert reply.status == "ended" and reply.answer == "Results: slept for a | recorded b"
    counts = await effects(redis, namespace)
    assert sorted(counts.values()) == [1, 1], counts  # each tool ran once
    results = [e for e in await events_of(store, "c1") if isinstance(e, ToolOutput)]
    assert [r.error for r in results] == [None, None]  # no false outcome unknown, nothing late
    assert sum(p.worker.run_elsewhere for p in services.procs.values()) >= 1


# --- 8. a tool job runs only for a call of its trace's running turn ---------------------------------


async def test_a_tool_job_for_a_call_its_trace_never_made_is_dropped_and_reported(
    redis, keys, namespace, services, store
):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="real", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_reply(redis, keys, "t1")
    strays = [
        ToolJob(trace_id="nowhere", turn_id="t1", call_id="c1", name="work", arguments='{"ms": 1}'),  # no such trace
        ToolJob(trace_id="real", turn_id="t9", call_id="c1", name="work", arguments='{"ms": 1}'),  # no such turn
        ToolJob(
            trace_id="real", turn_id="t1", call_id="forged", name="work", arguments='{"ms": 1}'
        ),  # ended turn, no call
    ]
    before = len(await events_of(store, "real"))
    for job in strays:
        await redis.xadd(keys.tools("default"), {JOB_FIELD: codec.encode(job)})
    await wait_for(lambda: _pending(redis, keys.tools("default"), TOOL_WORKER_GROUP), 10)
    await asyncio.sleep(0.3)
    assert not await redis.exists(keys.trace("nowhere"), keys.trace_keys("nowhere"))  # no brand-new trace
    assert len(await events_of(store, "real")) == before  # nothing written into the real one
    assert sum(1 for k in (await effects(redis, namespace)) if "/forged/" in k or k.startswith("nowhere/")) == 0
    errors = [f[b"error"] for _, f in await redis.xrange(keys.errors)]
    assert sum(b"names no call that may run" in e for e in errors) == 3  # its turn ended: still a call never made
    assert any(b"made no call 'forged'" in e for e in errors)
    assert services.procs["p1"].worker.strays == 3


async def test_a_resent_job_of_a_real_call_of_an_ended_turn_is_skipped_without_a_report(
    redis, keys, namespace, services, store
):
    # a legitimate redelivery (a backend or an operator published the job again): not an error
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="real2", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_reply(redis, keys, "t1")
    stream = keys.tools_for("default", "real2")  # the trace's partition of the queue
    ((_, fields),) = await redis.xrange(stream)  # the job the loop published
    before = len(await events_of(store, "real2"))
    runs = len(await effects(redis, namespace))
    again = await redis.xadd(stream, {JOB_FIELD: fields[JOB_FIELD]})
    await wait_for(lambda: _handled(redis, stream, TOOL_WORKER_GROUP, again), 10)
    assert await redis.xlen(keys.errors) == 0
    assert services.procs["p1"].worker.strays == 0
    assert len(await events_of(store, "real2")) == before and len(await effects(redis, namespace)) == runs


async def _handled(redis, stream, group, entry_id: bytes) -> bool:
    """The group read ``entry_id`` and acknowledged everything it read."""
    (info,) = [g for g in await redis.xinfo_groups(stream) if g["name"] == group.encode()]
    last = tuple(int(p) for p in info["last-delivered-id"].split(b"-"))
    return last >= tuple(int(p) for p in entry_id.split(b"-")) and info["pending"] == 0


async def test_a_tool_job_for_a_call_of_the_running_turn_that_it_did_not_make_is_dropped(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="r2", turn_id="t1", agent="plan", text="do: work(1500)")
    await wait_for(lambda: store.has_key("r2", "jobs:t1:0"), 10)
    forged = ToolJob(trace_id="r2", turn_id="t1", call_id="forged", name="record", arguments='{"key": "x"}')
    await redis.xadd(keys.tools("default"), {JOB_FIELD: codec.encode(forged)})
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: worked 1500 ms"
    assert not [e for e in await events_of(store, "r2") if isinstance(e, ToolOutput) and e.call_id == "forged"]
    errors = [f[b"error"] for _, f in await redis.xrange(keys.errors)]
    assert any(b"made no call 'forged'" in e for e in errors)


# --- 2. any failure counts; the dead-letter hook cannot keep an entry from its dead letter --------


async def test_an_entry_whose_dead_letter_hook_fails_too_still_reaches_the_dead_letter_stream(redis, keys):
    stream = f"{keys.namespace}:work"
    hook_calls = []

    async def deep(entry_id, fields):
        codec.decode_turn(fields[b"turn"])  # TurnRejected now; any kind of failure counts the same
        raise RecursionError("maximum recursion depth exceeded while deserializing an object")

    async def hook(entry_id, fields, error):
        hook_calls.append(error)
        raise RecursionError("maximum recursion depth exceeded while deserializing an object")  # fails again

    c = consumer(redis, keys, "w1", deep, hook)
    await c.ensure_group()
    await redis.xadd(stream, {b"turn": DEEP})
    dead = await run_until(c, lambda: redis.xrange(keys.dead(stream)))
    (entry,) = dead
    fields = entry[1]
    assert fields[b"turn"][:2048] == DEEP[:2048]  # the payload, as it came (the wire limits may cut a long one)
    assert fields[b"dead_deliveries"] == b"3" and b"TurnRejected" in fields[b"dead_error"]
    assert b"RecursionError" in fields[b"dead_hook_error"]
    assert len(hook_calls) == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert c.dead_lettered == 1


async def test_a_turn_on_a_trace_with_an_unreadable_entry_ends_with_a_reason(redis, keys, services, store):
    # a hand-written entry that no decoder reads: every step of the trace fails
    await redis.xadd(keys.trace("bad"), {b"v": b"1", b"e": b'{"type":"turn_input","turn_id":'})  # cut off
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="bad", turn_id="t1", agent="plan", text="do: work(1)")
    reply = await wait_reply(redis, keys, "t1", timeout_s=30)
    assert reply.status == "failed" and reply.code == "dead_letter"
    assert "EventDecodeError" in reply.reason and "trace 'bad' entry" in reply.reason
    # the dead-letter hook publishes the failure's reply, then the entry moves to the dead-letter stream
    dead_stream = keys.dead(keys.turns_for("bad"))
    (dead,) = await wait_for(lambda: redis.xrange(dead_stream), 10, what=f"an entry on {dead_stream}")
    assert codec.decode_turn(dead[1][TURN_FIELD]).turn_id == "t1"
    assert b"EventDecodeError" in dead[1][b"dead_error"] and b"dead_hook_error" not in dead[1]
    assert await wait_for(lambda: _pending(redis, keys.turns_for("bad"), "agent-loop"), 10) is True


async def _pending(redis, stream, group):
    return (await redis.xpending(stream, group))["pending"] == 0


# --- 5. a malformed copy of a running turn does not end it ---------------------------------------


async def test_a_malformed_copy_of_a_running_turn_leaves_the_turn_running(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c5", turn_id="t1", agent="plan", text="do: work(1500)")
    await wait_for(lambda: store.has_key("c5", "jobs:t1:0"), 10)  # running: its tool call is out
    await redis.xadd(keys.turns, {TURN_FIELD: b'{"trace_id":"c5","turn_id":"t1","agent":"plan","text":7}'})
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: worked 1500 ms"
    errors = await redis.xrange(keys.errors)
    assert any(b"malformed copy of turn 't1'" in f[b"error"] for _, f in errors)
    assert not [e for e in await events_of(store, "c5") if isinstance(e, TurnFailed)]


async def test_a_malformed_turn_is_ended_only_under_the_trace_lease(redis, keys, services, store):
    # another worker holds the trace: the bad turn's ending waits for the lease (fencing)
    # (held until the test lets it go, so a loaded machine cannot let it lapse early)
    await redis.set(keys.lease("c5b"), b"999999")
    await services.start("p1", "agent-loop")
    await redis.xadd(keys.turns, {TURN_FIELD: b'{"trace_id":"c5b","turn_id":"t1","agent":"plan","text":7}'})

    async def delivered() -> bool:  # the agent loop has read the entry (and could not end it yet)
        try:
            return (await redis.xpending(keys.turns, AGENT_LOOP_GROUP))["pending"] > 0
        except ResponseError:  # its group is not made yet
            return False

    await wait_for(delivered, timeout_s=10, what="the bad turn's delivery")
    await asyncio.sleep(0.3)  # its attempts to end the turn meanwhile are fenced off by the lease
    assert not await store.has_key("c5b", "end:t1")  # not written while another holds the lease
    await redis.delete(keys.lease("c5b"))
    reply = await wait_reply(redis, keys, "t1", timeout_s=30)
    assert reply.status == "failed" and reply.code == "bad_turn" and "$.text" in reply.reason


# --- 6. a reply is marked sent only once it was written --------------------------------------------


async def test_a_reply_that_could_not_be_written_is_retried_not_marked_sent(redis, keys, services, store):
    await redis.set(keys.replies, b"not a stream")  # XADD gets WRONGTYPE
    services.env["AGENTSTREAM_MAX_DELIVERIES"] = "50"
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c6", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_for(lambda: store.has_key("c6", "end:t1"), 15)
    await asyncio.sleep(1.0)  # a few retries of the reply
    assert not await store.has_key("c6", "reply:t1")
    await redis.delete(keys.replies)  # the backend fixes its key: the retry writes the reply
    reply = await wait_reply(redis, keys, "t1", timeout_s=20)
    assert reply.status == "ended"
    assert await store.has_key("c6", "reply:t1")


async def test_a_reply_that_never_can_be_written_is_dead_lettered_with_the_reason(redis, keys, services, store):
    await redis.set(keys.replies, b"not a stream")
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c6b", turn_id="t1", agent="plan", text="do: work(1)")

    async def dead():
        return [f for s in (keys.turns_for("c6b"), keys.wake_for("c6b")) for _, f in await redis.xrange(keys.dead(s))]

    records = await wait_for(dead, 30, "a dead letter")
    assert any(b"WRONGTYPE" in f[b"dead_error"] for f in records)
    assert not await store.has_key("c6b", "reply:t1")


# --- 7. consumers of dead pods are deleted, never one that owns entries ------------------------------


async def test_idle_consumers_that_own_nothing_are_deleted_and_owners_kept(redis, keys):
    stream = f"{keys.namespace}:work"
    c = consumer(
        redis, keys, "live", lambda *_: asyncio.sleep(0), delete_idle_consumers_ms=300, reclaim_interval_ms=100
    )
    await c.ensure_group()
    await redis.xgroup_createconsumer(stream, "g", "gone-empty")
    await redis.xadd(stream, {b"x": b"1"})
    await redis.xreadgroup("g", "gone-owner", {stream: ">"}, count=1)  # read, never acknowledged
    await asyncio.sleep(0.4)

    async def names():
        return {_s(row["name"]) for row in await redis.xinfo_consumers(stream, "g")}

    await run_until(c, lambda: _without(names, "gone-empty"), timeout_s=5)
    assert {"gone-owner", "live"} <= await names()
    assert c.consumers_deleted == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 1  # the owner's entry is still there


async def _without(names, name):
    return name not in await names()


def _s(value):
    return value.decode() if isinstance(value, bytes) else value


# --- 4. call ids name one call of the trace; a duplicate id runs and is answered ----------------------


def repeating_ids_rule(body):
    """``parallel_rule``, but every tool call has the id ``call_0`` (in every turn, and twice in one output)."""
    reply = parallel_rule(body)
    for call in reply["message"].get("tool_calls") or ():
        call["id"] = "call_0"
    return reply


async def test_repeated_call_ids_within_an_output_and_across_turns_each_run_and_are_answered(
    redis_url, redis, keys, namespace, store, monkeypatch
):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    with ScriptedModelServer(repeating_ids_rule) as model:
        s = InProcess(apps.app, redis_url, namespace, model.base_url)
        try:
            await s.start("p1", "agent-loop", "tool-worker")
            await publish(redis, keys, trace_id="ids", turn_id="t1", agent="plan", text="t1 do: work(5) work(6)")
            await publish(redis, keys, trace_id="ids", turn_id="t2", agent="plan", text="t2 do: work(7)")
            first = await wait_reply(redis, keys, "t1", timeout_s=20)
            second = await wait_reply(redis, keys, "t2", timeout_s=20)
        finally:
            await s.stop_all()
    assert first.status == "ended" and first.answer == "Results: worked 5 ms | worked 6 ms"
    assert second.status == "ended" and second.answer == "Results: worked 7 ms"
    events = await events_of(store, "ids")
    calls = [c.id for e in events if type(e).__name__ == "ModelOutput" for c in e.tool_calls]
    assert len(calls) == len(set(calls)) == 3
    results = [e for e in events if isinstance(e, ToolOutput)]
    assert sorted(r.call_id for r in results) == sorted(calls) and not any(r.late for r in results)
    counts = await effects(redis, namespace)
    assert sum(counts.values()) == 3  # each call ran once


# --- 4. a watchdog ends a turn whose awaited work vanished ----------------------------------------


async def _job_of(redis, keys, trace_id):
    entries = await redis.xrange(keys.tools_for("default", trace_id))
    return next(eid for eid, f in entries if codec.decode_job(f[JOB_FIELD]).trace_id == trace_id)


@pytest.mark.parametrize("how", ["deleted", "acknowledged"])
async def test_a_turn_whose_tool_job_vanished_is_ended_by_the_watchdog(redis, keys, services, store, how):
    services.env["AGENTSTREAM_WATCHDOG_INTERVAL_MS"] = "300"
    await services.start("p1", "agent-loop")  # no tool worker yet: the job waits
    await publish(redis, keys, trace_id="w1", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_for(lambda: store.has_key("w1", "jobs:t1:0"), 10)
    await publish(redis, keys, trace_id="w1", turn_id="t2", agent="plan", text="do: work(2)")  # queued behind t1
    entry = await _job_of(redis, keys, "w1")
    stream = keys.tools_for("default", "w1")
    if how == "deleted":
        await redis.xdel(stream, entry)
    else:  # read and acknowledged with no result written (a worker's bug, or by hand)
        await redis.xgroup_create(stream, TOOL_WORKER_GROUP, id="0", mkstream=True)
        await redis.xreadgroup(TOOL_WORKER_GROUP, "buggy", {stream: ">"}, count=10)
        await redis.xack(stream, TOOL_WORKER_GROUP, entry)
    reply = await wait_reply(redis, keys, "t1", timeout_s=15)
    assert reply.status == "failed" and reply.code == "lost_work"
    assert "vanished" in reply.reason and ("deleted" in reply.reason or "acknowledged without a result" in reply.reason)
    results = [e for e in await events_of(store, "w1") if isinstance(e, ToolOutput)]
    assert [r.error for r in results] == ["lost_work"]  # the call is answered, not left dangling
    await services.start("p2", "tool-worker")
    second = await wait_reply(redis, keys, "t2", timeout_s=15)  # the next turn is not stuck behind it
    assert second.status == "ended"


async def test_the_watchdog_leaves_a_turn_whose_job_only_waits_for_a_worker(redis, keys, services, store):
    services.env["AGENTSTREAM_WATCHDOG_INTERVAL_MS"] = "200"
    await services.start("p1", "agent-loop")
    await publish(redis, keys, trace_id="w2", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_for(lambda: store.has_key("w2", "jobs:t1:0"), 10)
    await asyncio.sleep(1.5)  # several rounds: the job is undelivered, not vanished
    assert not await store.has_key("w2", "end:t1")
    await services.start("p2", "tool-worker")
    assert (await wait_reply(redis, keys, "t1", timeout_s=15)).status == "ended"
    await wait_for(lambda: _not_awaiting(redis, keys, "w2"), 10, "the trace leaves the awaiting set")


async def test_a_turn_whose_results_are_in_but_whose_wake_up_never_came_is_woken_by_the_watchdog(
    redis, keys, services, store
):
    """A careless client makes the wake-up stream a string: the tool worker records the result
    but every wake-up it sends is refused, until its job goes to the dead-letter stream. Once the
    key is repaired, the watchdog wakes the turn (every result in, the turn not ended), instead of
    leaving it to wait for the conversation's next turn."""
    services.env["AGENTSTREAM_WATCHDOG_INTERVAL_MS"] = "300"
    services.env["AGENTSTREAM_MAX_DELIVERIES"] = "2"
    wake = keys.wake_for("w3")
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="w3", turn_id="t0", agent="plan", text="do: work(0)")  # the groups exist
    assert (await wait_reply(redis, keys, "t0", timeout_s=15)).status == "ended"
    owned = keys.wake_owned(keys.partition("w3"), "p1")  # p1's own: the results' wake-ups go there (sticky)
    for squatted in (wake, owned):
        await redis.delete(squatted)
        await redis.set(squatted, "not a stream")
    await publish(redis, keys, trace_id="w3", turn_id="t1", agent="plan", text="do: work(1)")
    await wait_for(lambda: store.has_key("w3", "jobs:t1:0"), 10)
    calls = [
        e.tool_calls[0].id for e in await events_of(store, "w3") if isinstance(e, ModelOutput) and e.turn_id == "t1"
    ]
    await wait_for(lambda: store.has_key("w3", f"result:{calls[0]}"), 15, "the result is recorded all the same")
    await asyncio.sleep(1.0)  # the worker's wake-ups are refused meanwhile
    assert not await store.has_key("w3", "end:t1")
    await redis.delete(wake, owned)  # repaired
    reply = await wait_reply(redis, keys, "t1", timeout_s=20)
    assert reply.status == "ended" and reply.answer == "Results: worked 1 ms"
    results = [e for e in await events_of(store, "w3") if isinstance(e, ToolOutput) and e.turn_id == "t1"]
    assert len(results) == 1 and not results[0].late


async def _not_awaiting(redis, keys, trace_id):
    from agentstream.runtime.watchdog import awaiting_key

    return await redis.zscore(awaiting_key(keys, keys.partition(trace_id)), trace_id) is None


async def test_the_watchdog_still_reads_the_per_call_records_of_an_older_version(redis, keys):
    # Before the ``awaited`` record, each call's job had its own ``job:<call id>`` field; a trace
    # left waiting by that version across an upgrade is still watched.
    import json
    import time

    from agentstream.runtime.watchdog import Watchdog, awaiting_key

    ended = []

    async def end_turn(trace_id, turn_id, vanished):
        ended.append((trace_id, turn_id, [v.call_id for v in vanished]))

    stream = keys.tools_for("default", "w9")
    kept = (await redis.xadd(stream, {b"job": b"x"})).decode()  # still waits (no group has read it)
    await redis.hset(
        keys.trace_keys("w9"),
        mapping={
            "job:c1": json.dumps(["t1", stream, "1-1"]),  # its entry is gone
            "job:c2": json.dumps(["t1", stream, kept]),
            "job:c3": json.dumps(["t0", stream, "1-2"]),
            "end:t0": "1",  # an ended turn's: not looked at
        },
    )
    await redis.zadd(awaiting_key(keys, keys.partition("w9")), {"w9": int(time.time() * 1000) - 60_000})
    assert await Watchdog(redis, keys, end_turn, interval_s=1.0, partition=keys.partition("w9")).check_once() == 1
    assert ended == [("w9", "t1", ["c1"])]


async def test_a_watchdog_whose_awaiting_set_is_squatted_logs_the_failure_once_not_every_round(redis, keys, caplog):
    # The trial: `SET <awaiting set> x`. Every round (10 s) logged an ERROR with its traceback.
    import logging

    from agentstream.runtime.watchdog import REPEAT_LOG_ROUNDS, Watchdog, awaiting_key

    async def end_turn(trace_id, turn_id, vanished):
        raise AssertionError("nothing to end")

    watchdog = Watchdog(redis, keys, end_turn, interval_s=1.0)
    await redis.set(awaiting_key(keys, 0), "squatted")
    with caplog.at_level(logging.INFO, logger="agentstream.runtime.watchdog"):
        for _ in range(REPEAT_LOG_ROUNDS + 1):
            await watchdog.round()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 2 and errors[0].exc_info and "WRONGTYPE" in errors[1].getMessage(), [
            r.getMessage() for r in errors
        ]
        assert f"{REPEAT_LOG_ROUNDS} in a row" in errors[1].getMessage()
        await redis.delete(awaiting_key(keys, 0))
        await watchdog.round()
        assert (
            watchdog.failed_rounds == 0
            and f"succeeded again after {REPEAT_LOG_ROUNDS + 1} failed rounds" in caplog.records[-1].getMessage()
        )
