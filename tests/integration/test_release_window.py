"""The window between a step loop's release and the end of its bookkeeping: another task of the
same agent loop may take the trace's lease in it (a cancel's or a wake-up's hint, while the
release's pipeline still waits on another node of a Redis Cluster) and must not publish again
what the first task has just published.

Seen in CI on the cluster pass: ``agentstream cancel`` of a running turn gave two replies. The
cancel's own hint took the lease the step loop had just given back, found the turn's ending still
"owed" in the fold the two tasks share, and published its reply a second time. The same window
would have published a step's tool jobs twice.
"""

from __future__ import annotations

import asyncio

import pytest

from agentstream.errors import Deferred
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, TurnMessage
from agentstream.wire.keys import REPLY_FIELD, TURN_FIELD
from tests.integration import test_agent_loop_delivery as delivery
from tests.support.inprocess import events_of, publish, wait_for, wait_reply

pytestmark = pytest.mark.integration

# the delivery tests' fixtures, shared by name
model = delivery.model
services = delivery.services


def _hint_inside_the_window(loop, trace_id: str, taken_by_hint: list) -> None:
    """Wrap the loop's releases so that, once Redis has run one and before the step loop sees its
    answer, a second task of the same process advances the trace (and finishes). A step's
    release goes with its publication (publish_and_release) or, on one Redis server, with the
    append of the model output whose jobs it publishes (apply with a publication)."""
    inside = []  # the hint's own release does not start another hint

    async def hint(tid: str, released: bool, published: int) -> None:
        if tid == trace_id and released and not inside:
            taken_by_hint.append(published)
            inside.append(True)
            try:
                await asyncio.create_task(loop.advance(tid))  # the lease is free: this task takes it
            finally:
                inside.pop()

    real_release = loop.store.publish_and_release
    real_append = loop.store.apply

    async def release_then_hint(tid, token, entries, *, marks=()):
        result = await real_release(tid, token, entries, marks=marks)
        await hint(tid, result[0] == "released", len(entries))
        return result

    async def append_then_hint(tid, output, **kwargs):
        result = await real_append(tid, output, **kwargs)
        if kwargs.get("publication") is not None:
            await hint(tid, result.outcome == "released", len(result.entry_ids))
        return result

    loop.store.publish_and_release = release_then_hint
    loop.store.apply = append_then_hint


def _at_least(items: list, n: int):
    async def reached():
        return len(items) >= n

    return reached


async def _replies_of(redis, keys, turn_id: str) -> list:
    return [
        r
        for r in (codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(keys.replies))
        if r.turn_id == turn_id
    ]


async def test_a_hint_that_takes_the_lease_just_released_does_not_reply_again(redis, keys, services, store):
    proc = await services.start("p1", "agent-loop", "tool-worker")
    windows: list = []
    _hint_inside_the_window(proc.loop, "w1", windows)
    await publish(redis, keys, trace_id="w1", turn_id="t1", agent="plan", text="do: work(5)")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: worked 5 ms"
    await wait_for(_at_least(windows, 2), 10, "the releases of both steps")
    await asyncio.sleep(0.3)  # anything published twice would be there by now
    assert len(await _replies_of(redis, keys, "t1")) == 1


async def test_a_hint_that_takes_the_lease_just_released_does_not_publish_the_jobs_again(redis, keys, services, store):
    proc = await services.start("p1", "agent-loop")  # no tool worker: the jobs stay on their stream
    windows: list = []
    _hint_inside_the_window(proc.loop, "w2", windows)
    await publish(redis, keys, trace_id="w2", turn_id="t1", agent="plan", text="do: work(5) work(6)")
    await wait_for(_at_least(windows, 1), 10, "the release of the first step")
    await asyncio.sleep(0.3)
    outputs = [e for e in await events_of(store, "w2") if isinstance(e, ModelOutput)]
    assert len(outputs) == 1 and len(outputs[0].tool_calls) == 2
    assert await redis.xlen(keys.tools_for("default", "w2")) == 2  # one job per call, not four


async def test_the_turns_entry_handled_again_before_the_reply_went_out_does_not_reply_twice(
    redis,
    keys,
    services,
    store,
):
    # The turn has ended in the trace and its step loop is about to publish the reply when the
    # entry that brought the turn is handled again (its claim lapsed, or a copy deferred earlier
    # comes back): it must leave the reply to the lease's holder, not race it.
    proc = await services.start("p1", "agent-loop", "tool-worker")
    loop = proc.loop
    fields = {TURN_FIELD: codec.encode(TurnMessage(trace_id="w3", turn_id="t1", agent="plan", text="do: work(5)"))}
    real = loop.store.publish_and_release
    real_append = loop.store.apply  # on one Redis the reply goes with the ending's append
    outcomes: list = []

    async def handled_again(tid, marks) -> None:
        if tid == "w3" and any(m == "reply:t1" for m in marks) and not outcomes:
            try:
                await loop.on_turn(entry_id, dict(fields))
                outcomes.append("handled")
            except Deferred as exc:  # the consumer hands the entry back after exc.delay_s
                outcomes.append(exc)

    async def redelivered_first(tid, token, entries, *, marks=()):
        await handled_again(tid, marks)
        return await real(tid, token, entries, marks=marks)

    async def redelivered_before_the_append(tid, events, **kwargs):
        if kwargs.get("publication") is not None:
            await handled_again(tid, kwargs["publication"].marks)
        return await real_append(tid, events, **kwargs)

    loop.store.publish_and_release = redelivered_first
    loop.store.apply = redelivered_before_the_append
    entry_id = (await redis.xadd(keys.turns_for("w3"), fields)).decode()
    reply = await wait_reply(redis, keys, "t1")
    assert reply.answer == "Results: worked 5 ms" and outcomes
    # with the ending in the trace and the reply not out, the copy waits for the holder (Deferred);
    # on one Redis the reply goes with the ending's append, so the copy finds the turn running
    # under this process's own lease and leaves it to the holder (a hint, its mark seen at the release)
    assert isinstance(outcomes[0], Deferred) or outcomes[0] == "handled"
    await loop.on_turn(entry_id, dict(fields))  # handed back later: the reply is out, nothing more
    await asyncio.sleep(0.3)
    assert len(await _replies_of(redis, keys, "t1")) == 1
