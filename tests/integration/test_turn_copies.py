"""Copies of a turn published while it runs are absorbed: one reply per turn id (issue: a fresh
user's trial got two replies for a turn published twice). A copy with another body is reported.
A turn published again after it ended still gets its reply again (test_reply_again.py)."""

from __future__ import annotations

import asyncio

import pytest

from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, TurnMessage
from agentstream.wire.keys import AGENT_LOOP_GROUP, REPLY_FIELD, TURN_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, errors_of, events_of, publish, wait_for, wait_reply
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration

SLOW_TOOL = "do: work(1200)"  # the turn runs (waits on its tool) for 1.2 s: the copies come meanwhile


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
async def services(redis_url, namespace, model, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    s = InProcess(apps.app, redis_url, namespace, model.base_url)
    yield s
    await s.stop_all()


async def _replies_of(redis, keys, turn_id: str) -> list:
    return [
        r
        for r in (codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(keys.replies))
        if r.turn_id == turn_id
    ]


async def _copy(redis, keys, trace_id: str, text: str) -> tuple[str, dict]:
    """XADD a copy of turn t1 (as a backend would) → its entry id and fields."""
    fields = {TURN_FIELD: codec.encode(TurnMessage(trace_id=trace_id, turn_id="t1", agent="plan", text=text))}
    entry = await redis.xadd(keys.turns_for(trace_id), fields)
    return entry.decode(), dict(fields)


async def _running(store, trace_id: str):
    return any(isinstance(e, ModelOutput) and e.tool_calls for e in await events_of(store, trace_id))


async def test_copies_published_while_the_turn_runs_get_no_second_reply(redis, keys, services, store, model):
    proc = await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="dup", turn_id="t1", agent="plan", text=SLOW_TOOL)
    await wait_for(lambda: _running(store, "dup"), 10, "the turn's tool call")
    copies = [await _copy(redis, keys, "dup", SLOW_TOOL) for _ in range(2)]  # published twice more while it runs
    await wait_for(
        lambda: _handled(redis, keys.turns_for("dup"), AGENT_LOOP_GROUP, copies[-1][0]), 10, "the copies handled"
    )
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: worked 1200 ms"
    calls = len(model.requests)
    # a copy's entry handled again after the end (it had been deferred while the lease was held,
    # or its worker died before the ack) is still the copy seen while the turn ran: absorbed
    for entry_id, fields in copies:
        await proc.loop.on_turn(entry_id, fields)
    assert len(await _replies_of(redis, keys, "t1")) == 1
    assert len(model.requests) == calls
    assert await redis.xlen(keys.errors) == 0  # true copies are not errors
    # published again after the end (the backend lost the reply): the reply again, as documented
    await _copy(redis, keys, "dup", SLOW_TOOL)
    again = await wait_for(lambda: _at_least(redis, keys, "t1", 2), 10, "the reply again")
    assert again[1] == again[0] and len(again) == 2 and len(model.requests) == calls


async def test_a_copy_deferred_while_the_lease_is_held_gets_no_second_reply(redis, keys, services, store, model):
    # The trial: a copy read while another process held the trace's lease waits (deferred) until
    # that lease would expire, and comes back after the turn ended.
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="dup2", turn_id="t1", agent="plan", text="do: work(1000)")
    await wait_for(lambda: _running(store, "dup2"), 10, "the turn's tool call")
    taken = await wait_for(lambda: _take(store, "dup2"), 10, "the lease")  # held by "another process"
    entry_id, _ = await _copy(redis, keys, "dup2", "do: work(1000)")
    await wait_for(
        lambda: _handled(redis, keys.turns_for("dup2"), AGENT_LOOP_GROUP, entry_id, acked=False), 10, "the copy read"
    )
    await asyncio.sleep(0.2)  # admitted, then deferred (the lease is held)
    await store.release_lease("dup2", taken.token, keep_if_dirty=False)
    await wait_reply(redis, keys, "t1")  # the tool's wake-up ends the turn within ~1 s; the copy waits ~3 s
    await wait_for(lambda: _handled(redis, keys.turns_for("dup2"), AGENT_LOOP_GROUP, entry_id), 15, "the copy handled")
    assert len(await _replies_of(redis, keys, "t1")) == 1


async def _take(store, trace_id: str):
    taken = await store.take(trace_id, ttl_ms=3000, after=None)
    return taken if taken.token is not None else None


async def _handled(redis, stream: str, group: str, entry_id: str, *, acked: bool = True) -> bool:
    """The group read ``entry_id`` and (``acked``) acknowledged everything it read."""
    (info,) = [g for g in await redis.xinfo_groups(stream) if g["name"] == group.encode()]
    last = tuple(int(p) for p in info["last-delivered-id"].split(b"-"))
    return last >= tuple(int(p) for p in entry_id.split("-")) and (not acked or info["pending"] == 0)


async def _at_least(redis, keys, turn_id: str, n: int):
    got = await _replies_of(redis, keys, turn_id)
    return got if len(got) >= n else None


async def test_a_copy_with_another_body_is_reported_and_absorbed(redis, keys, services, store, model):
    proc = await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="dup3", turn_id="t1", agent="plan", text=SLOW_TOOL)
    await wait_for(lambda: _running(store, "dup3"), 10, "the turn's tool call")
    entry_id, fields = await _copy(redis, keys, "dup3", "do: work(5)")  # same ids, another question
    await wait_for(lambda: errors_of(redis, keys), 10, "the report")
    reply = await wait_reply(redis, keys, "t1")
    assert reply.answer == "Results: worked 1200 ms"  # the admitted body's answer
    await proc.loop.on_turn(entry_id, fields)  # handled again after the end: still absorbed
    assert len(await _replies_of(redis, keys, "t1")) == 1
    errors = await errors_of(redis, keys)
    assert errors and all(e["trace_id"] == "dup3" and e["turn_id"] == "t1" and e["entry"] == entry_id for e in errors)
    assert (
        "differs from the admitted one" in errors[0]["error"]
        and "'t1'" in errors[0]["error"]
        and "'dup3'" in errors[0]["error"]
    )
    assert "do: work(5)" in errors[0]["payload"]
    texts = [e.text for e in await events_of(store, "dup3") if type(e).__name__ == "TurnInput"]
    assert texts == [SLOW_TOOL]  # the copy's body never entered the trace
