"""A stream entry that gives a field more than once (``XADD s * turn A turn B``: Redis keeps both
pairs, redis-py's dict kept the last) is refused on every work stream the services read, naming
the field; it is acknowledged, never processed, and the consumers go on (README "Text rules")."""

from __future__ import annotations

import json

import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from agentstream.errors import EventDecodeError
from agentstream.runtime.entries import keep_doubled_fields
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.entries import EntryFields
from agentstream.wire.events import TurnFailed, TurnInput
from agentstream.wire.keys import (
    CANCEL_FIELD,
    COMPACTION_FIELD,
    ENDING_FIELD,
    JOB_FIELD,
    TURN_FIELD,
    WAKE_FIELD,
)
from tests.support import apps
from tests.support.inprocess import InProcess, errors_of, events_of, replies_on, wait_for
from tests.support.redis_server import cluster_mode

pytestmark = pytest.mark.integration


def turn_json(**fields) -> bytes:
    base = {"trace_id": "conv-a", "turn_id": "t1", "agent": "calc", "text": "What is 2 + 2?"}
    base.update(fields)
    return json.dumps(base).encode()


async def xadd_pairs(redis, stream: str, *pairs: bytes | str) -> str:
    """XADD with the pairs as given, a field repeated if it is (redis-py's xadd takes a dict)."""
    entry = await redis.execute_command("XADD", stream, "*", *pairs)
    return entry.decode() if isinstance(entry, bytes) else entry


async def all_pending(redis, streams: list[str]) -> dict[str, int]:
    out = {}
    for stream in streams:
        for group in await redis.xinfo_groups(stream):
            out[f"{stream}/{group['name'].decode()}"] = int(group["pending"])
    return out


async def test_an_entry_giving_a_field_twice_is_refused_on_every_work_stream_and_nothing_else_is_lost(
    redis_url, namespace, redis, keys, store, scripted_model
):
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker", "compaction", "delegation")
        # a turn whose two `turn` values agree on where it goes: refused there, bad_turn, naming the field
        same = turn_json(trace_id="d1", turn_id="t1")
        await xadd_pairs(
            redis,
            keys.turns_for("d1"),
            TURN_FIELD,
            same,
            TURN_FIELD,
            turn_json(trace_id="d1", turn_id="t1", text="rm -rf"),
        )
        # two turns of different conversations in one entry: which one is meant is unknown, so neither
        await xadd_pairs(
            redis,
            keys.turns_for("d2"),
            TURN_FIELD,
            turn_json(trace_id="d2", turn_id="t2"),
            TURN_FIELD,
            turn_json(trace_id="d3", turn_id="t3"),
        )
        # another field given twice beside one good `turn`: refused too, the failure to its ids
        await xadd_pairs(
            redis,
            keys.turns_for("d4"),
            "trace_id",
            "d4",
            TURN_FIELD,
            turn_json(trace_id="d4", turn_id="t4"),
            "trace_id",
            "d5",
        )
        hints = {  # every other work stream a client can reach: (stream, field)
            "wake-up": (keys.wake_for("d6"), WAKE_FIELD, json.dumps({"trace_id": "d6", "reason": "x"})),
            "cancel": (keys.cancel, CANCEL_FIELD, json.dumps({"trace_id": "d6"})),
            "tool job": (keys.tools_for("default", "d6"), JOB_FIELD, "{}"),
            "compaction job": (keys.for_trace(keys.compactions, "d6"), COMPACTION_FIELD, "{}"),
            "delegation job": (keys.for_trace(keys.delegations, "d6"), JOB_FIELD, "{}"),
            "child ending": (keys.for_trace(keys.child_endings, "d6"), ENDING_FIELD, "{}"),
        }
        for stream, field, value in hints.values():
            await xadd_pairs(redis, stream, field, value, field, value + " ")
        # and a good turn behind them all
        await redis.xadd(keys.turns_for("d9"), {TURN_FIELD: turn_json(trace_id="d9", turn_id="t9")})

        async def settled():
            got = {r.turn_id: r for r in await replies_on(redis, keys.replies)}
            errors = await errors_of(redis, keys)
            return (got, errors) if {"t1", "t4", "t9"} <= set(got) and len(errors) >= 1 + len(hints) else None

        got, errors = await wait_for(settled, what="the refusals and the good answer")
        assert got["t9"].status == "ended" and got["t9"].answer == "The answer is 4."
        for turn_id, field in (("t1", "turn"), ("t4", "trace_id")):
            assert got[turn_id].status == "failed" and got[turn_id].code == "bad_turn", got[turn_id]
            assert f"field '{field}' given 2 times" in got[turn_id].reason, got[turn_id].reason
        assert not {"t2", "t3"} & set(got)  # routed to neither
        events = await events_of(store, "d1")
        assert not [e for e in events if isinstance(e, TurnInput)]  # nothing of it entered the trace
        assert [e.code for e in events if isinstance(e, TurnFailed)] == ["bad_turn"]
        assert not await events_of(store, "d2") and not await events_of(store, "d3")
        # the errors stream names the field and shows every pair of the entry
        doubled = [e for e in errors if "given 2 times" in e["error"]]
        assert len(doubled) == 1 + len(hints), errors
        refused_turn = next(e for e in doubled if "'turn'" in e["error"])
        assert refused_turn["source"] == keys.turns_for("d2") and keys.turns_for("d2") in refused_turn["error"]
        assert json.loads(refused_turn["payload"]) == [
            ["turn", turn_json(trace_id="d2", turn_id="t2").decode()],
            ["turn", turn_json(trace_id="d3", turn_id="t3").decode()],
        ]
        for what, (stream, field, _value) in hints.items():
            assert any(
                f"field '{field.decode()}' given 2 times" in e["error"] and e["source"] == stream and e["entry"]
                for e in doubled
            ), (what, doubled)  # the partition the entry was on
        # every entry acknowledged: nothing stays pending, nothing was dead-lettered after retries
        streams = [keys.turns_for("d1"), keys.turns_for("d2"), keys.turns_for("d4"), *(s for s, _, _ in hints.values())]
        pending = await wait_for(lambda: _all_zero(redis, streams), what="every entry acknowledged")
        assert pending
    finally:
        await services.stop_all()


