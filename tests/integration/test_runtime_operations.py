"""The runtime's named operations that the services call instead of building pipelines and
scripts themselves (issue 17), on a real Redis (and on the cluster pass: the entries go to
streams of other hash slots than the trace's key hash).

- a turn's end and its reply are marked sent only once every XADD went through;
- the replies a trace owes are published and marked in one round trip, and unmarked again when
  a write failed;
- a step's entries go out with the lease's release, and their entry ids come back in order;
- a child trace is admitted under its root's descendant limit once, even when delegations race;
- a stream's consumer groups are named (what ``agentstream dev`` waits for), and a stream is
  caught up when no group has an entry waiting or pending (the testing kit's idleness);
- the replies are read after an entry id.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from agentstream.runtime import operations
from agentstream.wire import codec
from agentstream.wire.events import Reply
from agentstream.wire.keys import JOB_FIELD, REPLY_FIELD

pytestmark = pytest.mark.integration


async def _ids(redis, stream: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in await redis.xrange(stream)]


async def test_a_turn_end_is_marked_sent_only_after_its_writes(redis, keys, store):
    await redis.set(keys.replies, b"not a stream")  # the reply's XADD gets WRONGTYPE
    entries = [(keys.cancel, {b"cancel": b"c"}), (keys.replies, {REPLY_FIELD: b"r"})]
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await operations.publish_turn_end(redis, keys, "tr", "t1", entries)
    assert not await store.has_key("tr", "reply:t1")
    await redis.delete(keys.replies)
    await operations.publish_turn_end(redis, keys, "tr", "t1", entries)
    assert await store.has_key("tr", "reply:t1")
    assert [f for _, f in await redis.xrange(keys.replies)] == [{REPLY_FIELD: b"r"}]


async def test_owed_replies_are_unmarked_again_when_a_write_failed(redis, keys, store):
    bad = f"{keys.namespace}:elsewhere"
    await redis.set(bad, b"not a stream")
    # what a turn's end tells another stream (not a reply: nowhere else to send it) fails
    entries = [(keys.replies, {REPLY_FIELD: b"r1"}), (bad, {b"cancel": b"c2"})]
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await operations.publish_replies(redis, keys, "tr", entries, ["reply:t1", "reply:t2"])
    assert await operations.replies_sent(redis, keys, "tr", ["t1", "t2"]) == [False, False]
    await redis.delete(bad)
    await operations.publish_replies(redis, keys, "tr", entries, ["reply:t1", "reply:t2"])
    assert await operations.replies_sent(redis, keys, "tr", ["t1", "t2"]) == [True, True]
    # nothing owed: nothing sent
    unused = f"{keys.namespace}:unused"
    await operations.publish_replies(redis, keys, "tr", [(unused, {REPLY_FIELD: b"x"})], [])
    assert not await redis.exists(unused)


async def test_a_reply_its_own_stream_refuses_goes_to_the_default_stream_and_is_reported(redis, keys, store):
    mine = f"{keys.replies}:backend-3"
    await redis.set(mine, b"not a stream")  # passes the reply_to check; only the write tells
    reply = codec.encode(Reply(trace_id="tr", turn_id="t1", status="ended", answer="42"))
    await operations.publish_replies(redis, keys, "tr", [(mine, {REPLY_FIELD: reply})], ["reply:t1"])
    assert await operations.replies_sent(redis, keys, "tr", ["t1"]) == [True]
    assert [f for _, f in await redis.xrange(keys.replies)] == [{REPLY_FIELD: reply}]
    ((_, report),) = await redis.xrange(keys.errors)
    assert mine.encode() in report[b"error"] and b"WRONGTYPE" in report[b"error"] and report[b"turn_id"] == b"t1"
    # the same on the other paths: a turn's end, and a reply sent again
    await operations.publish_turn_end(redis, keys, "tr", "t2", [(mine, {REPLY_FIELD: reply})])
    await operations.send_reply(
        redis, keys, "tr", "t3", mine, Reply(trace_id="tr", turn_id="t3", status="ended", answer="7")
    )
    assert await operations.replies_sent(redis, keys, "tr", ["t2", "t3"]) == [True, True]
    assert await redis.xlen(keys.replies) == 3 and await redis.xlen(keys.errors) == 3
    # a reply whose default stream itself refuses has nowhere else to go: raised, not marked
    await redis.delete(keys.replies)
    await redis.set(keys.replies, b"not a stream either")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await operations.publish_replies(redis, keys, "tr", [(mine, {REPLY_FIELD: reply})], ["reply:t4"])
    assert await operations.replies_sent(redis, keys, "tr", ["t4"]) == [False]


async def test_a_steps_entries_go_out_with_the_release_and_their_ids_come_back(redis, keys, store):
    token = await store.acquire_lease("tr", ttl_ms=10_000)
    jobs = keys.tools_for("default", "tr")
    entries = [(keys.replies, {REPLY_FIELD: b"r"}), (jobs, {JOB_FIELD: b"j1"}), (jobs, {JOB_FIELD: b"j2"})]
    outcome, ids = await store.publish_and_release("tr", token, entries, marks=["reply:t1", "jobs:t2:1"])
    assert outcome == "released"
    assert ids == [*await _ids(redis, keys.replies), *await _ids(redis, jobs)]
    assert all(isinstance(i, str) for i in ids)
    assert await store.has_key("tr", "reply:t1") and await store.has_key("tr", "jobs:t2:1")
    assert not await redis.exists(keys.lease("tr"))

    # a write that fails: the marks are taken back and the error raised
    token = await store.acquire_lease("tr2", ttl_ms=10_000)
    await redis.set(keys.replies, b"not a stream")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await store.publish_and_release("tr2", token, [(keys.replies, {REPLY_FIELD: b"r"})], marks=["reply:t1"])
    assert not await store.has_key("tr2", "reply:t1")


async def test_children_are_admitted_under_the_roots_limit_once_even_when_racing(redis, keys):
    admitted = await asyncio.gather(*(operations.admit_child(redis, keys, "root", f"child-{i}", 5) for i in range(20)))
    assert sum(admitted) == 5
    first = [f"child-{i}" for i, ok in enumerate(admitted) if ok]
    assert sorted(m.decode() for m in await redis.smembers(keys.descendants("root"))) == sorted(first)
    # a delegation job delivered again opens the same child: still admitted, though the root is full
    assert await operations.admit_child(redis, keys, "root", first[0], 5)
    assert not await operations.admit_child(redis, keys, "root", "child-new", 5)
    # another root has its own count
    assert await operations.admit_child(redis, keys, "other", "child-new", 5)


async def test_group_names_are_the_streams_consumer_groups(redis, keys):
    stream = keys.for_trace(keys.compactions, "tr")
    with pytest.raises(ResponseError):  # no such stream
        await operations.group_names(redis, stream)
    await redis.xgroup_create(stream, "agent-loop", id="0", mkstream=True)
    await redis.xgroup_create(stream, "other", id="0")
    assert await operations.group_names(redis, stream) == {"agent-loop", "other"}


async def test_groups_caught_up_sees_waiting_and_pending_entries(redis, keys):
    stream = keys.for_trace(keys.compactions, "tr")
    with pytest.raises(ResponseError):
        await operations.groups_caught_up(redis, stream)
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    assert await operations.groups_caught_up(redis, stream)
    await redis.xadd(stream, {b"x": b"1"})
    assert not await operations.groups_caught_up(redis, stream)  # waiting for the group
    ((_, [(entry_id, _)]),) = await redis.xreadgroup("g", "c", {stream: ">"}, count=1)
    assert not await operations.groups_caught_up(redis, stream)  # delivered, not acknowledged
    await redis.xack(stream, "g", entry_id)
    assert await operations.groups_caught_up(redis, stream)


async def test_replies_are_read_after_an_entry_id(redis, keys):
    from agentstream.wire import codec
    from agentstream.wire.events import Reply

    assert await operations.read_replies(redis, keys, "0-0", block_ms=10) == []
    first = Reply(trace_id="tr", turn_id="t1", status="ended", answer="one")
    second = Reply(trace_id="tr", turn_id="t2", status="ended", answer="two")
    one = (await redis.xadd(keys.replies, {REPLY_FIELD: codec.encode(first)})).decode()
    await redis.xadd(keys.replies, {REPLY_FIELD: codec.encode(second)})
    got = await operations.read_replies(redis, keys, "0-0", block_ms=10)
    assert [r.turn_id for _, r in got] == ["t1", "t2"] and got[0][0] == one
    assert [r.turn_id for _, r in await operations.read_replies(redis, keys, one, block_ms=10)] == ["t2"]
