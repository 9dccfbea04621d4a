"""Sticky wake-ups on real Redis (issue 35 item 6): a conversation's wake-ups go to the agent
loop that published its jobs while it is alive, and reach another one when it is gone.

Each agent-loop process has its own wake-up stream per partition (``<wake partition>:to:{<wake partition>}:<owner>``)
and keeps itself alive in the partition's owners set (:mod:`agentstream.runtime.wake_routes`);
a tool job names its owner (``ToolJob.wake_to``) and the tool worker's wake-up goes through one
script that picks the owner's stream while its expiry is ahead, else the shared one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from agentstream import App, tool
from agentstream.runtime import operations
from agentstream.runtime.consumer import StreamConsumer
from agentstream.runtime.wake_routes import OwnWakeups
from agentstream.steps.wake_routes import OWNER, SHARED, liveness, route, to_move
from agentstream.wire import codec
from agentstream.wire.events import ToolJob
from agentstream.wire.keys import AGENT_LOOP_GROUP, JOB_FIELD, WAKE_FIELD
from tests.integration import test_agent_loop_delivery as delivery
from tests.support import apps
from tests.support.inprocess import errors_of, publish, wait_for, wait_reply

pytestmark = pytest.mark.integration

model = delivery.model
services = delivery.services

_GATES: dict[str, asyncio.Event] = {}


@tool(timeout_s=30)
async def gated(key: str) -> str:
    """Answer once the test opens the gate ``key`` (an in-process tool worker's tool)."""
    await _GATES.setdefault(key, asyncio.Event()).wait()
    return f"opened {key}"


_GATED = App(
    agents=[dataclasses.replace(next(a for a in apps.app.agents if a.name == "plan"), tools=[apps.work, gated])]
)


@pytest.fixture(autouse=True)
def _open_gates():
    yield
    for gate in _GATES.values():
        gate.set()
    _GATES.clear()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _jobs(redis, keys, trace_id: str, queue: str = "default") -> list[ToolJob]:
    return [codec.decode_job(f[JOB_FIELD]) for _, f in await redis.xrange(keys.tools_for(queue, trace_id))]


async def _wake_reasons(redis, stream: str) -> list[str]:
    return [codec.decode_wake(f[WAKE_FIELD]).reason for _, f in await redis.xrange(stream)]


async def test_the_wake_ups_of_a_conversation_go_to_the_agent_loop_that_published_its_jobs(
    redis, keys, services, store
):
    await services.start("p1", "agent-loop")
    await services.start("p2", "agent-loop")
    await services.start("w", "tool-worker")
    traces = [f"s{i}" for i in range(6)]
    for n in range(3):
        for t in traces:
            await publish(redis, keys, trace_id=t, turn_id=f"{t}-t{n}", agent="plan", text=f"do: work({n})")
        for t in traces:
            assert (await wait_reply(redis, keys, f"{t}-t{n}")).status == "ended"
    owners = set()
    for t in traces:
        p = keys.partition(t)
        for job in await _jobs(redis, keys, t):
            assert job.wake_to in ("p1", "p2"), job
            owners.add(job.wake_to)
            reason = f"result:{job.call_id}"
            # the result's wake-up is on the stream of the process that published the job, only there
            assert reason in await _wake_reasons(redis, keys.wake_owned(p, job.wake_to)), job
            assert reason not in await _wake_reasons(redis, keys.wake_for(t)), job
    assert owners  # whichever took a turn (the turns stream is shared) owns its wake-ups
    for p in range(keys.partitions):
        assert {_text(m) for m in await redis.zrange(keys.wake_owners(p), 0, -1)} == {"p1", "p2"}


async def _start_killable(services, name: str):
    """An agent loop of its own consumer name whose runners run as tasks of the test → (loop,
    kill): ``kill()`` cancels them without a stop (no graceful hand-over: as a kill -9 leaves it)."""
    from agentstream.models.client import model_client
    from agentstream.runtime.connection import connect
    from agentstream.runtime.store import TraceStore
    from agentstream_services.agent_loop.service import build as build_loop

    settings = services.settings(name)
    redis = connect(services.redis_url, block_ms=settings.block_ms)
    http = model_client(concurrency=settings.concurrency)
    loop, runners = build_loop(services.app, settings, TraceStore(redis, settings.keys, codec=services.app.codec), http)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in runners]

    async def kill() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.aclose()
        await redis.aclose()

    return loop, kill