async def _all_zero(redis, streams):
    pending = await all_pending(redis, streams)
    return pending if pending and not any(pending.values()) else None


async def test_a_trace_entry_giving_a_field_twice_is_not_read_by_any_read_of_the_trace(store, redis, keys):
    """A trace is written by the services only; an entry that repeats ``e`` (someone's XADD) is
    refused by every read, XRANGE and the scripts that read what is new, naming the field."""
    first = await store.append("tr", TurnInput(turn_id="t1", agent="calc", text="hi"))
    event = codec.encode(TurnFailed(turn_id="t1", code="x", reason="y"))
    await xadd_pairs(redis, keys.trace("tr"), "v", "1", "e", event, "e", event)
    for read in (
        lambda: store.read("tr"),
        lambda: store.read_after("tr", first.entry_id),
        lambda: store.take("tr", ttl_ms=1000, after=first.entry_id),
    ):
        with pytest.raises(EventDecodeError, match="field 'e' given 2 times"):
            await read()


def test_a_doubled_field_is_named_by_the_pure_check(keys):
    fields = EntryFields([(b"turn", turn_json()), (b"turn", turn_json())])
    refused = wire.doubled_turn_refusal(fields, "entry 1-0 of s", keys=keys)
    assert refused is not None and refused.code == "bad_turn"
    assert "field 'turn' given 2 times" in refused.reason and (refused.trace_id, refused.turn_id) == ("conv-a", "t1")
    differ = EntryFields([(b"turn", turn_json()), (b"turn", turn_json(turn_id="t2"))])
    assert wire.doubled_turn_refusal(differ, "e", keys=keys).turn_id is None
    assert wire.doubled_turn_refusal({b"turn": turn_json()}, "e", keys=keys) is None


CLIENTS = ["connect()"] if cluster_mode() else ["connect()", "resp2", "resp3", "resp3-unified", "sync"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_every_read_of_stream_entries_keeps_a_repeated_field(client, redis_url, redis, namespace):
    """XREAD, XREADGROUP, XRANGE, XREVRANGE, XCLAIM, XAUTOCLAIM (and in a pipeline) with the
    project's client (a cluster client in the cluster pass) and with redis-py's sync client and
    each protocol's reply shapes: an entry that repeats a field reads as EntryFields, the others
    as plain dicts."""
    stream = f"{namespace}:s"
    one_pair = await xadd_pairs(redis, stream, "turn", "a")
    two = await xadd_pairs(redis, stream, "turn", "a", "x", "1", "turn", "b")
    await redis.xgroup_create(stream, "g", id="0")
    options = {
        "resp2": {"protocol": 2},
        "resp3": {"protocol": 3},
        "resp3-unified": {"protocol": 3, "legacy_responses": False},
    }
    if client == "sync":
        sync = keep_doubled_fields(sync_redis.Redis.from_url(redis_url))
        try:
            seen = [
                sync.xrange(stream),
                sync.xrevrange(stream),
                sync.xreadgroup("g", "c", {stream: ">"})[0][1],
                sync.xautoclaim(stream, "g", "c2", 0)[1],
                sync.xclaim(stream, "g", "c3", 0, [two]),
            ]
        finally:
            sync.close()
        _check(seen, one_pair, two)
        return
    other = (
        redis if client == "connect()" else keep_doubled_fields(aioredis.Redis.from_url(redis_url, **options[client]))
    )
    try:
        group_read = await other.xreadgroup("g", "c", {stream: ">"})
        plain_read = await other.xread({stream: "0"})
        pipe = other.pipeline(transaction=False)
        pipe.xrange(stream)
        seen = [
            await other.xrange(stream),
            await other.xrevrange(stream),
            _entries(group_read),
            _entries(plain_read),
            (await other.xautoclaim(stream, "g", "c2", 0))[1],
            await other.xclaim(stream, "g", "c3", 0, [two]),
            (await pipe.execute())[0],
        ]
        assert await other.xautoclaim(stream, "g", "c4", 0, justid=True)  # ids only: untouched
    finally:
        if other is not redis:
            await other.aclose()
    _check(seen, one_pair, two)


def _entries(reply):
    if isinstance(reply, dict):
        (value,) = reply.values()
        return value[0] if value and isinstance(value[0], list) else value
    return reply[0][1]


def _check(seen, one_pair, two):
    for entries in seen:
        by_id = {(i.decode() if isinstance(i, bytes) else i): f for i, f, *_ in entries}
        assert two in by_id, entries
        doubled = by_id[two]
        assert isinstance(doubled, EntryFields) and doubled.doubled == {b"turn": 2}, entries
        assert doubled == {b"turn": b"b", b"x": b"1"} and doubled.values_of(b"turn") == [b"a", b"b"]
        if one_pair in by_id:
            assert type(by_id[one_pair]) is dict
