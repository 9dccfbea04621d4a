"""The wire's text rules (issue 11's trust boundary, what a decoder alone lets through): ids
without control or invisible characters, a reply stream with a name after its last `:`, each
JSON key once per object, strings that are Unicode (reported by what and where, never as
"truncated"), and every malformed work entry reported with its stream and entry id. Real Redis;
the services' real handlers."""

from __future__ import annotations

import json

import pytest

from agentstream.agent_loop.loop import AgentLoop
from agentstream.wire import codec
from agentstream.wire.events import (
    CANCEL_BY_MAX_CHARS,
    CANCEL_REASON_MAX_CHARS,
    CancelMessage,
    CancelRequested,
    ToolJob,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.keys import CANCEL_FIELD, COMPACTION_FIELD, JOB_FIELD, TURN_FIELD, WAKE_FIELD
from agentstream_services.compaction.compactor import Compactor
from agentstream_services.delegation.delegator import Delegator
from agentstream_services.tool_worker.worker import ToolWorker
from tests.support import apps
from tests.support.inprocess import errors_of, events_of, replies_on

pytestmark = pytest.mark.integration


def turn_text(**fields: object) -> str:
    base = {"trace_id": "conv-a", "turn_id": "t1", "agent": "calc", "text": "What is 2 + 2?"}
    base.update(fields)
    return json.dumps(base)


async def reports(redis, keys) -> list[str]:
    """Every reason given for a refused turn: the replies' and the errors stream's."""
    return [r.reason or "" for r in await replies_on(redis, keys.replies)] + [
        e["error"] for e in await errors_of(redis, keys)
    ]


async def key_names(redis, namespace: str) -> list[str]:
    # SCAN, not KEYS: on a Redis Cluster it covers every node
    return [k.decode(errors="surrogateescape") async for k in redis.scan_iter(f"{namespace}*")]


# --- ids -------------------------------------------------------------------------------------

CONTROL = {
    "NUL": "\x00",
    "escape": "\x1b[31m",
    "newline": "\n",
    "DEL": "\x7f",
    "C1 NEL": "\x85",
    "zero-width space": "\u200b",
    "right-to-left override": "\u202e",
    "BOM": "\ufeff",
    "line separator": "\u2028",
}


@pytest.mark.parametrize("field", ["trace_id", "turn_id", "agent", "model"])
@pytest.mark.parametrize("name", list(CONTROL))
async def test_an_id_with_a_control_or_invisible_character_is_refused_and_names_no_key(
    store, redis, keys, namespace, field, name
):
    bad = f"ab{CONTROL[name]}cd"
    loop = AgentLoop(apps.app, store, {})
    await loop.on_turn("1-0", {TURN_FIELD: turn_text(**{field: bad}).encode()})
    said = await reports(redis, keys)
    assert len(said) == 1 and f"`$.{field}` holds U+{ord(CONTROL[name][0]):04X}" in said[0], said
    assert all(CONTROL[name][0] not in k for k in await key_names(redis, namespace)), "a key was named with it"
    if field in ("agent", "model"):  # the ids are sound: the turn fails in its own trace
        assert [type(e) for e in await events_of(store, "conv-a")] == [TurnFailed]
    else:
        assert await events_of(store, "conv-a") == []


async def test_a_cancel_with_a_control_character_in_an_id_is_reported_not_recorded(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    await store.append("conv-a", TurnInput(turn_id="t1", agent="calc", text="running"))
    for i, message in enumerate([{"trace_id": "conv-a\x00"}, {"trace_id": "conv-a", "turn_id": "t1\u202e"}]):
        await loop.on_cancel(f"{i + 1}-0", {CANCEL_FIELD: json.dumps(message).encode()})
    errors = await errors_of(redis, keys)
    assert [e["source"] for e in errors] == [keys.cancel, keys.cancel] and [e["entry"] for e in errors] == [
        "1-0",
        "2-0",
    ]
    assert "`$.trace_id` holds U+0000" in errors[0]["error"] and "`$.turn_id` holds U+202E" in errors[1]["error"]
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnInput]  # no cancel recorded


# --- reply streams ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [":", "::b7", ":b7:", ":\x00", ":b7\u2028"])
async def test_a_reply_stream_with_an_empty_or_invisible_part_is_refused(store, redis, keys, namespace, suffix):
    target = keys.replies + suffix
    loop = AgentLoop(apps.app, store, {})
    await loop.on_turn("1-0", {TURN_FIELD: turn_text(reply_to=target).encode()})
    (reply,) = await replies_on(redis, keys.replies)  # the refusal goes to the default stream
    assert reply.code == "bad_turn" and "$.reply_to" in reply.reason, reply.reason
    assert await redis.exists(target) == 0
    assert sorted(k for k in await key_names(redis, namespace) if "replies" in k) == [keys.replies]


# --- duplicate keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, key, where",
    [
        ('{"trace_id":"conv-a","turn_id":"t1","agent":"calc","agent":"lead","text":"hi"}', "agent", "$"),
        ('{"trace_id":"conv-a","turn_id":"t1","agent":"calc","text":"hi","text":"other"}', "text", "$"),
        (
            '{"trace_id":"conv-a","turn_id":"t1","agent":"calc","text":"hi","metadata":{"user":"u1","user":"u2"}}',
            "user",
            "$.metadata",
        ),
        (
            '{"trace_id":"conv-a","turn_id":"t1","agent":"calc","text":"hi","elements":[{"kind":"document","id":"d",'
            '"text":"x","id":"e"}]}',
            "id",
            "$.elements[0]",
        ),
    ],
    ids=["agent", "text", "metadata key", "element key"],
)
async def test_a_key_named_twice_is_refused_naming_it_and_where(store, redis, keys, payload, key, where):
    loop = AgentLoop(apps.app, store, {})
    await loop.on_turn("1-0", {TURN_FIELD: payload.encode()})
    (reply,) = await replies_on(redis, keys.replies)
    assert reply.code == "bad_turn" and f"names the key `{key}` twice in the object at `{where}`" in reply.reason, (
        reply.reason
    )
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnFailed]  # never entered as a turn


