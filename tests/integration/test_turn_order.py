"""Publish order per conversation with several agent loops (issue 36, item 3): turns of one
conversation published back to back enter its trace in publish order, whatever agent-loop
process reads each of them; the read behind it costs one round trip, whatever the gap."""

from __future__ import annotations

import json

import pytest

from agentstream.runtime.consumer import current_delivery
from agentstream.runtime.turn_order import EarlierTurns
from agentstream.steps.turn_order import trace_marks
from agentstream.wire.events import TurnFailed, TurnInput
from agentstream.wire.keys import AGENT_LOOP_GROUP, TURN_FIELD, Keys
from tests.integration import test_agent_loop_delivery as delivery
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, wait_for, wait_reply

pytestmark = pytest.mark.integration

model = delivery.model
services = delivery.services


def _body(trace_id: str, turn_id: str, **more) -> bytes:
    return json.dumps({"trace_id": trace_id, "turn_id": turn_id, "agent": "plan", "text": "say: hi", **more}).encode()


async def _inputs(store, trace_id: str) -> list[str]:
    return [e.turn_id for e in await events_of(store, trace_id) if isinstance(e, TurnInput)]


async def _publish_together(redis, stream: str, bodies: list[bytes]) -> None:
    pipe = redis.pipeline(transaction=False)
    for body in bodies:
        pipe.xadd(stream, {TURN_FIELD: body})
    await pipe.execute()


async def test_pairs_published_back_to_back_enter_in_publish_order_with_two_agent_loops(redis, keys, services, store):
    """The reproduction of the caveat it drops: without the order check 13 to 24 of these 30
    pairs entered reversed (every run failed)."""
    await services.start("p1", "agent-loop")
    await services.start("p2", "agent-loop")
    rounds = 30
    for r in range(rounds):
        await _publish_together(redis, keys.turns_for(f"o{r}"), [_body(f"o{r}", f"a{r}"), _body(f"o{r}", f"b{r}")])
        if r % 2:  # every other pair once both loops wait again, the others while they are busy
            for turn_id in (f"a{r}", f"b{r}"):
                await wait_reply(redis, keys, turn_id)
    for r in range(rounds):
        for turn_id in (f"a{r}", f"b{r}"):
            assert (await wait_reply(redis, keys, turn_id)).status == "ended"
    wrong = [r for r in range(rounds) if await _inputs(store, f"o{r}") != [f"a{r}", f"b{r}"]]
    assert wrong == [], f"{len(wrong)} of {rounds} pairs entered out of publish order"


async def test_bursts_of_one_conversation_interleaved_with_others_keep_their_order(redis, keys, services, store):
    await services.start("p1", "agent-loop")
    await services.start("p2", "agent-loop")
    await services.start("p3", "agent-loop")
    expected: dict[str, list[str]] = {}
    for r in range(8):  # two conversations' turns interleaved with others', all at once, with three loops
        turns = [(trace, f"{trace}-{n}") for n in range(3) for trace in (f"m{r}", f"n{r}")]
        turns[3:3] = [(f"other-{r}-{n}", f"x{r}-{n}") for n in range(3)]
        pipe = redis.pipeline(transaction=False)
        for trace, turn_id in turns:
            pipe.xadd(keys.turns_for(trace), {TURN_FIELD: _body(trace, turn_id)})
            if not trace.startswith("other"):
                expected.setdefault(trace, []).append(turn_id)
        await pipe.execute()
        for trace in (f"m{r}", f"n{r}"):
            for turn_id in expected[trace]:
                assert (await wait_reply(redis, keys, turn_id)).status == "ended"
    wrong = {trace: got for trace, turn_ids in expected.items() if (got := await _inputs(store, trace)) != turn_ids}
    assert wrong == {}


