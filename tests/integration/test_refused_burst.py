"""A quick burst of refused turns on one conversation, interleaved with good ones, handled by two
agent-loop processes: every turn id gets exactly one reply (a refused turn's reply is published
once, like every other reply, in the no-crash case)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from agentstream.agent_loop.loop import AgentLoop
from agentstream.errors import Deferred
from agentstream.runtime import operations
from agentstream.testing import TestModel
from agentstream.wire import codec
from agentstream.wire.events import TurnFailed
from agentstream.wire.keys import REPLY_FIELD, TURN_FIELD, WAKE_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, wait_for

pytestmark = pytest.mark.integration

MAX_TURN_BYTES = 4096


def turn(trace_id: str, turn_id: str, **extra) -> bytes:
    return json.dumps(
        {"trace_id": trace_id, "turn_id": turn_id, "agent": "calc", "text": "What is 2 + 2?", **extra}
    ).encode()


def burst(trace_id: str, n_good: int = 3) -> tuple[list[bytes], set[str], set[str]]:
    """The entries of a burst on one trace → (payloads in order, turn ids refused, turn ids answered)."""
    payloads, refused, good = [], set(), set()
    for i in range(n_good):
        bad = [
            turn(trace_id, f"u{i}", colour="blue"),  # an unknown field
            turn(trace_id, f"a{i}", agent="nobody"),  # an agent the app does not have
            turn(trace_id, f"o{i}", text="x" * (MAX_TURN_BYTES + 10)),  # over the size limit
            turn(trace_id, f"d{i}", colour="red"),  # refused, and published again at once
            turn(trace_id, f"d{i}", colour="red"),
            b'{"trace_id": "' + trace_id.encode() + b'", "turn_id": "m' + str(i).encode() + b'", ',  # malformed JSON
            turn(trace_id, f"e{i}", text=""),  # an empty message
        ]
        payloads += bad
        refused |= {f"u{i}", f"a{i}", f"o{i}", f"d{i}", f"m{i}", f"e{i}"}  # the truncated JSON's ids are found
        payloads.append(turn(trace_id, f"g{i}"))
        good.add(f"g{i}")
    return payloads, refused, good


async def reply_counts(redis, stream: str) -> Counter:
    """How many replies each turn id got."""
    return Counter(codec.decode_reply(f[REPLY_FIELD]).turn_id for _, f in await redis.xrange(stream))


async def replies_per_turn(redis, stream: str) -> Counter:
    """How many replies each (trace id, turn id) got: the pair a backend dedupes by."""
    replies = [codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(stream)]
    return Counter((r.trace_id, r.turn_id) for r in replies)


async def test_a_burst_of_refused_turns_of_one_trace_with_two_agent_loops_gets_one_reply_per_turn(
    redis_url, namespace, redis, keys, store, scripted_model
):
    env = {
        "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
        "AGENTSTREAM_MAX_TURN_BYTES": str(MAX_TURN_BYTES),
        "AGENTSTREAM_CONCURRENCY": "16",
    }
    services = InProcess(apps.app, redis_url, namespace, scripted_model.base_url, env=env)
    traces = [f"burst-{n}" for n in range(4)]
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await services.start("p2", "agent-loop")
        expected: dict[str, tuple[set[str], set[str]]] = {}
        pipe = redis.pipeline(transaction=False)
        for trace_id in traces:
            payloads, refused, good = burst(trace_id)
            expected[trace_id] = (refused, good)
            for payload in payloads:
                pipe.xadd(keys.turns_for(trace_id), {TURN_FIELD: payload})
        await pipe.execute()
        wanted = sum(len(r) + len(g) for r, g in expected.values())

        async def all_replied():
            counts = await replies_per_turn(redis, keys.replies)
            return counts if len(counts) >= wanted else None

        try:
            await wait_for(all_replied, timeout_s=60, what="a reply to every turn")
        except AssertionError:
            got = await replies_per_turn(redis, keys.replies)
            missing = {(t, i) for t, (r, g) in expected.items() for i in r | g} - set(got)
            raise AssertionError(f"no reply for {sorted(missing)}; replies: {dict(got)}") from None
        await asyncio.sleep(1.0)  # a second copy published late would show now
        counts = await replies_per_turn(redis, keys.replies)
        twice = {turn_id: n for turn_id, n in counts.items() if n != 1}
        assert not twice, f"turns replied to more than once: {twice}"
        for trace_id, (refused, _good) in expected.items():
            failed = {e.turn_id for e in await events_of(store, trace_id) if isinstance(e, TurnFailed)}
            assert failed == refused, (trace_id, failed ^ refused)
    finally:
        await services.stop_all()


def _loops(store) -> tuple[AgentLoop, AgentLoop]:
    """Two agent loops on one store: one that only refuses, one whose model answers "4"."""
    return AgentLoop(apps.app, store, {}), AgentLoop(apps.app, store, {"default": TestModel(answer="4", call_tools=[])})


def _stall_refusal_of(turn_id: str, monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the refusal of ``turn_id`` stall just before it publishes its ending and reply (while it
    holds the trace's lease) → (set once it stalls, set it to let the refusal go on)."""
    stalled, go_on = asyncio.Event(), asyncio.Event()
    publish_turn_end = operations.publish_turn_end

    async def stalling(redis_, keys_, trace_id, turn_id_, entries):
        if turn_id_ == turn_id and not go_on.is_set():
            stalled.set()
            await go_on.wait()
        return await publish_turn_end(redis_, keys_, trace_id, turn_id_, entries)

    monkeypatch.setattr(operations, "publish_turn_end", stalling)
    return stalled, go_on


