"""Partitioned work streams on real Redis (a Redis Cluster on the cluster pass): a trace's turn,
tool jobs and wake-ups all go through its own partition, every partition is consumed, and the
CLI tells a backend where to publish (issue 12, item 4)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentstream.wire import codec
from agentstream.wire.events import TurnMessage
from agentstream.wire.keys import AGENT_LOOP_GROUP, JOB_FIELD, TOOL_WORKER_GROUP, TURN_FIELD, WAKE_FIELD, Keys
from tests.support import apps
from tests.support.inprocess import InProcess, errors_of, publish, wait_for, wait_reply
from tests.support.redis_server import cluster_only, sync_client
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration

PARTITIONS = 3


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
def pkeys(namespace) -> Keys:
    return Keys(namespace, PARTITIONS)


@pytest.fixture
async def services(redis_url, namespace, model, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    s = InProcess(apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_PARTITIONS": str(PARTITIONS)})
    yield s
    await s.stop_all()


def _traces_of_each_partition(keys: Keys, prefix: str = "") -> dict[int, str]:
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(keys.partition(f"{prefix}conv-{i}"), f"{prefix}conv-{i}")
        if len(found) == keys.partitions:
            return found
    raise AssertionError("no trace id found for some partition")


async def test_each_trace_goes_through_its_own_partition_and_every_partition_is_consumed(redis, pkeys, services):
    await services.start("p1", "agent-loop", "tool-worker")
    traces = _traces_of_each_partition(pkeys)
    for partition, trace in traces.items():
        await publish(redis, pkeys, trace_id=trace, turn_id=f"t-{partition}", agent="plan", text="do: work(1) work(2)")
    for partition in traces:
        reply = await wait_reply(redis, pkeys, f"t-{partition}")
        assert reply.status == "ended" and reply.answer == "Results: worked 1 ms | worked 2 ms"
    tools = pkeys.tools("default")
    owned = [pkeys.wake_owned(p, "p1") for p in range(pkeys.partitions)]  # p1's own wake-up streams
    for partition, trace in traces.items():
        streams = ((pkeys.partitions_of(tools), JOB_FIELD), ([*pkeys.partitions_of(pkeys.wake), *owned], WAKE_FIELD))
        for stream, field in streams:
            holders = {
                name
                for name in stream
                for _, f in await redis.xrange(name)
                if json.loads(f[field])["trace_id"] == trace
            }
            # its jobs: its partition only; its results' wake-ups: p1's own stream of its partition
            # (p1 published the jobs: sticky wake-ups), never another partition's
            assert holders == {stream[partition] if field == JOB_FIELD else owned[partition]}, (trace, holders)
    for name in pkeys.partitions_of(pkeys.turns) + pkeys.partitions_of(pkeys.wake) + owned:
        assert {g["name"] for g in await redis.xinfo_groups(name)} == {AGENT_LOOP_GROUP.encode()}

    async def all_consumed():
        # a turn's second wake-up may find its trace held by the first's step and wait for that
        # lease (a deferred hint): it is acknowledged a moment after the reply, not lost
        agent_loops = pkeys.partitions_of(pkeys.turns) + pkeys.partitions_of(pkeys.wake) + owned
        groups = [(n, AGENT_LOOP_GROUP) for n in agent_loops]
        groups += [(n, TOOL_WORKER_GROUP) for n in pkeys.partitions_of(tools)]
        pending = {n: (await redis.xpending(n, g))["pending"] for n, g in groups}
        return pending if not any(pending.values()) else None

    await wait_for(all_consumed, timeout_s=15, what="every partition's entries acknowledged")


async def test_a_turn_on_another_partition_is_still_answered(redis, pkeys, services):
    # a backend that computed the partition wrong loses nothing: partitions spread the load, the
    # trace's lease (not the partition) keeps its steps one at a time
    await services.start("p1", "agent-loop", "tool-worker")
    trace = next(t for t in (f"x-{i}" for i in range(100)) if pkeys.partition(t) != 0)
    turn = TurnMessage(trace_id=trace, turn_id="t1", agent="plan", text="do: work(1)")
    await redis.xadd(pkeys.turns, {TURN_FIELD: codec.encode(turn)})  # partition 0, not the trace's
    reply = await wait_reply(redis, pkeys, "t1")
    assert reply.status == "ended" and reply.answer == "Results: worked 1 ms"


async def test_backends_own_streams_work_over_partitions_and_a_cluster(redis, redis_url, namespace, model):
    """Issue 33 item 2 on the cluster pass: two backends' partitioned turns streams and cancel
    streams are consumed (each stream one key: no cross-slot command), each backend's turn is
    answered on its replies stream, its cancel is confined and signed with its name, and a turn
    into the other's conversation is refused on its own stream."""
    keys = Keys(namespace, PARTITIONS, ("b7", "b8"))
    env = {"AGENTSTREAM_PARTITIONS": str(PARTITIONS), "AGENTSTREAM_BACKENDS": "b7,b8"}
    services = InProcess(apps.app, redis_url, namespace, model.base_url, env=env)
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        traces = _traces_of_each_partition(keys, prefix="b7:")
        for partition, trace in traces.items():
            turn = TurnMessage(trace_id=trace, turn_id=f"t{partition}", agent="plan", text="do: work(1)")
            await redis.xadd(keys.backend_turns_for("b7", turn.trace_id), {TURN_FIELD: codec.encode(turn)})
        intruding = TurnMessage(trace_id="b8:secret", turn_id="x1", agent="plan", text="do: work(1)")
        await redis.xadd(keys.backend_turns_for("b7", intruding.trace_id), {TURN_FIELD: codec.encode(intruding)})
        await redis.xadd(keys.backend_cancel("b8"), {b"cancel": b'{"trace_id":"b7:other","by":"b7"}'})

        async def b7_replies():
            replies = [codec.decode_reply(f[b"reply"]) for _, f in await redis.xrange(keys.backend_replies("b7"))]
            got = {r.turn_id: r for r in replies}
            return got if len(got) == len(traces) + 1 else None

        got = await wait_for(b7_replies, timeout_s=30, what="backend b7's replies on its own stream")
        for partition in traces:
            assert got[f"t{partition}"].status == "ended", got[f"t{partition}"]
        assert (got["x1"].status, got["x1"].code) == ("failed", "forbidden")
        assert not await redis.exists(keys.trace("b8:secret"))
        streams = {keys.backend_turns_for("b7", t) for t in traces.values()}
        assert streams == set(keys.partitions_of(keys.backend_turns("b7")))  # every partition was used

        async def refused_cancel():
            return [e for e in await errors_of(redis, keys) if keys.backend_cancel("b8") in e["error"]] or None

        (report,) = await wait_for(refused_cancel, timeout_s=15, what="the refused cancel's report")
        assert "forbidden" in report["error"] and "b7:other" in report["error"]
    finally:
        await services.stop_all()