@pytest.mark.parametrize("key", ["trace_id", "turn_id", "reply_to"])
async def test_a_routing_key_named_twice_routes_nothing_to_either_value(store, redis, keys, namespace, key):
    values = {
        "trace_id": ("conv-a", "conv-b"),
        "turn_id": ("t1", "t2"),
        "reply_to": (f"{keys.replies}:x", f"{keys.replies}:y"),
    }[key]
    fields = {"trace_id": "conv-a", "turn_id": "t1", "agent": "calc", "text": "hi"}
    fields.pop(key, None)
    body = ",".join(f'"{k}":{json.dumps(v)}' for k, v in fields.items())
    payload = "{" + body + f',"{key}":{json.dumps(values[0])},"{key}":{json.dumps(values[1])}' + "}"
    loop = AgentLoop(apps.app, store, {})
    await loop.on_turn("1-0", {TURN_FIELD: payload.encode()})
    assert any(f"names the key `{key}` twice" in r for r in await reports(redis, keys))
    if key == "reply_to":
        assert await redis.exists(*values) == 0
        (reply,) = await replies_on(redis, keys.replies)  # to the default stream: which one was meant is unknown
        assert reply.code == "bad_turn"
    else:  # neither conversation (or turn) gets a failure written into it: the entry is reported
        assert await events_of(store, "conv-a") == [] and await events_of(store, "conv-b") == []
        assert (await errors_of(redis, keys))[0]["source"] == keys.turns


async def test_a_cancel_with_a_key_named_twice_is_reported(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    await store.append("conv-a", TurnInput(turn_id="t1", agent="calc", text="running"))
    await loop.on_cancel("7-0", {CANCEL_FIELD: b'{"trace_id":"conv-b","trace_id":"conv-a"}'})
    (error,) = await errors_of(redis, keys)
    assert "names the key `trace_id` twice" in error["error"] and (error["source"], error["entry"]) == (
        keys.cancel,
        "7-0",
    )
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnInput]


@pytest.mark.parametrize("field, size", [("reason", 5_000_000), ("reason", 2001), ("by", 257)])
async def test_a_cancel_over_its_text_limits_is_reported_and_stores_nothing(store, redis, keys, field, size):
    """A cancel's ``by`` and ``reason`` are stored in the trace and echoed on the reply: over
    their limits the cancel is refused as malformed (naming the field, or the size limit of the
    whole message, AGENTSTREAM_MAX_TURN_BYTES, when it is over that), nothing is recorded."""
    loop = AgentLoop(apps.app, store, {})
    await store.append("conv-a", TurnInput(turn_id="t1", agent="calc", text="running"))
    message = {"trace_id": "conv-a", field: "R" * size}
    await loop.on_cancel("8-0", {CANCEL_FIELD: json.dumps(message).encode()})
    (error,) = await errors_of(redis, keys)
    # a message over the size limit is refused for its size first, as a turn or an approval is
    said = "the cancel message is 5,000,0" if size > 524_288 else f"$.{field}"
    assert said in error["error"] and (error["source"], error["entry"]) == (keys.cancel, "8-0"), error["error"]
    assert [type(e) for e in await events_of(store, "conv-a")] == [TurnInput]
    # at the limit it is a cancel like any other: recorded in the trace
    at_limit = {"trace_id": "conv-a", field: "R" * (CANCEL_BY_MAX_CHARS if field == "by" else CANCEL_REASON_MAX_CHARS)}
    await loop.on_cancel("9-0", {CANCEL_FIELD: json.dumps(at_limit).encode()})
    assert CancelRequested in [type(e) for e in await events_of(store, "conv-a")]