async def test_a_malformed_turn_before_or_between_two_is_refused_and_they_keep_their_order(
    redis, keys, services, store
):
    for name in ("p1", "p2", "p3"):  # each of the three entries to a loop of its own
        await services.start(name, "agent-loop")
    rounds = 12
    for r in range(rounds):
        a, m, b = _body(f"h{r}", f"a{r}"), _body(f"h{r}", f"m{r}", agent="nobody"), _body(f"h{r}", f"b{r}")
        await _publish_together(redis, keys.turns_for(f"h{r}"), [a, m, b] if r % 2 else [m, a, b])
        for turn_id in (f"a{r}", f"m{r}", f"b{r}"):  # the loops wait again when the next round comes
            await wait_reply(redis, keys, turn_id)
    for r in range(rounds):
        assert (await wait_reply(redis, keys, f"a{r}")).status == "ended"
        assert (await wait_reply(redis, keys, f"b{r}")).status == "ended"
        refused = await wait_reply(redis, keys, f"m{r}")
        assert (refused.status, refused.code) == ("failed", "bad_turn")
    for r in range(rounds):
        events = await events_of(store, f"h{r}")
        assert [e.turn_id for e in events if isinstance(e, TurnInput)] == [f"a{r}", f"b{r}"]
        if r % 2:  # the refusal enters after the turn published before it
            at = {
                (type(e).__name__, e.turn_id): i for i, e in enumerate(events) if isinstance(e, TurnInput | TurnFailed)
            }
            assert at[("TurnInput", f"a{r}")] < at[("TurnFailed", f"m{r}")], events