def test_the_cli_names_the_partition_and_its_turns_stream(namespace) -> None:
    keys = Keys(namespace, 5)
    out = subprocess.run(
        [sys.executable, "-m", "agentstream", "partition", "conversation-42", "--json"],
        env={"AGENTSTREAM_NAMESPACE": namespace, "AGENTSTREAM_PARTITIONS": "5", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = json.loads(out)
    assert got == {
        "trace_id": "conversation-42",
        "partitions": 5,
        "partition": keys.partition("conversation-42"),
        "turns": keys.turns_for("conversation-42"),
        "wake": keys.wake_for("conversation-42"),
    }


def test_the_cli_names_a_backends_own_streams_for_its_conversation(namespace) -> None:
    keys = Keys(namespace, 5, ("b7",))
    env = {"AGENTSTREAM_NAMESPACE": namespace, "AGENTSTREAM_PARTITIONS": "5", "AGENTSTREAM_BACKENDS": "b7", "PATH": ""}

    def partition(trace_id: str, *flags: str) -> str:
        command = [sys.executable, "-m", "agentstream", "partition", trace_id, *flags]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout

    got = json.loads(partition("b7:conv-42", "--json"))
    assert got["backend"] == "b7" and got["backend_turns"] == keys.backend_turns_for("b7", "b7:conv-42")
    assert (got["backend_cancel"], got["backend_replies"]) == (keys.backend_cancel("b7"), keys.backend_replies("b7"))
    assert keys.backend_turns_for("b7", "b7:conv-42") in partition("b7:conv-42")
    assert "backend" not in json.loads(partition("b8:conv-42", "--json"))  # not a configured backend


def _scraped(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_the_gateways_stream_gauges_cover_every_partition_of_the_turns_stream(
    redis, redis_url, pkeys, monkeypatch
):
    # defect of issue 12's closing note: the gateway's metrics watched partition 0 only, so a turn
    # published to partition 1 or 2 (two thirds of them with 3 partitions) showed no length and no lag
    import asyncio

    import httpx

    from agentstream.ops.settings import Settings
    from agentstream.runtime.connection import connect
    from agentstream.runtime.runner import run_consumers
    from agentstream.runtime.store import TraceStore
    from agentstream_services.gateway.service import build
    from agentstream_services.gateway.settings import GatewaySettings
    from tests.support.gateway import KEYS_DOCUMENT, free_port

    monkeypatch.setenv("AGENTSTREAM_PARTITIONS", str(PARTITIONS))
    settings = Settings(redis_url=redis_url, namespace=pkeys.namespace, metrics_interval_s=0.2)
    assert settings.keys == pkeys
    traces = _traces_of_each_partition(pkeys)
    published = {0: 1, 1: 2, 2: 4}
    for partition, trace in traces.items():
        stream = pkeys.turns_for(trace)
        await redis.xgroup_create(stream, AGENT_LOOP_GROUP, id="0", mkstream=True)  # as the agent loop makes it
        for n in range(published[partition]):
            await redis.xadd(
                stream,
                {TURN_FIELD: codec.encode(TurnMessage(trace_id=trace, turn_id=f"t{n}", agent="calc", text="hi"))},
            )
    client = connect(redis_url)
    _, runners = build(
        apps.app, settings, TraceStore(client, pkeys), GatewaySettings(host="127.0.0.1", port=0, keys=KEYS_DOCUMENT)
    )
    port, stop = free_port(), asyncio.Event()
    task = asyncio.create_task(
        run_consumers(runners, stop=stop, metrics_port=port, metrics_interval_s=0.2, handle_signals=False)
    )
    try:
        streams = pkeys.partitions_of(pkeys.turns)
        assert streams[1] == f"{pkeys.turns}:p1" and len(streams) == PARTITIONS
        async with httpx.AsyncClient() as http:
            for _ in range(100):
                try:
                    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                except httpx.TransportError:
                    text = ""
                lengths = _scraped(text, "agentstream_stream_length")
                if all((("stream", s),) in lengths for s in streams):
                    break
                await asyncio.sleep(0.1)
        assert {s: lengths.get((("stream", s),)) for s in streams} == {
            streams[p]: float(n) for p, n in published.items()
        }
        lags = _scraped(text, "agentstream_consumer_lag")
        assert {s: lags.get((("group", AGENT_LOOP_GROUP), ("stream", s))) for s in streams} == {
            streams[p]: float(n) for p, n in published.items()
        }  # labelled by partition; their sum is every turn waiting
        assert sum(lags[(("group", AGENT_LOOP_GROUP), ("stream", s))] for s in streams) == sum(published.values())
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await client.aclose()


# --- names that could stand for another name's partition (issue 12, closing note, defect 2) -------


@pytest.mark.parametrize("queue", ["x:p1", "x:p2", "x:p01"])
def test_a_tool_worker_of_a_queue_named_like_a_partition_is_refused_before_it_touches_redis(
    redis_url, namespace, queue
) -> None:
    # queue "x:p1" would have consumed ns:tools:x:p1, which is partition 1 of queue "x": the two
    # queues' jobs mixed in one stream, each pool running the other's tools (or failing them)
    env = {
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "AGENTSTREAM_PARTITIONS": str(PARTITIONS),
        "PATH": "",
        "AGENTSTREAM_BLOCK_MS": "100",
    }
    for args, extra in ((["--queue", queue], {}), ([], {"AGENTSTREAM_QUEUES": f"default {queue}"})):
        try:
            done = subprocess.run(
                [sys.executable, "-m", "agentstream", "serve", "tool-worker", "--app", "tests.support.apps:app", *args],
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"a tool worker of queue {queue!r} started (it would consume another queue's partition)"
            ) from None
        assert done.returncode == 2, done.stderr
        assert repr(queue) in done.stderr and "partition suffix" in done.stderr, done.stderr
    client = sync_client(redis_url)
    keys = Keys(namespace, PARTITIONS)
    names = [
        f"{namespace}:tools:{queue}",
        *keys.partitions_of(keys.tools("x")),
        *keys.partitions_of(keys.tools("default")),
    ]
    try:
        assert [n for n in names if client.exists(n)] == []  # no stream made, no group
    finally:
        client.close()


async def test_the_refused_names_stream_is_really_another_queues_partition(redis, redis_url, pkeys, namespace) -> None:
    # what the rule prevents, on real Redis: queue "x"'s tool workers with 3 partitions consume
    # the very stream a queue named "x:p1" would have had
    from agentstream import Agent, App, tool
    from agentstream.errors import ConfigError

    @tool(queue="x")
    def echo(text: str) -> str:
        """Echo a text."""
        return text

    app = App(agents=[Agent(name="echoer", system_prompt="Echo.", tools=[echo])])
    s = InProcess(app, redis_url, namespace, "http://127.0.0.1:9/v1", env={"AGENTSTREAM_PARTITIONS": str(PARTITIONS)})
    await s.start("w1", "tool-worker")
    try:
        partition_1 = f"{namespace}:tools:x:p1"  # Keys.tools("x:p1") before the rule

        async def consumed() -> bool:
            try:
                return TOOL_WORKER_GROUP.encode() in {g["name"] for g in await redis.xinfo_groups(partition_1)}
            except Exception:  # not made yet
                return False

        await wait_for(consumed, what=f"the tool workers' group on {partition_1}")
        assert pkeys.partitions_of(pkeys.tools("x"))[1] == partition_1
        with pytest.raises(ConfigError, match=r"'x:p1'.*partition 1 of queue 'x'"):
            tool(queue="x:p1")(lambda text: text)
        with pytest.raises(ConfigError, match="partition suffix"):
            pkeys.tools("x:p1")
    finally:
        await s.stop_all()


@cluster_only("CLUSTER KEYSLOT needs the Redis Cluster pass")
async def test_hash_tag_characters_in_a_name_would_split_a_stream_from_its_attempts_hash_on_a_cluster(
    redis, namespace
) -> None:
    # why "{" and "}" are refused in queue names and namespaces: the cluster's own slots (CLUSTER KEYSLOT)
    from agentstream.errors import ConfigError
    from agentstream.wire.keys import TOOL_WORKER_GROUP as group
    from agentstream.wire.keys import attempts_key

    async def slot(key: str) -> int:
        return int(await redis.execute_command("CLUSTER KEYSLOT", key))

    broken = f"{namespace}:tools:a}}b"  # what Keys.tools("a}b") gave before the rule
    assert await slot(broken) != await slot(attempts_key(broken, group))  # acknowledging it: a cross-slot script
    pinned = f"{namespace}:tools:{{x}}"
    assert (
        len({await slot(partition) for partition in Keys(namespace, PARTITIONS).partitions_of(pinned)}) == 1
    )  # no spread
    keys = Keys(namespace, PARTITIONS)
    for name in ("a}b", "{x}", "a{b"):
        with pytest.raises(ConfigError, match="hash tag"):
            keys.tools(name)
    for queue in ("default", "team:heavy", "x:p", "x:p1:y"):  # the usable names keep each stream with its hash
        for stream in keys.partitions_of(keys.tools(queue)):
            assert await slot(stream) == await slot(attempts_key(stream, group))
        assert len({await slot(s) for s in keys.partitions_of(keys.tools(queue))}) > 1