async def test_a_killed_owners_wake_ups_reach_another_agent_loop_and_the_turn_finishes(redis, keys, services, store):
    services.app = _GATED
    _loop, kill = await _start_killable(services, "p1")
    await services.start("w", "tool-worker")
    await publish(redis, keys, trace_id="k1", turn_id="t1", agent="plan", text="do: gated(k1)")
    jobs = await wait_for(lambda: _jobs(redis, keys, "k1"), what="the tool job")
    assert jobs[0].wake_to == "p1"
    await kill()  # no stop, no hand-over: p1 stays in the owners set until its expiry passes
    p = keys.partition("k1")
    assert await redis.zscore(keys.wake_owners(p), "p1") is not None
    _GATES.setdefault("k1", asyncio.Event()).set()  # the result's wake-up goes to p1's stream: p1 looks alive
    await wait_for(
        lambda: _wake_reasons(redis, keys.wake_owned(p, "p1")), timeout_s=10, what="the wake-up in p1's stream"
    )
    await services.start("p2", "agent-loop")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: opened k1"

    # p2 hands p1's stream over once p1's expiry passed: the wake-up goes on to the shared stream,
    # p1 leaves the set and its stream is deleted. (The turn may have ended before that: on a
    # cluster p1 acknowledges the turn's entry after publishing the job, so a kill in between
    # leaves the turn pending on p1, and p2 claims it and finds the result there.)
    async def handed_over() -> bool:
        return await redis.zscore(keys.wake_owners(p), "p1") is None

    await wait_for(handed_over, timeout_s=10, what="p1's hand-over")
    assert f"result:{jobs[0].call_id}" in await _wake_reasons(redis, keys.wake_for("k1"))
    assert not await redis.exists(keys.wake_owned(p, "p1"))


async def test_an_owner_that_stops_hands_its_wake_ups_over_at_once(redis, keys, services, store):
    services.app = _GATED
    services.env["AGENTSTREAM_LEASE_TTL_MS"] = "60000"  # its expiry does not pass during the test
    services.env["AGENTSTREAM_MIN_IDLE_MS"] = "60000"
    await services.start("p1", "agent-loop")
    await services.start("w", "tool-worker")
    await publish(redis, keys, trace_id="g1", turn_id="t1", agent="plan", text="do: gated(g1)")
    jobs = await wait_for(lambda: _jobs(redis, keys, "g1"), what="the tool job")
    assert jobs[0].wake_to == "p1"
    p = keys.partition("g1")
    await services.stop("p1")
    assert await redis.zscore(keys.wake_owners(p), "p1") is None
    assert not await redis.exists(keys.wake_owned(p, "p1"))
    await services.start("p2", "agent-loop")
    _GATES.setdefault("g1", asyncio.Event()).set()
    reply = await wait_reply(redis, keys, "t1", timeout_s=20)  # long before p1's 60 s expiry
    assert reply.status == "ended" and reply.answer == "Results: opened g1"
    assert f"result:{jobs[0].call_id}" in await _wake_reasons(redis, keys.wake_for("g1"))


def _runner(redis, keys, owner: str, partition: int = 0) -> OwnWakeups:
    stream = keys.wake_owned(partition, owner)

    async def handler(entry_id, fields):  # never run: the tests call the scripts
        raise AssertionError("not consumed here")

    consumer = StreamConsumer(
        redis, stream=stream, group=AGENT_LOOP_GROUP, consumer=owner, handler=handler, dead_stream=keys.dead(stream)
    )
    return OwnWakeups(redis, keys, partition, owner, consumer, liveness(60_000, 30_000))


async def test_a_hand_over_moves_what_the_owners_group_did_not_acknowledge_in_order(redis, keys):
    mover = _runner(redis, keys, "alive")
    gone = _runner(redis, keys, "gone")
    assert await gone.beat() and await mover.beat()
    ids = [_text(await redis.xadd(gone.stream, {WAKE_FIELD: codec.encode(_wake(f"c{i}", f"r{i}"))})) for i in range(6)]
    read = await redis.xreadgroup(AGENT_LOOP_GROUP, "gone", {gone.stream: ">"}, count=4)
    assert [_text(e) for e, _ in read[0][1]] == ids[:4]
    await redis.xack(gone.stream, AGENT_LOOP_GROUP, ids[0], ids[2])  # handled: not moved again
    expected = to_move(ids, [ids[1], ids[3]], ids[3])
    assert expected == [ids[1], ids[3], ids[4], ids[5]]
    assert await mover.hand_over("gone") == 0  # alive (its expiry is ahead): nothing moves
    await redis.zadd(gone.owners, {"gone": 1})  # its expiry passed long ago
    assert await mover.hand_over("gone") == 4
    assert await _wake_reasons(redis, mover.shared) == ["r1", "r3", "r4", "r5"]
    assert not await redis.exists(gone.stream)
    assert await redis.zscore(gone.owners, "gone") is None
    assert await redis.zscore(mover.owners, "alive") is not None


