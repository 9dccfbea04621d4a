"""One conversation's backlog does not delay the others, and is capped (issue 33, item 5).

With the ``queue`` busy policy a turn of a busy conversation enters its trace at once (one
admission round trip; the trace is the durable queue, in publish order) and its entry is
acknowledged; the lease holder's step loop takes the queued turns one after the other. No handler
waits for the busy conversation's lease, so another conversation's turn is read and answered while
the backlog is still there. Past ``AGENTSTREAM_MAX_QUEUED_TURNS`` turns admitted and not ended, a
new turn fails at once with code ``busy``.

The model here holds every call of the busy conversation until the test lets it go: what is
asserted is what was answered while it held, not how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest

from agentstream.agent_loop.loop import AgentLoop
from agentstream.wire import codec
from agentstream.wire.events import TurnFailed
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import REPLY_FIELD, TURN_FIELD
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, wait_for
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.integration

HOLD = "hold"
"""The text of the busy conversation's turns: the model answers them only once the gate opens."""


class GatedModel(ScriptedModelServer):
    """A model that answers at once, except calls whose last message is :data:`HOLD`: those wait
    for :attr:`gate` (at most a minute, so a failing test cannot hang)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.held = 0
        super().__init__(self._rule)

    def _rule(self, body: dict) -> dict:
        if body["messages"][-1].get("content") == HOLD:
            self.held += 1
            self.gate.wait(60)
        return {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}


def turn(trace_id: str, turn_id: str, text: str = HOLD) -> bytes:
    return json.dumps({"trace_id": trace_id, "turn_id": turn_id, "agent": "calc", "text": text}).encode()


async def publish_all(redis, keys, payloads: list[tuple[str, bytes]]) -> None:
    """Publish ``(trace id, payload)`` pairs in this order, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for trace_id, payload in payloads:
        pipe.xadd(keys.turns_for(trace_id), {TURN_FIELD: payload})
    await pipe.execute()


async def replies(redis, keys) -> list:
    return [codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(keys.replies)]


def env_of(**extra: str) -> dict[str, str]:
    return {"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}', "AGENTSTREAM_CONCURRENCY": "3", **extra}


async def test_another_conversations_turn_is_answered_while_a_busy_ones_backlog_waits(
    redis_url, namespace, redis, keys
):
    await backlog_and_another(redis_url, namespace, redis, keys)


async def test_the_fairness_test_fails_when_handlers_wait_in_line_for_a_busy_conversation(
    redis_url, namespace, redis, keys, monkeypatch
):
    """The test above can fail: with handlers that wait for a busy conversation's lease before they
    admit its turn (what issue 33 measured: another conversation's turn waited 16 s behind a
    backlog), the other conversation is not answered while the busy one's model call holds."""
    admit = AgentLoop.on_turn

    async def in_line(self, entry_id, fields, *, stream=None):
        trace_id = json.loads(fields[TURN_FIELD])["trace_id"]
        while await self.redis.exists(self.keys.lease(trace_id)):  # the handler waits its turn
            await asyncio.sleep(0.02)
        await admit(self, entry_id, fields, stream=stream)

    monkeypatch.setattr(AgentLoop, "on_turn", in_line)
    with pytest.raises(AssertionError, match="the other conversation's reply not reached"):
        await backlog_and_another(redis_url, namespace, redis, keys, other_within_s=5)


async def backlog_and_another(redis_url, namespace, redis, keys, *, other_within_s: float = 30) -> None:
    """30 turns on one conversation (ten times the handlers), then one on another, on the same
    turns stream: the other is answered (within ``other_within_s``) while the busy one's first
    model call still holds; then the backlog is answered, each once, in publish order."""
    with GatedModel() as model:
        services = InProcess(apps.app, redis_url, namespace, model.base_url, env=env_of())
        try:
            await services.start("p1", "agent-loop")
            backlog = [f"b{i}" for i in range(30)]
            await publish_all(redis, keys, [("busy", turn("busy", t)) for t in backlog])
            await publish_all(redis, keys, [("other", turn("other", "o1", text="hi"))])

            async def answered_other():
                return [r for r in await replies(redis, keys) if r.turn_id == "o1"] or None

            (other,) = await wait_for(answered_other, timeout_s=other_within_s, what="the other conversation's reply")
            assert other.status == "ended"
            assert not [r.turn_id for r in await replies(redis, keys) if r.trace_id == "busy"]
            assert model.held == 1  # one model call at a time per conversation; it still holds

            model.gate.set()

            async def drained():
                got = [r for r in await replies(redis, keys) if r.trace_id == "busy"]
                return got if len(got) >= len(backlog) else None

            got = await wait_for(drained, timeout_s=60, what="the busy conversation's backlog answered")
            assert [r.turn_id for r in got] == backlog  # each once, in publish order
            assert {r.status for r in got} == {"ended"}
        finally:
            model.gate.set()
            await services.stop_all()


async def test_a_turn_past_the_queue_cap_fails_busy_and_the_queued_ones_run_in_order(
    redis_url, namespace, redis, keys, store
):
    with GatedModel() as model:
        env = env_of(AGENTSTREAM_MAX_QUEUED_TURNS="3")
        services = InProcess(apps.app, redis_url, namespace, model.base_url, env=env)
        try:
            await services.start("p1", "agent-loop")
            published = [f"q{i}" for i in range(8)]
            await publish_all(redis, keys, [("full", turn("full", t)) for t in published])
            refused = published[3:]  # q0 runs, q1 and q2 queue behind it: three open turns

            async def refusals():
                got = {r.turn_id: r for r in await replies(redis, keys)}
                return got if set(refused) <= set(got) else None

            got = await wait_for(refusals, timeout_s=30, what="the refusals past the cap")
            assert set(got) == set(refused), sorted(got)  # nothing admitted was answered: the model holds
            for turn_id in refused:
                assert got[turn_id].status == "failed" and got[turn_id].code == FailureCode.BUSY.value
                assert "AGENTSTREAM_MAX_QUEUED_TURNS=3" in (got[turn_id].reason or "")

            # a copy of an admitted turn is no new turn: absorbed, not refused, while the queue is full
            await publish_all(redis, keys, [("full", turn("full", "q1"))])
            model.gate.set()

            async def admitted_answered():
                ended = [r.turn_id for r in await replies(redis, keys) if r.status == "ended"]
                return ended if len(ended) >= 3 else None

            assert await wait_for(admitted_answered, timeout_s=30, what="the queued turns") == ["q0", "q1", "q2"]

            # the queue emptied: a new turn is admitted again (its ending counted the open turns down)
            await publish_all(redis, keys, [("full", turn("full", "q8", text="hi"))])

            async def last():
                return [r for r in await replies(redis, keys) if r.turn_id == "q8"] or None

            (reply,) = await wait_for(last, timeout_s=30, what="a turn after the queue emptied")
            assert reply.status == "ended"
            counts = Counter(r.turn_id for r in await replies(redis, keys))
            assert counts == Counter(published + ["q8"]), counts  # every turn answered once
            failed = {e.turn_id: e.code for e in await events_of(store, "full") if isinstance(e, TurnFailed)}
            assert failed == dict.fromkeys(refused, FailureCode.BUSY)
            assert await redis.hget(keys.trace_keys("full"), "open") == b"0"
        finally:
            model.gate.set()
            await services.stop_all()
