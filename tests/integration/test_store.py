"""The trace store on a real Redis."""

import asyncio

import pytest
from redis.exceptions import ResponseError

from agentstream.errors import StaleLeaseError
from agentstream.runtime.store import Publication
from agentstream.wire.events import ToolOutput, TurnEnded, TurnInput
from tests.support.redis_server import cluster_only, single_node_only

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
    tags = {
        k[k.index("{") : k.index("}") + 1]
        for k in (keys.trace("x"), keys.trace_keys("x"), keys.lease("x"), keys.dirty("x"))
    }
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
    # written under the oldest version that reads them (codec.entry_version): nothing here needs 3
    assert TRACE_SCHEMA_VERSION == 3 and [f[b"v"] for _, f in raw] == [b"1", b"2", b"2"]
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
    appended = await store.append(
        "h3", ToolOutput(turn_id="t", call_id="c1", name="x", text="ok"), hints=[hint], failed_hints=unsent
    )
    assert appended.created
    assert unsent == [hint]  # it went out before the append ran: the caller sends it again


async def test_the_steps_scripts_survive_a_server_that_lost_them(store, redis):
    # take, admit and apply send EVALSHA themselves (not through redis-py's script call): a
    # server that lost its scripts (a restart, SCRIPT FLUSH) has them loaded again
    await store.append("h4", ToolOutput(turn_id="t", call_id="c0", name="x", text="ok"))
    await redis.script_flush()
    taken = await store.take("h4", ttl_ms=5000, after=None)
    assert taken.token is not None and taken.read is not None and len(taken.read.entries) == 1
    await redis.script_flush()
    applied = await store.apply(
        "h4",
        [ToolOutput(turn_id="t", call_id="c1", name="x", text="ok")],
        fence=taken.token,
        after=taken.read.entries[-1][0],
    )
    assert applied.appended[0] is not None and applied.appended[0].created
    await redis.script_flush()
    admitted = await store.admit_turn(
        "h5", TurnInput(turn_id="u1", agent="a", text="hi"), "1-0", take=False, ttl_ms=5000, after=None
    )
    assert admitted.created


# --- a model output's append with its jobs' publication and the release (one Redis server) -------


_one_server = single_node_only(
    "the publication writes keys of several hash slots in one script; a cluster publishes after the append"
)


def _output(turn_id: str = "t1", calls: int = 2):
    from agentstream.wire.events import ModelOutput, ToolCall

    return ModelOutput(
        turn_id=turn_id,
        step=0,
        stop_reason="tool_calls",
        provider="openai",
        model="m",
        endpoint="default",
        tool_calls=tuple(ToolCall(id=f"{turn_id}-c{n}", name="f", arguments="{}") for n in range(calls)),
    )


async def _started(store, trace_id: str = "tp"):
    """A trace with a turn, its lease taken → (token, the last entry id)."""
    first = await store.append(trace_id, TurnInput(turn_id="t1", agent="a", text="hi"))
    token = await store.acquire_lease(trace_id, ttl_ms=10_000)
    return token, first.entry_id


def _jobs(keys, output, trace_id: str = "tp"):
    stream = keys.tools_for("default", trace_id)
    return [(call.id, stream, b"job", f'{{"call_id":"{call.id}"}}'.encode()) for call in output.tool_calls]


async def _publish(store, keys, output, token, after, trace_id: str = "tp", jobs=None, then=(), marks=("jobs:t1:0",)):
    from agentstream.runtime.watchdog import awaiting_key

    applied = await store.apply(
        trace_id,
        [output],
        then=list(then),
        fence=token,
        after=after,
        publication=Publication(
            jobs if jobs is not None else _jobs(keys, output, trace_id),
            list(marks),
            awaiting_key(keys, keys.partition(trace_id)),
        ),
    )
    appended, read, outcome, entry_ids = applied.appended, applied.read, applied.outcome, applied.entry_ids
    return (appended[0] if not then else appended), read, outcome, entry_ids