async def test_a_beat_hands_over_every_stale_owner_and_keeps_the_live_ones(redis, keys):
    mover, dead, live = (_runner(redis, keys, o) for o in ("mover", "dead", "live"))
    for r in (mover, dead, live):
        assert await r.beat()
    await redis.xadd(dead.stream, {WAKE_FIELD: codec.encode(_wake("c1", "lost"))})
    await redis.zadd(dead.owners, {"dead": 1})
    assert await mover.beat()
    assert {_text(m) for m in await redis.zrange(mover.owners, 0, -1)} == {"mover", "live"}
    assert await _wake_reasons(redis, mover.shared) == ["lost"]
    assert mover.handed_over == 1


@pytest.mark.parametrize(
    ("registered", "expiry_offset_ms", "owner"),
    [
        (True, 60_000, "p1"),  # alive
        (True, -1, "p1"),  # expired
        (False, 0, "p1"),  # never registered
        (True, 60_000, ""),  # no owner
    ],
)
async def test_the_route_script_decides_as_the_pure_rule(redis, keys, registered, expiry_offset_ms, owner):
    trace = _trace_in(keys, 0)
    now_ms = int(time.time() * 1000)  # the tests' Redis runs on this machine: one clock
    expiry = now_ms + expiry_offset_ms
    if registered:
        await redis.zadd(keys.wake_owners(0), {"p1": expiry})
    await operations.wake_trace(redis, keys, trace, "x", owner=owner)
    expected = route(owner, expiry if registered else None, now_ms)
    on_owner = await _wake_reasons(redis, keys.wake_owned(0, "p1"))
    on_shared = await _wake_reasons(redis, keys.wake_for(trace))
    assert (on_owner, on_shared) == ((["x"], []) if expected == OWNER else ([], ["x"]))
    assert expected == (OWNER if registered and expiry_offset_ms > 0 and owner else SHARED)


@pytest.mark.parametrize(
    "owner",
    [
        "x" * 10_000,  # oversized
        "p1}{evil",  # a hash tag of its own
        "p1 evil",
        "../p1",
        "p1\n",
        "ünïcode",
    ],
)
async def test_a_wake_up_naming_a_bogus_owner_goes_to_the_shared_stream_and_writes_no_other_key(redis, keys, owner):
    await redis.zadd(keys.wake_owners(keys.partition("c1")), {owner: 2**50})  # even "alive"
    await operations.wake_trace(redis, keys, "c1", "x", owner=owner)
    assert await _wake_reasons(redis, keys.wake_for("c1")) == ["x"]
    written = [_text(k) async for k in _scan(redis, f"*{keys.namespace}*")]
    assert sorted(written) == sorted([keys.wake_for("c1"), keys.wake_owners(keys.partition("c1"))])


async def test_an_owner_of_another_namespace_is_not_alive_here(redis, keys, namespace):
    from agentstream.wire.keys import Keys

    other = Keys(f"{namespace}-other", keys.partitions)
    await redis.zadd(other.wake_owners(other.partition("c1")), {"p1": 2**50})
    await operations.wake_trace(redis, keys, "c1", "x", owner="p1")
    assert await _wake_reasons(redis, keys.wake_for("c1")) == ["x"]
    assert not await redis.exists(other.wake_owned(other.partition("c1"), "p1"))


async def test_a_stray_job_naming_an_oversized_owner_is_reported_and_wakes_nothing(redis, keys, services):
    await services.start("w", "tool-worker")
    job = ToolJob(trace_id="nobody", turn_id="t", call_id="c", name="work", arguments="{}", wake_to="x" * 100_000)
    await redis.xadd(keys.tools_for("default", "nobody"), {JOB_FIELD: codec.encode(job)})
    await wait_for(lambda: errors_of(redis, keys), what="the report of the stray job")
    p = keys.partition("nobody")
    assert not await redis.exists(keys.wake_for("nobody"))
    assert await redis.zcard(keys.wake_owners(p)) == 0


def _wake(trace_id: str, reason: str):
    from agentstream.wire.events import Wake

    return Wake(trace_id=trace_id, reason=reason)


def _trace_in(keys, partition: int) -> str:
    return next(f"c{i}" for i in range(1000) if keys.partition(f"c{i}") == partition)


async def _scan(redis, pattern: str):
    """Every key matching ``pattern`` (every node of a cluster)."""
    async for key in redis.scan_iter(match=pattern):
        yield key
