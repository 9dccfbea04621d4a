"""The wire as a trust boundary (issue 11), tried as an attacker would from a plain Redis client:
where a reply may go, the limits on what a turn may carry, and how much of a bad payload the
errors and dead-letter streams keep. Real Redis; the agent loop's real handlers."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentstream import Agent, App, tool
from agentstream.agent_loop.loop import AgentLoop
from agentstream.errors import TurnRejected
from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.events import (
    CancelMessage,
    ModelOutput,
    ToolCall,
    ToolJob,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    Wake,
)
from agentstream.wire.keys import CANCEL_FIELD, JOB_FIELD, TURN_FIELD, WAKE_FIELD
from agentstream_services.tool_worker.worker import ToolWorker
from tests.support import apps, docs
from tests.support.inprocess import InProcess, events_of, replies_on, wait_for

pytestmark = pytest.mark.integration


def turn_json(**fields) -> bytes:
    base = {"trace_id": "conv-a", "turn_id": "t1", "agent": "calc", "text": "What is 2 + 2?"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


async def all_keys(redis, namespace: str) -> list[str]:
    return sorted([k.decode() async for k in redis.scan_iter(f"{namespace}*")])  # every node of a cluster


# --- 1. reply_to ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "{ns}:trace:{{conv-b}}",  # another conversation's trace: broke it for good before
        "{ns}:turns",
        "{ns}:tools:default",
        "{ns}:wake",
        "{ns}:cancel",
        "{ns}:delegations",
        "{ns}:errors",
        "{ns}:repliesX",
        "{ns}:replies:*",  # a glob: it matched its own pattern
        "{ns}:replies:b[1]",
        "{ns}:replies:?",
        "other-namespace:replies",
        "somewhere-else",
    ],
)
async def test_a_reply_to_outside_the_reply_streams_is_refused(store, redis, keys, namespace, target):
    target = target.format(ns=namespace)
    loop = AgentLoop(apps.app, store, {})
    await store.append("conv-b", TurnInput(turn_id="b1", agent="calc", text="hello"))  # a conversation that exists
    before = await redis.xlen(target) if await redis.exists(target) else 0
    await loop.on_turn("1-0", {TURN_FIELD: turn_json(reply_to=target, metadata={"user": "u7"})})
    (reply,) = await replies_on(redis, keys.replies)  # the refusal goes to the default stream
    assert reply.status == "failed" and reply.code == "bad_turn", reply
    assert "$.reply_to" in reply.reason and target in reply.reason, reply.reason
    assert reply.metadata == {"user": "u7"}
    after = await redis.xlen(target) if await redis.exists(target) else 0
    assert after == before, f"{target} was written to"
    assert [type(e) for e in await events_of(store, "conv-b")] == [TurnInput]  # the other trace is untouched
    events = await events_of(store, "conv-a")
    assert [type(e) for e in events] == [TurnFailed]  # the turn never entered its trace


async def test_a_failed_reply_of_a_refused_turn_goes_to_its_valid_reply_to_with_its_metadata(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    mine = f"{keys.replies}:backend-7"
    await loop.on_turn("1-0", {TURN_FIELD: turn_json(agent="nobody", reply_to=mine, metadata={"req": "r-9"})})
    (reply,) = await replies_on(redis, mine)
    assert reply.code == "bad_turn" and "nobody" in reply.reason and reply.metadata == {"req": "r-9"}
    assert await redis.xlen(keys.replies) == 0


async def test_answers_go_to_allowed_reply_streams_and_a_setting_widens_them(
    redis_url, namespace, redis, keys, scripted_model
):
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}', "AGENTSTREAM_REPLY_STREAMS": "app:*:replies"},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        targets = {"t1": f"{keys.replies}:b1", "t2": f"app:{namespace}:replies", "t3": keys.replies}
        for turn_id, stream in targets.items():
            await redis.xadd(
                keys.turns, {TURN_FIELD: turn_json(trace_id=f"c-{turn_id}", turn_id=turn_id, reply_to=stream)}
            )

        async def all_answered():
            got = {t: await replies_on(redis, s) for t, s in targets.items()}
            return got if all(got.values()) else None

        got = await wait_for(all_answered, what="every reply")
        for turn_id, replies in got.items():
            assert [r.status for r in replies] == ["ended"], replies
            assert replies[0].answer == "The answer is 4." and replies[0].turn_id == turn_id
        # the widening never reaches agentstream's own streams
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="c-t4", turn_id="t4", reply_to=f"{namespace}:wake")}
        )
        refused = await wait_for(lambda: _reply_of(redis, keys.replies, "t4"), what="the refusal")
        assert refused.code == "bad_turn" and "not a replies stream" in refused.reason
    finally:
        await services.stop_all()
        await redis.delete(f"app:{namespace}:replies")


async def test_a_reply_to_its_stream_refuses_goes_to_the_default_stream_and_the_conversation_goes_on(
    redis_url, namespace, redis, keys, scripted_model
):
    # The trial: `SET <ns>:replies:str hello`, then a turn with that reply_to (it passes the
    # pattern: only a write can tell it is no stream). Its reply's XADD failed with WRONGTYPE on
    # every look, and as a trace's replies go out in order, every later turn of the conversation
    # was dead-lettered behind it. The reply goes to the default stream, reported.
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    bad = f"{keys.replies}:str"
    try:
        await redis.set(bad, "hello")
        await services.start("p1", "agent-loop", "tool-worker")
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="hG5", turn_id="t1", reply_to=bad, metadata={"req": "r1"})}
        )
        first = await wait_for(lambda: _reply_of(redis, keys.replies, "t1"), what="t1's reply, redirected")
        assert first.status == "ended" and first.answer == "The answer is 4." and first.metadata == {"req": "r1"}
        errors = [f for _, f in await redis.xrange(keys.errors)]
        assert any(
            bad.encode() in f[b"error"] and b"WRONGTYPE" in f[b"error"] and f.get(b"turn_id") == b"t1" for f in errors
        ), errors
        for n in (2, 3):  # the next turns of the conversation are answered at once
            await redis.xadd(keys.turns, {TURN_FIELD: turn_json(trace_id="hG5", turn_id=f"t{n}")})
            reply = await wait_for(
                lambda n=n: _reply_of(redis, keys.replies, f"t{n}"), timeout_s=10, what=f"t{n}'s reply"
            )
            assert reply.status == "ended", reply
        # a refused turn's failure reply, and an ended turn published again, are redirected alike
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="hG6", turn_id="r1", agent="nobody", reply_to=bad)}
        )
        refused = await wait_for(lambda: _reply_of(redis, keys.replies, "r1"), what="the refusal, redirected")
        assert refused.code == "bad_turn"
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="hG5", turn_id="t1", reply_to=bad, metadata={"req": "r1"})}
        )

        async def twice():
            got = [r for r in await replies_on(redis, keys.replies) if r.turn_id == "t1"]
            return got if len(got) == 2 else None

        again = await wait_for(twice, what="t1's reply again, redirected")
        assert again[1] == again[0]
        assert [r.turn_id for r in await replies_on(redis, keys.replies)].count("t2") == 1
    finally:
        await services.stop_all()


@pytest.mark.parametrize("squat", ["string", "hash"])
async def test_a_default_replies_stream_that_refuses_replies_is_reported_and_the_replies_go_out_once_it_is_a_stream(
    redis_url, namespace, redis, keys, scripted_model, squat
):
    # The trial: `SET <ns>:replies hello` (or a hash of that name), then turns. Every reply's XADD
    # failed with WRONGTYPE and the turns were retried and dead-lettered with nothing on the errors
    # stream. Each refusal is reported, naming the turn, the stream and the fix; once the key is a
    # stream again, the replies owed go out, once each, and the conversation goes on.
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
            "AGENTSTREAM_MAX_DELIVERIES": "100",
            "AGENTSTREAM_MIN_IDLE_MS": "800",
        },
    )
    try:
        if squat == "string":
            await redis.set(keys.replies, "hello")
        else:
            await redis.hset(keys.replies, "x", "y")
        await services.start("p1", "agent-loop", "tool-worker")
        for trace_id in ("hR1", "hR2"):
            await redis.xadd(keys.turns, {TURN_FIELD: turn_json(trace_id=trace_id, turn_id="t1")})

        async def reported():
            errors = [f for _, f in await redis.xrange(keys.errors)]
            turns = {
                f.get(b"trace_id")
                for f in errors
                if keys.replies.encode() in f[b"error"]
                and b"WRONGTYPE" in f[b"error"]
                and b"delete or rename" in f[b"error"]
                and f.get(b"turn_id") == b"t1"
            }
            return turns if turns == {b"hR1", b"hR2"} else None

        await wait_for(reported, what="a report of each refused reply")
        await redis.delete(keys.replies)

        async def answered():
            got = await replies_on(redis, keys.replies)
            return got if {r.trace_id for r in got} == {"hR1", "hR2"} else None

        first = await wait_for(answered, timeout_s=20, what="the replies owed, once the stream takes them")
        assert all(r.status == "ended" and r.answer == "The answer is 4." for r in first), first
        await redis.xadd(keys.turns, {TURN_FIELD: turn_json(trace_id="hR1", turn_id="t2")})
        second = await wait_for(
            lambda: _reply_of(redis, keys.replies, "t2"), timeout_s=10, what="the next turn's reply"
        )
        assert second.status == "ended"
        replies = await replies_on(redis, keys.replies)
        assert sorted((r.trace_id, r.turn_id) for r in replies) == [("hR1", "t1"), ("hR1", "t2"), ("hR2", "t1")], (
            replies
        )
        for stream in (keys.turns, keys.wake):  # retried, not given up
            assert not await redis.exists(keys.dead(stream)) or await redis.xlen(keys.dead(stream)) == 0
    finally:
        await services.stop_all()


async def test_a_cancel_that_can_never_take_effect_is_reported_and_a_hint_for_no_trace_is_counted(
    store, redis, keys, namespace
):
    # The trial: cancels and wake-ups naming traces (or turns) that do not exist, from a plain
    # client. They were dropped with nothing on the errors stream: a backend that mistyped a
    # conversation id never learned its cancel did nothing. A cancel that lost a race with its
    # turn's end is not a mistake, and is not reported.
    loop = AgentLoop(apps.app, store, {})
    await store.append("hC1", TurnInput(turn_id="t1", agent="calc", text="hi"))
    await store.append("hC1", TurnEnded(turn_id="t1", answer="hello"))

    def cancel(**fields) -> dict:
        return {CANCEL_FIELD: codec.encode(CancelMessage(**{"by": "backend", "reason": "stop", **fields}))}

    await loop.on_cancel("5-1", cancel(trace_id="hNone", turn_id="t1"))  # no such conversation
    await loop.on_cancel("5-2", cancel(trace_id="hNone2"))  # no such conversation, no turn named
    await loop.on_cancel("5-3", cancel(trace_id="hC1", turn_id="t9"))  # no such turn
    await loop.on_cancel("5-4", cancel(trace_id="hC1", turn_id="t1"))  # ended first: a race, not reported
    await loop.on_cancel("5-5", cancel(trace_id="hC1"))  # nothing running: not reported
    await loop.on_cancel(
        "5-6", cancel(trace_id="hNone3", turn_id="c1", by="parent")
    )  # `by` is the sender's word: no way out
    errors = {f[b"entry"]: f for _, f in await redis.xrange(keys.errors)}
    assert sorted(errors) == [b"5-1", b"5-2", b"5-3", b"5-6"], errors
    assert b"'hNone' holds no turn" in errors[b"5-1"][b"error"] and errors[b"5-1"][b"trace_id"] == b"hNone"
    assert b"cancelled nothing" in errors[b"5-2"][b"error"] and keys.cancel.encode() in errors[b"5-2"][b"error"]
    assert b"holds no turn 't9'" in errors[b"5-3"][b"error"] and errors[b"5-3"][b"turn_id"] == b"t9"
    assert not await redis.exists(keys.trace("hNone"), keys.trace("hNone2"), keys.trace("hNone3"))  # nothing written
    assert [type(e) for e in await events_of(store, "hC1")] == [TurnInput, TurnEnded]
    await loop.on_wake("6-1", {WAKE_FIELD: codec.encode(Wake(trace_id="hGone", reason="result:c1"))})
    assert loop.empty_hints == 1 and not await redis.exists(keys.trace("hGone"), keys.lease("hGone"))
    assert await redis.xlen(keys.errors) == 4  # a hint is not state: one for a trace retention deleted is no error


@pytest.mark.slow
async def test_a_reply_the_squatted_replies_stream_refused_past_the_retries_goes_out_once_it_is_a_stream(
    redis_url, namespace, redis, keys, store, scripted_model
):
    # The trial: the squat outlasted the work entry's deliveries; the entry was dead-lettered and
    # the reply waited for the conversation's next turn, which may never come. The watchdog
    # publishes what the trace owes once the stream takes it, once.
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
            "AGENTSTREAM_MAX_DELIVERIES": "2",
            "AGENTSTREAM_MIN_IDLE_MS": "400",
            "AGENTSTREAM_WATCHDOG_INTERVAL_MS": "500",
        },
    )
    try:
        await redis.set(keys.replies, "squat")
        await services.start("p1", "agent-loop", "tool-worker")
        await redis.xadd(keys.turns, {TURN_FIELD: turn_json(trace_id="hO1", turn_id="t1")})

        async def given_up():
            dead = [keys.dead(s) for s in (keys.turns, keys.wake)]
            return sum([await redis.xlen(d) for d in dead if await redis.exists(d)]) or None

        await wait_for(given_up, timeout_s=30, what="the work entry dead-lettered")
        assert isinstance((await events_of(store, "hO1"))[-1], TurnEnded)
        await redis.delete(keys.replies)
        (reply,) = await wait_for(lambda: replies_on(redis, keys.replies), timeout_s=15, what="the owed reply")
        assert reply.turn_id == "t1" and reply.status == "ended"
        await asyncio.sleep(1.5)  # rounds of the watchdog after it: nothing more
        assert len(await replies_on(redis, keys.replies)) == 1
        assert await redis.zcard(f"{namespace}:owed-replies") == 0
    finally:
        await services.stop_all()


def test_a_result_the_loop_records_that_the_trace_cannot_store_becomes_an_error_result(store):
    # A result a decision builds from what the model wrote (an unknown tool's, a reopen's) that
    # echoes a lone surrogate failed the append on every delivery, calling the model each time.
    loop = AgentLoop(apps.app, store, {})
    good = ToolOutput(turn_id="t1", call_id="c1", name="nope", text="Error: no tool", error="unknown_tool")
    bad = ToolOutput(
        turn_id="t1", call_id="c2", name="reopen", text="Error: unknown handle r\ud800", error="invalid_arguments"
    )
    kept, replaced = loop._storable([good, bad])
    assert kept is good
    assert (replaced.call_id, replaced.error) == ("c2", "invalid_result") and "could not be stored" in replaced.text
    assert store.codec.unstorable(replaced) is None


async def test_a_malformed_copy_read_just_after_its_valid_turn_does_not_end_it(store, redis, keys):
    # The trial: a valid turn and, 12 ms later, a malformed message with its ids, read in one
    # batch. The refusal ran beside the admission, found no turn yet, and ended the turn
    # `bad_turn` before its valid body entered; refusals now wait their turn as admissions do.
    loop = AgentLoop(apps.app, store, {})
    real = loop.store.admit_turn

    async def slow_admission(*args, **kwargs):  # its round trip took a while (a loaded Redis, a new connection)
        await asyncio.sleep(0.2)
        return await real(*args, **kwargs)

    loop.store.admit_turn = slow_admission
    valid = {TURN_FIELD: turn_json(trace_id="hH2", turn_id="t1")}
    malformed = {
        TURN_FIELD: json.dumps({"trace_id": "hH2", "turn_id": "t1", "agent": "calc", "txt": "bad copy"}).encode()
    }
    await asyncio.gather(loop.on_turn("1-1", valid), loop.on_turn("1-2", malformed))
    events = await events_of(store, "hH2")
    assert isinstance(events[0], TurnInput) and events[0].text == "What is 2 + 2?"
    assert not any(isinstance(e, TurnFailed) and e.code == "bad_turn" for e in events), events
    (error,) = await redis.xrange(keys.errors)
    assert b"malformed copy" in error[1][b"error"] and b"txt" in error[1][b"error"]


async def _reply_of(redis, stream, turn_id):
    return next((r for r in await replies_on(redis, stream) if r.turn_id == turn_id), None)


def test_reply_stream_rules_are_pure_functions_the_gateway_can_call(keys):
    limits = wire.WireLimits(reply_streams=wire.parse_patterns("app:*, billing:replies"))
    assert wire.reply_stream_refusal(keys.replies, keys, limits) is None
    assert wire.reply_stream_refusal(f"{keys.replies}:x:y", keys, limits) is None
    assert wire.reply_stream_refusal("app:anything", keys, limits) is None
    assert wire.reply_stream_refusal("billing:replies", keys, limits) is None
    assert "matches none" in wire.reply_stream_refusal("billing:other", keys, limits)
    wide = wire.WireLimits(reply_streams=("*",))
    assert "not a replies stream" in wire.reply_stream_refusal(keys.trace("c"), keys, wide)
    assert wire.reply_stream_refusal("anything", keys, wide) is None
    with pytest.raises(TurnRejected) as caught:
        wire.validate_turn(turn_json(reply_to="x"), keys=keys)
    assert caught.value.code == "bad_turn" and caught.value.limit == "AGENTSTREAM_REPLY_STREAMS"
    assert (caught.value.trace_id, caught.value.turn_id, caught.value.reply_to) == ("conv-a", "t1", None)


# --- 2. limits ------------------------------------------------------------------------------


async def stored_bytes(redis, namespace: str) -> int:
    total = 0
    for key in await all_keys(redis, namespace):
        total += await redis.memory_usage(key) or 0
    return total


async def test_a_10_mb_turn_is_refused_before_anything_of_it_is_stored(store, redis, keys, namespace):
    loop = AgentLoop(apps.app, store, {})
    payload = turn_json(text="x" * 10_000_000, metadata={"user": "u7"})
    await loop.on_turn("1-0", {TURN_FIELD: payload})
    (reply,) = await replies_on(redis, keys.replies)
    assert reply.code == "bad_turn" and "AGENTSTREAM_MAX_TURN_BYTES=524,288" in reply.reason, reply.reason
    assert f"{len(payload):,} bytes" in reply.reason
    assert reply.metadata == {"user": "u7"}
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnFailed]
    assert await stored_bytes(redis, namespace) < 50_000


async def test_huge_metadata_is_refused_and_not_echoed(store, redis, keys):
    loop = AgentLoop(apps.app, store, {}, limits=wire.WireLimits(max_turn_bytes=4_000_000))
    await loop.on_turn("1-0", {TURN_FIELD: turn_json(metadata={"blob": "m" * 1_000_000})})
    (reply,) = await replies_on(redis, keys.replies)
    assert "AGENTSTREAM_MAX_METADATA_BYTES=16,384" in reply.reason and "1,000,004 bytes" in reply.reason, reply.reason
    assert reply.metadata == {}
    assert len(await redis.xrange(keys.replies)) == 1 and len(codec.encode(reply)) < 2000


async def test_deep_nesting_and_long_ids_are_refused_naming_the_limit(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    deep = turn_json()[:-1] + b', "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    await loop.on_turn("1-0", {TURN_FIELD: deep})
    await loop.on_turn("2-0", {TURN_FIELD: turn_json(turn_id="t2", agent="a" * 300)})
    by_turn = {r.turn_id: r for r in await replies_on(redis, keys.replies)}
    assert "AGENTSTREAM_MAX_JSON_DEPTH=16" in by_turn["t1"].reason and "5,001 levels" in by_turn["t1"].reason
    assert "AGENTSTREAM_MAX_ID_BYTES=256" in by_turn["t2"].reason and "`$.agent` is 300 bytes" in by_turn["t2"].reason


async def test_the_errors_stream_is_capped_and_keeps_bounded_excerpts(store, redis, keys):
    limits = wire.WireLimits(errors_maxlen=10, excerpt_bytes=200)
    loop = AgentLoop(apps.app, store, {}, limits=limits)
    for i in range(250):  # no trace or turn id: nothing to fail, so each goes to the errors stream
        await loop.on_turn(f"{i + 1}-0", {TURN_FIELD: json.dumps({"text": "p" * 100_000, "n": i}).encode()})
    length = await redis.xlen(keys.errors)
    assert length < 250 and length <= 10 + 100, length  # MAXLEN ~ trims whole nodes (100 entries each)
    for _, fields in await redis.xrange(keys.errors):
        assert len(fields[b"payload"]) <= 200 + 40 and b"bytes in all" in fields[b"payload"], fields[b"payload"][-60:]


async def test_the_dead_letter_stream_is_capped_and_keeps_bounded_excerpts(redis, keys):
    stream = f"{keys.namespace}:work"

    async def fails(entry_id, fields):
        raise RuntimeError("boom " + "e" * 1000)

    config = ConsumerConfig(
        block_ms=20, max_deliveries=1, retry_delay_s=0.01, dead_maxlen=10, excerpt_bytes=100, min_idle_ms=60_000
    )
    consumer = StreamConsumer(
        redis, stream=stream, group="g", consumer="c1", handler=fails, config=config, dead_stream=keys.dead(stream)
    )
    await consumer.ensure_group()
    for i in range(150):
        await redis.xadd(stream, {b"job": b"j" * 50_000, b"n": str(i).encode()})
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await wait_for(lambda: _dead_count(consumer, 150), timeout_s=180, what="150 dead letters")
    stop.set()
    await asyncio.wait_for(task, 10)
    dead = await redis.xrange(keys.dead(stream))
    assert consumer.dead_lettered == 150 and len(dead) <= 10 + 100, len(dead)
    for _, fields in dead:
        assert len(fields[b"job"]) <= 100 + 40 and b"50,000 bytes in all" in fields[b"job"]
        assert len(fields[b"dead_error"]) <= 512 + 40


async def _dead_count(consumer, n):
    return consumer.dead_lettered >= n


@tool
def blob(size: int, text: str = "") -> str:
    """Return ``size`` bytes."""
    return "b" * size


BLOB_APP = App(agents=[Agent(name="blob", system_prompt="Make blobs.", tools=[blob])])


async def test_tool_arguments_and_results_over_their_limits_become_error_results(store, redis, keys):
    limits = wire.WireLimits(max_tool_arguments_bytes=1000, max_tool_result_bytes=2000)
    worker = ToolWorker(BLOB_APP, store, limits=limits)
    await store.append("conv-t", TurnInput(turn_id="t1", agent="blob", text="go"))
    big_args = json.dumps({"size": 1, "text": "a" * 5000})
    jobs = [
        ToolJob(trace_id="conv-t", turn_id="t1", call_id="c1", name="blob", arguments=big_args),
        ToolJob(trace_id="conv-t", turn_id="t1", call_id="c2", name="blob", arguments=json.dumps({"size": 5_000_000})),
        ToolJob(trace_id="conv-t", turn_id="t1", call_id="c3", name="blob", arguments=json.dumps({"size": 3})),
    ]
    calls = tuple(ToolCall(id=j.call_id, name=j.name, arguments=j.arguments) for j in jobs)
    await store.append("conv-t", ModelOutput(turn_id="t1", step=0, tool_calls=calls, stop_reason="tool_calls"))
    for i, job in enumerate(jobs):
        await worker.on_job(f"{i + 1}-0", {JOB_FIELD: codec.encode(job)}, stream=keys.tools("default"))
    results = {e.call_id: e for e in await events_of(store, "conv-t") if isinstance(e, ToolOutput)}
    assert (
        results["c1"].error == "arguments_too_large"
        and "AGENTSTREAM_MAX_TOOL_ARGUMENTS_BYTES=1,000" in results["c1"].text
    )
    assert f"{len(big_args):,} bytes" in results["c1"].text
    assert results["c2"].error == "result_too_large" and "AGENTSTREAM_MAX_TOOL_RESULT_BYTES=2,000" in results["c2"].text
    assert "5,000,000 bytes" in results["c2"].text and len(results["c2"].text) < 500
    assert results["c3"].error is None and results["c3"].text == "bbb"
    assert all(len(codec.encode(r)) < 2000 for r in results.values())  # the 5 MB result was never stored


def test_json_depth_is_linear_and_skips_strings():
    assert wire.json_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": []}]}') == 4
    assert wire.json_depth(b'"just a string"') == 0
    assert wire.json_depth(b'{"a": "\\"[[["}') == 1
    assert wire.json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000


async def test_a_rejected_message_never_ends_the_accepted_turn_that_owns_its_id(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    await store.append("conv-a", TurnInput(turn_id="t1", agent="calc", text="running"))
    await loop.on_turn("1-0", {TURN_FIELD: turn_json(agent="nobody")})
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnInput]
    (error,) = await redis.xrange(keys.errors)
    assert b"which the trace already holds" in error[1][b"error"]
    await asyncio.sleep(0)


# --- 10. the reply's dedupe key -------------------------------------------------------------


async def test_a_turn_id_reused_in_another_trace_is_another_turn_and_replies_dedupe_by_both_ids(
    redis_url, namespace, redis, keys, scripted_model
):
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="conv-1", turn_id="turn-1", text="What is 2 + 3?")}
        )
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="conv-2", turn_id="turn-1", text="What is 4 + 5?")}
        )

        async def both():
            replies = await replies_on(redis, keys.replies)
            return replies if {r.trace_id for r in replies} == {"conv-1", "conv-2"} else None

        await wait_for(both, what="both replies")
        # published again (a backend lost the reply): the same reply again
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="conv-1", turn_id="turn-1", text="What is 2 + 3?")}
        )

        async def three():
            replies = await replies_on(redis, keys.replies)
            return replies if len(replies) >= 3 else None

        replies = await wait_for(three, what="the reply again")
        deduped = {(r.trace_id, r.turn_id): r.answer for r in replies}
        assert deduped == {("conv-1", "turn-1"): "The answer is 5.", ("conv-2", "turn-1"): "The answer is 9."}, replies
        assert len(replies) == 3  # by turn id alone a backend would have dropped conv-2's answer
    finally:
        await services.stop_all()
    readme = docs.page("how-to/publish-a-turn.md")
    assert "dedupe them by\n  `(trace_id, turn_id)`" in readme and "dedupe them by `turn_id`" not in readme
    assert "(trace_id, turn_id)" in (codec.reply_schema()["description"])


# --- 4. a provider's token count is not trusted blindly ----------------------------------------


def under_reporting_rule(body):
    return {
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


async def test_an_under_reported_prompt_count_is_logged_once_per_endpoint_and_compaction_still_counts(
    redis_url, namespace, redis, keys, store, caplog
):
    from tests.support.scripted_model import ScriptedModelServer

    options = json.dumps({"stream": False, "window_tokens": 4000, "chars_per_token": 3.0})
    with ScriptedModelServer(under_reporting_rule) as model:
        services = InProcess(
            apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": options}
        )
        try:
            await services.start("p1", "agent-loop")
            with caplog.at_level("WARNING", logger="agentstream.agent_loop"):
                for i in range(1, 4):
                    await redis.xadd(
                        keys.turns, {TURN_FIELD: turn_json(trace_id="big", turn_id=f"t{i}", text="w" * 4_500)}
                    )
                    await wait_for(lambda i=i: _reply_of(redis, keys.replies, f"t{i}"), what=f"reply {i}")
        finally:
            await services.stop_all()
        calls = len(model.requests)
    replies = {r.turn_id: r for r in await replies_on(redis, keys.replies)}
    assert replies["t1"].status == "ended" and replies["t2"].status == "ended"
    # 3 x 4,500 characters is over the 4,000-token window by the estimate: the third turn does not
    # go out (with the reported 3 tokens trusted, it would have been sent and overflowed)
    assert replies["t3"].status == "failed" and replies["t3"].code == "context_full", replies["t3"]
    assert calls == 2
    doubts = [r.getMessage() for r in caplog.records if "reported 3 prompt tokens" in r.getMessage()]
    assert len(doubts) == 1, doubts  # once per endpoint, with both figures
    assert re.search(r"estimated at \d{4} tokens \(\d{4} characters", doubts[0]) and "'default'" in doubts[0], doubts[0]


# --- 7. user text is never a template ----------------------------------------------------------


async def test_user_text_and_metadata_reach_the_model_verbatim_never_rendered(
    redis_url, namespace, redis, keys, scripted_model
):
    text = "What is 6 * 7? {{ 7 * 7 }} {% for x in range(3) %}X{% endfor %} {{ cycler.__init__.__globals__ }}"
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await redis.xadd(
            keys.turns, {TURN_FIELD: turn_json(trace_id="tpl", text=text, metadata={"note": "{{ 1 + 1 }}"})}
        )
        reply = await wait_for(lambda: _reply_of(redis, keys.replies, "t1"), what="the reply")
    finally:
        await services.stop_all()
    first = json.loads(scripted_model.requests[0])
    assert [m["content"] for m in first["messages"] if m["role"] == "user"] == [text]
    assert "49" not in json.dumps(first) and "XXX" not in json.dumps(first)
    assert reply.metadata == {"note": "{{ 1 + 1 }}"} and reply.status == "ended"


async def test_refused_turns_of_one_trace_arriving_together_are_all_answered_without_waiting_a_lease(
    store, redis, keys
):
    """Several bad turns of one conversation handled at once compete for its lease for one append
    each: every one fails ``bad_turn`` with its own reply, none is deferred by a lease time."""
    loop = AgentLoop(apps.app, store, {})
    bad = [turn_json(turn_id=f"t{i}", agent="nobody") for i in range(8)]
    await asyncio.gather(*(loop.on_turn(f"{i + 1}-0", {TURN_FIELD: body}) for i, body in enumerate(bad)))
    replies = await replies_on(redis, keys.replies)
    assert sorted(r.turn_id for r in replies) == sorted(f"t{i}" for i in range(8))
    assert {r.code for r in replies} == {"bad_turn"}
    failed = [e for e in await events_of(store, "conv-a") if isinstance(e, TurnFailed)]
    assert sorted(e.turn_id for e in failed) == sorted(f"t{i}" for i in range(8))