async def _published(
    redis, keys, trace_id: str = "tp"
) -> tuple[list, bytes | None, bytes | None, float | None, bytes | None]:
    """(the job entries, the jobs marker, the awaited record, the trace's awaiting score, the lease)."""
    from agentstream.runtime.watchdog import awaiting_key

    jobs = await redis.xrange(keys.tools_for("default", trace_id))
    marker, awaited = await redis.hmget(keys.trace_keys(trace_id), ["jobs:t1:0", "awaited"])
    score = await redis.zscore(awaiting_key(keys, keys.partition(trace_id)), trace_id)
    return jobs, marker, awaited, score, await redis.get(keys.lease(trace_id))


@_one_server
async def test_an_output_its_jobs_their_watchdog_record_and_the_release_go_in_one_script(store, redis, keys):
    import json

    token, after = await _started(store)
    output = _output()
    appended, read, outcome, entry_ids = await _publish(store, keys, output, token, after)
    assert appended.created and outcome == "released" and len(entry_ids) == 2
    assert [e for _, e in read.entries] == [output]  # what came after `after`: the output
    jobs, marker, awaited, score, lease = await _published(redis, keys)
    assert [j[0].decode() for j in jobs] == entry_ids and [j[1] for j in jobs] == [
        {b"job": b'{"call_id":"t1-c0"}'},
        {b"job": b'{"call_id":"t1-c1"}'},
    ]
    # what record_jobs writes: [[turn, call, stream, entry id]], read by the watchdog
    stream = keys.tools_for("default", "tp")
    assert marker == b"1" and json.loads(awaited) == [
        ["t1", "t1-c0", stream, entry_ids[0]],
        ["t1", "t1-c1", stream, entry_ids[1]],
    ]
    assert score is not None and lease is None
    assert [e for _, e in await store.read("tp")][-1] == output


@_one_server
async def test_jobs_do_not_go_out_with_an_output_when_another_entry_came_first(store, redis, keys):
    token, after = await _started(store)
    await store.append("tp", TurnInput(turn_id="t2", agent="a", text="meanwhile"))  # a step decided without it
    appended, read, outcome, entry_ids = await _publish(store, keys, _output(), token, after)
    assert appended.created and outcome is None and entry_ids == []
    assert len(read.entries) == 2  # the newcomer and the output: the step loop decides again from them
    jobs, marker, awaited, score, lease = await _published(redis, keys)
    assert jobs == [] and marker is None and awaited is None and score is None and int(lease) == token


@_one_server
async def test_jobs_do_not_go_out_with_an_output_that_was_there_already(store, redis, keys):
    token, after = await _started(store)
    output = _output()
    again = await store.append("tp", output, fence=token)  # an earlier try appended it, then lost its answer
    appended, _read, outcome, _ids = await _publish(store, keys, output, token, after)
    assert not appended.created and appended.entry_id == again.entry_id and outcome is None
    jobs, marker, _awaited, _score, lease = await _published(redis, keys)
    assert jobs == [] and marker is None and int(lease) == token


@_one_server
async def test_a_fenced_off_step_neither_appends_nor_publishes(store, redis, keys):
    token, after = await _started(store)
    await redis.delete(keys.lease("tp"))
    newer = await store.acquire_lease("tp", ttl_ms=10_000)  # the lease expired and another worker took it
    with pytest.raises(StaleLeaseError):
        await _publish(store, keys, _output(), token, after)
    jobs, marker, _awaited, _score, lease = await _published(redis, keys)
    assert jobs == [] and marker is None and int(lease) == newer
    assert len(await store.read("tp")) == 1


@_one_server
async def test_a_hint_that_came_while_held_keeps_the_lease_after_the_jobs_went_out(store, redis, keys):
    token, after = await _started(store)
    await store.mark_dirty("tp", ttl_ms=10_000)
    _appended, _read, outcome, entry_ids = await _publish(store, keys, _output(), token, after)
    assert outcome == "dirty" and len(entry_ids) == 2
    jobs, marker, _awaited, _score, lease = await _published(redis, keys)
    assert len(jobs) == 2 and marker == b"1" and int(lease) == token  # kept: look again, then release
    assert await redis.get(keys.dirty("tp")) is None
    assert await store.release_lease("tp", token) == "released"