async def test_a_refusal_and_a_step_that_owes_its_reply_publish_it_once(store, redis, keys, monkeypatch):
    """The race behind a refused turn's second reply, made certain: a refused turn's failure is in
    the trace and its refusal has looked for the reply's marker (not set) but not yet published;
    meanwhile the step loop of a good turn of the same trace (another agent loop) folds the failure
    as owing a reply. The reply goes out once."""
    refusing, stepping = _loops(store)
    stalled, go_on = _stall_refusal_of("bad", monkeypatch)
    refusal = asyncio.create_task(refusing.on_turn("1-0", {TURN_FIELD: turn("c", "bad", colour="x")}))
    await asyncio.wait_for(stalled.wait(), 10)
    good = {TURN_FIELD: turn("c", "good")}
    try:  # the good turn's step loop: it may find the trace held, as the consumer would be told
        await asyncio.wait_for(stepping.on_turn("2-0", good), 5)
    except Deferred:
        pass
    go_on.set()
    await asyncio.wait_for(refusal, 10)
    if not (await reply_counts(redis, keys.replies))["good"]:
        await stepping.on_turn("2-0", good)  # the consumer hands a deferred entry back
    counts = await reply_counts(redis, keys.replies)
    assert counts == {"bad": 1, "good": 1}, counts


async def test_a_hint_that_finds_the_trace_held_by_a_refusal_is_handed_on(store, redis, keys, monkeypatch):
    """A hint that finds the trace's lease held marks the trace dirty and leaves it to the holder;
    a refusal holds the lease only to write its ending and reply, and never runs the step loop:
    it wakes the trace when it gives the lease back, so the good turn behind it is answered."""
    refusing, stepping = _loops(store)
    stalled, go_on = _stall_refusal_of("bad", monkeypatch)
    refusal = asyncio.create_task(refusing.on_turn("1-0", {TURN_FIELD: turn("c", "bad", colour="x")}))
    await asyncio.wait_for(stalled.wait(), 10)
    with pytest.raises(Deferred):  # admitted into the trace; its step waits for the holder
        await stepping.on_turn("2-0", {TURN_FIELD: turn("c", "good")})
    await stepping.advance("c")  # a hint without an entry to wait with: left to the holder (dirty)
    go_on.set()
    await asyncio.wait_for(refusal, 10)
    wakes = [codec.decode_wake(f[WAKE_FIELD]) for _, f in await redis.xrange(keys.wake_for("c"))]
    assert [w.reason for w in wakes] == ["held"], wakes
    entry_id, fields = (await redis.xrange(keys.wake_for("c")))[0]
    await stepping.on_wake(entry_id.decode(), fields)
    assert await reply_counts(redis, keys.replies) == {"bad": 1, "good": 1}
