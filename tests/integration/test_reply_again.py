"""A turn published again after it ended (a backend lost the reply) gets the same reply again."""

from __future__ import annotations

import pytest

from agentstream.wire import codec
from agentstream.wire.keys import REPLY_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, publish, wait_for
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.mark.parametrize("policy", ["queue", "reject"])
async def test_a_turn_published_again_after_it_ended_gets_the_same_reply_on_the_same_stream(
    redis, keys, redis_url, namespace, model, monkeypatch, policy
):
    monkeypatch.setenv("REDIS_URL", redis_url)
    services = InProcess(apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_BUSY_POLICY": policy})
    mine = f"{namespace}:replies:mine"  # reply_to must be a replies stream (agentstream.wire.checks)

    async def replies():
        return [codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(mine)]

    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await publish(
            redis,
            keys,
            trace_id="r1",
            turn_id="t1",
            agent="plan",
            text="do: work(1)",
            reply_to=mine,
            metadata={"user": "u7"},
        )
        (first,) = await wait_for(replies, what="the first reply")
        assert first.status == "ended"
        calls = len(model.requests)
        # the backend lost it and publishes the turn again (without reply_to this time)
        await publish(redis, keys, trace_id="r1", turn_id="t1", agent="plan", text="do: work(1)")
        again = await wait_for(lambda: _two(replies), what="the reply again")
    finally:
        await services.stop_all()
    assert again[1] == first  # the same reply, on the stream the turn first named
    assert len(model.requests) == calls  # answered from the trace: nothing ran again
    assert await redis.xlen(keys.replies) == 0


async def _two(replies):
    got = await replies()
    return got if len(got) >= 2 else None


async def test_the_redelivery_of_the_entry_that_brought_the_turn_does_not_reply_again(
    redis, keys, redis_url, namespace, model, monkeypatch
):
    # Its worker died after the turn ended, before the ack: the reply went out once; no second one.
    monkeypatch.setenv("REDIS_URL", redis_url)
    services = InProcess(apps.app, redis_url, namespace, model.base_url)
    try:
        proc = await services.start("p1", "agent-loop", "tool-worker")
        await publish(redis, keys, trace_id="r2", turn_id="t1", agent="plan", text="do: work(1)")
        await wait_for(lambda: redis.xlen(keys.replies), what="the reply")
        ((entry_id, fields),) = await redis.xrange(keys.turns_for("r2"))
        await proc.loop.on_turn(entry_id.decode(), fields)  # the same entry, handled again
        assert await redis.xlen(keys.replies) == 1
        await proc.loop.on_turn("9999999999999-0", fields)  # the same turn, published again
        assert await redis.xlen(keys.replies) == 2
    finally:
        await services.stop_all()