@_one_server
@pytest.mark.parametrize("hostile", ["first job stream", "second job stream", "awaiting set"])
async def test_a_key_of_another_type_leaves_the_whole_publication_to_the_step_loop(store, redis, keys, hostile):
    """Every stream and the awaiting set are checked before the first XADD: a step whose second
    queue refuses its job publishes none (the step loop's own publication then reports the
    refusal), so no job goes out twice (trial: the first queue's job was published by the script
    and again by the step loop)."""
    from agentstream.runtime.watchdog import awaiting_key

    token, after = await _started(store)
    output = _output()
    first, second = keys.tools_for("default", "tp"), keys.tools_for("other", "tp")
    jobs = [("t1-c0", first, b"job", b"0"), ("t1-c1", second, b"job", b"1")]
    target = {
        "first job stream": first,
        "second job stream": second,
        "awaiting set": awaiting_key(keys, keys.partition("tp")),
    }[hostile]
    await redis.set(target, "hostile")  # a client wrote over it
    appended, _read, outcome, entry_ids = await _publish(store, keys, output, token, after, jobs=jobs)
    assert appended.created and outcome is None and entry_ids == []
    for stream in (first, second):
        if stream != target:
            assert await redis.xlen(stream) == 0  # nothing published, to be published once by the step loop
    marker, awaited = await redis.hmget(keys.trace_keys("tp"), ["jobs:t1:0", "awaited"])
    assert (
        marker is None and awaited is None and int(await redis.get(keys.lease("tp"))) == token
    )  # nothing of the release
    assert [e for _, e in await store.read("tp")][
        -1
    ] == output  # the output is in; the step loop publishes (and reports)


@_one_server
async def test_a_work_stream_of_another_type_is_left_to_the_consumer_to_acknowledge(store, redis, keys):
    from agentstream.runtime.watchdog import awaiting_key

    token, after = await _started(store)
    stream = f"{keys.namespace}:work"
    await redis.set(stream, "hostile")
    output = _output()
    applied = await store.apply(
        "tp",
        [output],
        fence=token,
        after=after,
        publication=Publication(
            _jobs(keys, output),
            ["jobs:t1:0"],
            awaiting_key(keys, keys.partition("tp")),
            ack=(stream, "g", f"{stream}:attempts:{{{stream}}}:g", "1-0"),
        ),
    )
    outcome, acked = applied.outcome, applied.acknowledged
    assert outcome == "released" and not acked  # published and released; the consumer's own ack reports the stream


def _answer():
    from agentstream.wire.events import ModelOutput

    return ModelOutput(turn_id="t1", step=1, content="done", provider="openai", model="m", endpoint="default")


@_one_server
async def test_an_answer_its_turns_ending_and_the_reply_go_in_one_script(store, redis, keys):
    token, after = await _started(store)
    ending = TurnEnded(turn_id="t1", answer="done")
    reply = [("", keys.replies, b"reply", b'{"turn_id":"t1"}')]
    appended, read, outcome, entry_ids = await _publish(
        store, keys, _answer(), token, after, jobs=reply, then=[ending], marks=["reply:t1"]
    )
    assert [a.created for a in appended] == [True, True] and outcome == "released"
    assert [e for _, e in read.entries] == [_answer(), ending]
    assert [(i.decode(), f) for i, f in await redis.xrange(keys.replies)] == [
        (entry_ids[0], {b"reply": b'{"turn_id":"t1"}'})
    ]
    marker, awaited = await redis.hmget(keys.trace_keys("tp"), ["reply:t1", "awaited"])
    assert marker == b"1" and awaited is None  # a reply is no tool job: no watchdog record
    assert await redis.get(keys.lease("tp")) is None


@_one_server
async def test_no_reply_goes_out_when_the_turns_ending_was_left_out(store, redis, keys):
    token, after = await _started(store)
    await store.append("tp", TurnInput(turn_id="t2", agent="a", text="meanwhile"))
    reply = [("", keys.replies, b"reply", b'{"turn_id":"t1"}')]
    appended, _read, outcome, _ids = await _publish(
        store,
        keys,
        _answer(),
        token,
        after,
        jobs=reply,
        then=[TurnEnded(turn_id="t1", answer="done")],
        marks=["reply:t1"],
    )
    assert appended[0].created and appended[1] is None and outcome is None  # the step decides again
    assert await redis.xlen(keys.replies) == 0 and await redis.hget(keys.trace_keys("tp"), "reply:t1") is None
    assert int(await redis.get(keys.lease("tp"))) == token