# --- text that is not Unicode ------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, marker, says",
    [
        (b'"text":"ab\\ud83d"', b"\\ud83d", "lone high UTF-16 surrogate"),  # msgspec: "Input data was truncated"
        (b'"text":"ab\\ud83dcd"', b"\\ud83d", "lone high UTF-16 surrogate"),
        (b'"text":"ab\\ud83d\\u0041"', b"\\ud83d", "lone high UTF-16 surrogate"),
        (b'"text":"ab\\ude00"', b"\\ude00", "lone low UTF-16 surrogate"),
        (b'"text":"ab\xed\xa0\x80"', b"\xed", "are not UTF-8"),  # a surrogate encoded as bytes
        (b'"text":"ab\xff"', b"\xff", "are not UTF-8"),
        (b'"text":"hi","metadata":{"k":"\\udbff"}', b"\\udbff", "lone high UTF-16 surrogate"),
    ],
)
async def test_text_that_is_not_unicode_is_refused_saying_what_and_where(store, redis, keys, raw, marker, says):
    payload = b'{"trace_id":"conv-a","turn_id":"t1","agent":"calc",' + raw + b"}"
    loop = AgentLoop(apps.app, store, {})
    await loop.on_turn("1-0", {TURN_FIELD: payload})
    (reply,) = await replies_on(redis, keys.replies)
    assert reply.code == "bad_turn" and says in reply.reason and "truncated" not in reply.reason, reply.reason
    assert f"at byte {payload.index(marker)}" in reply.reason, reply.reason
    key = "k" if b"metadata" in raw else "text"
    assert f"(in the value of key `{key}`)" in reply.reason, reply.reason


async def test_a_cancel_that_is_not_unicode_is_reported_saying_what_and_where(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    await loop.on_cancel("3-0", {CANCEL_FIELD: b'{"trace_id":"conv-\\ud800"}'})
    (error,) = await errors_of(redis, keys)
    assert (
        "lone high UTF-16 surrogate" in error["error"]
        and "at byte 18 (in the value of key `trace_id`)" in error["error"]
    )
    assert "truncated" not in error["error"] and (error["source"], error["entry"]) == (keys.cancel, "3-0")


# --- every malformed work entry names its stream and entry -----------------------------------------


async def test_every_malformed_work_entry_is_reported_with_its_stream_and_entry(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    worker = ToolWorker(apps.app, store)
    await loop.on_wake("1-0", {WAKE_FIELD: b'{"trace_id":'})
    await loop.on_cancel("2-0", {CANCEL_FIELD: b"[]"})
    await loop.on_cancel("3-0", {b"not-cancel": b"1"})
    await worker.on_job("4-0", {JOB_FIELD: b'{"trace_id":1}'}, stream=keys.tools("default"))
    await Compactor(apps.app, store, {}).on_job("5-0", {COMPACTION_FIELD: b"nope"})
    delegator = Delegator(apps.app, store)
    await delegator.on_delegation("6-0", {JOB_FIELD: b"{}"})
    await delegator.on_child_ended("7-0", {b"x": b"y"})
    await loop.on_turn("8-0", {TURN_FIELD: b"{"})
    errors = await errors_of(redis, keys)
    where = [(e.get("source"), e.get("entry")) for e in errors]
    assert where == [
        (keys.wake, "1-0"),
        (keys.cancel, "2-0"),
        (keys.cancel, "3-0"),
        (keys.tools("default"), "4-0"),
        (keys.compactions, "5-0"),
        (keys.delegations, "6-0"),
        (keys.child_endings, "7-0"),
        (keys.turns, "8-0"),
    ], errors


def test_well_formed_messages_still_read():
    """What the rules leave alone: escaped backslashes before a `u`, surrogate pairs, ids with
    spaces and non-Latin letters, a reply stream under the replies prefix."""
    from agentstream.wire import checks as wire
    from agentstream.wire.keys import Keys

    keys = Keys("ns")
    turn = wire.validate_turn(
        turn_text(trace_id="conv é 中", text="a \\ud83d is text; 😀 \ud83d\ude00", reply_to="ns:replies:b7"), keys=keys
    )
    assert turn.trace_id == "conv é 中" and turn.reply_to == "ns:replies:b7"
    assert (
        codec.decode_turn(b'{"trace_id":"c","turn_id":"t","agent":"calc","text":"\\\\ud800 \\ud83d\\ude00"}').text
        == "\\ud800 😀"
    )
    assert codec.decode_cancel(codec.encode(CancelMessage(trace_id="c", turn_id="t"))).trace_id == "c"
    assert (
        codec.decode_job(
            codec.encode(ToolJob(trace_id="c", turn_id="t", call_id="x", name="n", arguments="{}"))
        ).call_id
        == "x"
    )
