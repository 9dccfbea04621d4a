"""The trace store on a real Redis."""

import asyncio

import pytest

from agentstream.errors import StaleLeaseError
from agentstream.wire.events import ToolOutput, TurnEnded, TurnInput

pytestmark = pytest.mark.integration


async def test_append_is_once_only_by_key(store):
    turn = TurnInput(turn_id="t1", agent="a", text="hi")
    first = await store.append("tr", turn)
    again = await store.append("tr", TurnInput(turn_id="t1", agent="a", text="different"))
    assert first.created and not again.created and again.entry_id == first.entry_id
    events = await store.read("tr")
    assert [e for _, e in events] == [turn]


async def test_concurrent_appends_of_one_result_record_it_once(store):
    results = [ToolOutput(turn_id="t", call_id="c1", name="f", text=str(i)) for i in range(20)]
    outcomes = await asyncio.gather(*(store.append("tr", r) for r in results))
    assert sum(o.created for o in outcomes) == 1
    assert len(await store.read("tr")) == 1


async def test_fenced_append_needs_the_current_lease(store):
    token = await store.acquire_lease("tr", ttl_ms=10_000)
    assert token is not None
    assert await store.acquire_lease("tr", ttl_ms=10_000) is None
    await store.append("tr", TurnInput(turn_id="t1", agent="a", text="x"), fence=token)
    # the lease expires and another worker takes it: the old holder is fenced off
    await store.redis.delete(store.keys.lease("tr"))
    newer = await store.acquire_lease("tr", ttl_ms=10_000)
    assert newer is not None and newer > token
    with pytest.raises(StaleLeaseError, match="another worker"):
        await store.append("tr", TurnEnded(turn_id="t1", answer="x"), fence=token)
    assert len(await store.read("tr")) == 1


async def test_release_reports_hints_that_came_while_held(store):
    token = await store.acquire_lease("tr", ttl_ms=10_000)
    await store.mark_dirty("tr", ttl_ms=10_000)
    assert await store.release_lease("tr", token) == "dirty"
    assert await store.release_lease("tr", token) == "released"
    assert await store.release_lease("tr", token) == "lost"


async def test_follow_yields_appends_as_they_happen(store):
    got = []
    stop = asyncio.Event()

    async def reader():
        async for _, event in store.follow("tr", block_ms=100, stop=stop):
            got.append(event)
            if len(got) == 2:
                return

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.05)
    await store.append("tr", TurnInput(turn_id="t1", agent="a", text="x"))
    await store.append("tr", TurnEnded(turn_id="t1", answer="y"))
    await asyncio.wait_for(task, 5)
    assert [type(e).__name__ for e in got] == ["TurnInput", "TurnEnded"]


async def test_keys_of_one_trace_share_a_hash_tag(keys):
    tags = {k[k.index("{") : k.index("}") + 1] for k in (keys.trace("x"), keys.trace_keys("x"), keys.lease("x"), keys.dirty("x"))}
    assert tags == {"{x}"}


async def test_a_trace_that_mixes_schema_versions_reads_whole(store, redis, keys):
    """Entries written by schema version 1 (before ``tools_offered``) and by the current version
    in one trace: the store reads them all (each entry carries its own version)."""
    from agentstream.wire import codec
    from agentstream.wire.events import TRACE_SCHEMA_VERSION, ToolsOffered

    old = TurnInput(turn_id="t1", agent="a", text="written long ago")
    await redis.xadd(keys.trace("mixed"), {b"v": b"1", b"e": codec.encode(old), b"k": b"turn:t1"})
    offered = ToolsOffered(turn_id="t2", step=0, agent="a")
    await store.append("mixed", TurnInput(turn_id="t2", agent="a", text="now"))
    await store.append("mixed", offered)
    raw = await redis.xrange(keys.trace("mixed"))
    assert [f[b"v"] for _, f in raw] == [b"1", str(TRACE_SCHEMA_VERSION).encode(), str(TRACE_SCHEMA_VERSION).encode()]
    assert [e for _, e in await store.read("mixed")] == [old, TurnInput(turn_id="t2", agent="a", text="now"), offered]


async def test_a_hint_goes_out_with_its_append_and_with_a_repeat_that_appends_nothing(store, redis, keys):
    # the order (the script, then the hint, in one round trip) is checked by
    # test_step_cost.py::test_a_tool_result_and_its_wake_up_go_to_redis_in_one_round_trip
    from agentstream.runtime.operations import wake_entry

    await store.append("h1", TurnInput(turn_id="t", agent="a", text="hi"))  # the script is loaded
    result = ToolOutput(turn_id="t", call_id="c1", name="x", text="ok")
    appended = await store.append(trace_id="h1", event=result, hints=[wake_entry(keys, "h1", "result:c1")])
    assert appended.created
    assert len(await redis.xrange(keys.wake_for("h1"))) == 1
    # a repeat appends nothing and still sends its hint (a hint is never state)
    again = await store.append(trace_id="h1", event=result, hints=[wake_entry(keys, "h1", "result:c1")])
    assert not again.created and again.entry_id == appended.entry_id
    assert len(await redis.xrange(keys.wake_for("h1"))) == 2


async def test_a_hint_its_stream_refuses_does_not_undo_the_append(store, redis, keys):
    from redis.exceptions import ResponseError

    from agentstream.runtime.operations import wake_entry

    await redis.set(keys.wake_for("h2"), "not a stream")  # a careless client
    hint = wake_entry(keys, "h2", "result:c1")
    unsent: list = []
    first = ToolOutput(turn_id="t", call_id="c1", name="x", text="ok")
    assert (await store.append("h2", first, hints=[hint], failed_hints=unsent)).created
    assert unsent == [hint]
    with pytest.raises(ResponseError, match="WRONGTYPE"):  # without a list to take it, the error is raised
        await store.append("h2", ToolOutput(turn_id="t", call_id="c2", name="x", text="ok"), hints=[hint])
    assert {e.call_id for _, e in await store.read("h2")} == {"c1", "c2"}  # both appended all the same


async def test_an_append_with_hints_survives_a_server_that_lost_its_scripts(store, redis, keys):
    from agentstream.runtime.operations import wake_entry

    await store.append("h3", ToolOutput(turn_id="t", call_id="c0", name="x", text="ok"))
    await redis.script_flush()
    unsent: list = []
    hint = wake_entry(keys, "h3", "result:c1")
    appended = await store.append("h3", ToolOutput(turn_id="t", call_id="c1", name="x", text="ok"), hints=[hint],
                                  failed_hints=unsent)
    assert appended.created
    assert unsent == [hint]  # it went out before the append ran: the caller sends it again