async def _work_entry(redis, keys):
    """A work entry read by a consumer of group g, with an attempts counter → its ack arguments."""
    stream, attempts = f"{keys.namespace}:work", f"{keys.namespace}:work:attempts:{{{keys.namespace}:work}}:g"
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    entry_id = (await redis.xadd(stream, {b"x": b"1"})).decode()
    await redis.xreadgroup("g", "w1", {stream: ">"})
    await redis.hset(attempts, mapping={entry_id: 2, f"{entry_id}:error": "earlier"})
    return stream, "g", attempts, entry_id


@_one_server
@pytest.mark.parametrize("dirty", [False, True])
async def test_the_work_entry_is_acknowledged_with_a_release_not_with_a_kept_lease(store, redis, keys, dirty):
    from agentstream.runtime.watchdog import awaiting_key

    token, after = await _started(store)
    ack = await _work_entry(redis, keys)
    if dirty:
        await store.mark_dirty("tp", ttl_ms=10_000)
    output = _output()
    applied = await store.apply(
        "tp",
        [output],
        fence=token,
        after=after,
        publication=Publication(_jobs(keys, output), ["jobs:t1:0"], awaiting_key(keys, keys.partition("tp")), ack=ack),
    )
    outcome, acked = applied.outcome, applied.acknowledged
    assert acked is (not dirty)
    pending = (await redis.xpending(ack[0], "g"))["pending"]
    counters = await redis.hlen(ack[2])
    if dirty:  # the step loop looks again: its work is not done
        assert outcome == "dirty" and pending == 1 and counters == 2
    else:
        assert outcome == "released" and pending == 0 and counters == 0


@_one_server
async def test_the_work_entry_is_not_acknowledged_when_nothing_was_published(store, redis, keys):
    from agentstream.runtime.watchdog import awaiting_key

    token, after = await _started(store)
    ack = await _work_entry(redis, keys)
    await store.append("tp", TurnInput(turn_id="t2", agent="a", text="meanwhile"))
    output = _output()
    applied = await store.apply(
        "tp",
        [output],
        fence=token,
        after=after,
        publication=Publication(_jobs(keys, output), ["jobs:t1:0"], awaiting_key(keys, keys.partition("tp")), ack=ack),
    )
    outcome, acked = applied.outcome, applied.acknowledged
    assert (
        outcome is None
        and not acked
        and (await redis.xpending(ack[0], "g"))["pending"] == 1
        and await redis.hlen(ack[2]) == 2
    )


async def test_a_step_without_a_publication_appends_reads_back_and_keeps_the_lease(store, redis, keys):
    # the same script as a publishing step's (lua/append.lua), its publication part left out
    token, after = await _started(store)
    output = _output()
    applied = await store.apply("tp", [output], fence=token, after=after)
    assert [a.created for a in applied.appended] == [True] and [e for _, e in applied.read.entries] == [output]
    assert applied.outcome is None and applied.entry_ids == [] and not applied.acknowledged
    assert int(await redis.get(keys.lease("tp"))) == token
    assert await redis.hget(keys.trace_keys("tp"), "call:t1-c0") is not None  # its calls marked as it is appended
    again = await store.apply("tp", [output], fence=token, after=after)
    assert not again.appended[0].created and again.appended[0].entry_id == applied.appended[0].entry_id


async def test_a_fenced_off_step_publishes_nothing(store, redis, keys):
    token, after = await _started(store)
    await redis.set(keys.lease("tp"), str(token + 1))  # another worker's lease now
    output = _output()
    publication = Publication(_jobs(keys, output), ["jobs:t1:0"], "unused") if store.one_server else None
    with pytest.raises(StaleLeaseError):
        await store.apply("tp", [output], fence=token, after=after, publication=publication)
    assert await redis.xlen(keys.tools_for("default", "tp")) == 0 and len(await store.read("tp")) == 1


@cluster_only("a publication spans hash slots: refused on a cluster")
async def test_a_publication_with_the_append_is_refused_on_a_cluster(store, redis, keys):
    token, after = await _started(store)
    output = _output()
    with pytest.raises(ValueError, match="one Redis server"):
        await store.apply(
            "tp", [output], fence=token, after=after, publication=Publication(_jobs(keys, output), [], "unused")
        )
    assert len(await store.read("tp")) == 1  # nothing appended