async def test_another_backends_turns_between_two_are_refused_on_their_own(redis, redis_url, namespace, model, store):
    """On backend b7's turns stream, between two turns of b7's conversation: one naming that
    conversation but b8's replies stream, and one naming b8's conversation. Each is refused by
    its own handler (forbidden), neither enters a trace, and b7's turns enter in publish order."""
    keys = Keys(namespace, 1, ("b7", "b8"))  # (every turn to partition 0 of b7's stream: read all the same)
    services = InProcess(apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_BACKENDS": "b7,b8"})
    rounds = 6
    try:
        for name in ("p1", "p2", "p3"):
            await services.start(name, "agent-loop")
        for r in range(rounds):
            await _publish_together(
                redis,
                keys.backend_turns("b7"),
                [
                    _body(f"b7:c{r}", f"a{r}"),
                    _body(f"b7:c{r}", f"steal{r}", reply_to=keys.backend_replies("b8")),
                    _body(f"b7:c{r}", f"b{r}"),
                    _body(f"b8:c{r}", f"intrude{r}"),
                ],
            )

            async def b7_replies(r=r):
                got = {}
                for _, fields in await redis.xrange(keys.backend_replies("b7")):
                    reply = json.loads(fields[b"reply"])
                    got[reply["turn_id"]] = reply
                return got if len(got) == 4 * (r + 1) else None

            got = await wait_for(b7_replies, timeout_s=30, what="b7's replies")
        for r in range(rounds):
            assert got[f"a{r}"]["status"] == got[f"b{r}"]["status"] == "ended"
            assert got[f"steal{r}"]["code"] == got[f"intrude{r}"]["code"] == "forbidden"
            assert await _inputs(store, f"b7:c{r}") == [f"a{r}", f"b{r}"]
            assert not await redis.exists(keys.trace(f"b8:c{r}"))
        assert not await redis.exists(keys.backend_replies("b8"))
    finally:
        await services.stop_all()


@pytest.mark.parametrize("failing", ["admission", "check"])
async def test_an_earlier_turn_whose_admission_fails_is_left_to_its_own_handler(
    redis, keys, services, store, caplog, failing
):
    """An error checking or admitting an earlier turn (a bug, an error reply) does not fail the
    later turn's handler: the earlier one's own handler admits it, and each turn is answered once."""
    procs = [await services.start("p1", "agent-loop"), await services.start("p2", "agent-loop")]
    for proc in procs:

        async def enter(*args, lead, _enter=proc.loop._enter, **kwargs):
            if not lead:
                raise RuntimeError("an earlier turn's admission failed")
            return await _enter(*args, lead=lead, **kwargs)

        def checked(entry_id, *args, _checked=proc.loop._checked, **kwargs):
            delivery = current_delivery()
            if delivery is not None and delivery.entry_id != entry_id:
                raise RuntimeError("an earlier turn's check failed")
            return _checked(entry_id, *args, **kwargs)

        if failing == "admission":
            proc.loop._enter = enter
        else:
            proc.loop._checked = checked
    for r in range(6):
        await _publish_together(redis, keys.turns_for(f"f{r}"), [_body(f"f{r}", f"a{r}"), _body(f"f{r}", f"b{r}")])
        for turn_id in (f"a{r}", f"b{r}"):
            assert (await wait_reply(redis, keys, turn_id)).status == "ended"
    for r in range(6):
        assert sorted(await _inputs(store, f"f{r}")) == [f"a{r}", f"b{r}"]
    said = "left to its own handler" if failing == "admission" else "could not check turn entry"
    assert any(said in r.getMessage() for r in caplog.records)
    assert not any("handler failed" in r.getMessage() for r in caplog.records)
    replies = await redis.xrange(keys.replies)
    assert len(replies) == 12


async def _pending(redis, stream: str, consumer: str, bodies: list[bytes], *, ack: bool = False) -> list[str]:
    """Add ``bodies`` to ``stream`` and have ``consumer`` of the agent loop's group read them
    (pending; acknowledged with ``ack``) → their ids."""
    pipe = redis.pipeline(transaction=False)
    for body in bodies:
        pipe.xadd(stream, {TURN_FIELD: body})
    ids = [i.decode() if isinstance(i, bytes) else i for i in await pipe.execute()]
    read = await redis.xreadgroup(AGENT_LOOP_GROUP, consumer, {stream: ">"}, count=len(bodies))
    assert [e[0].decode() if isinstance(e[0], bytes) else e[0] for e in read[0][1]] == ids
    if ack:
        for start in range(0, len(ids), 1000):
            await redis.xack(stream, AGENT_LOOP_GROUP, *ids[start : start + 1000])
    return ids


async def test_a_huge_gap_of_handled_entries_costs_one_round_trip(redis, keys):
    """An entry stuck pending long ago, then 20 000 entries handled since: the pending entries
    before a turn are found in one round trip (only pending entries are looked at)."""
    stream = keys.turns_for("g1")
    await redis.xgroup_create(stream, AGENT_LOOP_GROUP, id="0", mkstream=True)
    (stuck,) = await _pending(redis, stream, "gone", [_body("g1", "stuck")])
    await _pending(redis, stream, "fast", [_body("g1", f"h{n}") for n in range(20_000)], ack=True)
    (earlier,) = await _pending(redis, stream, "q", [_body("g1", "a")])
    await _pending(redis, stream, "q", [_body("g2", "x")])  # another conversation's, pending
    (mine,) = await _pending(redis, stream, "p", [_body("g1", "b")])
    found = await EarlierTurns(redis).read(stream, AGENT_LOOP_GROUP, mine, trace_marks("g1"), field=TURN_FIELD)
    assert [i for i, _ in found.entries] == [stuck, earlier]
    assert found.whole and found.trips == 1
    assert json.loads(found.entries[1][1][TURN_FIELD])["turn_id"] == "a"


async def test_many_pending_entries_are_read_in_pages_and_a_bound_is_said(redis, keys):
    stream = keys.turns_for("g3")
    await redis.xgroup_create(stream, AGENT_LOOP_GROUP, id="0", mkstream=True)
    bodies = [_body("g3" if n % 100 == 0 else f"z{n}", f"t{n}") for n in range(600)]
    ids = await _pending(redis, stream, "busy", bodies)
    escaped = (
        await _pending(redis, stream, "busy", [b'{"trace_id": "\\u0067\\u0033", "turn_id": "e", "agent": "plan"}'])
    )[0]
    (mine,) = await _pending(redis, stream, "p", [_body("g3", "mine")])
    reader = EarlierTurns(redis)
    found = await reader.read(stream, AGENT_LOOP_GROUP, mine, trace_marks("g3"), field=TURN_FIELD, page=256)
    assert [i for i, _ in found.entries] == [ids[n] for n in range(0, 600, 100)] + [escaped]
    assert found.whole and found.trips == 3
    bounded = await reader.read(stream, AGENT_LOOP_GROUP, mine, trace_marks("g3"), field=TURN_FIELD, page=100, most=300)
    assert not bounded.whole and bounded.trips == 3
    assert [i for i, _ in bounded.entries] == [ids[n] for n in range(0, 300, 100)]
