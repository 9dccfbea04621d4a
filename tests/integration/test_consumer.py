"""Consumer groups on a real Redis: ack after success, reclaim, own pending, dead letters, self-healing."""

import asyncio

import pytest

from agentstream.ops.settings import Settings
from agentstream.runtime import deadletters
from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer
from tests.support.redis_server import command_calls

pytestmark = pytest.mark.integration


def make(redis, keys, name, handler, **config):
    return StreamConsumer(
        redis,
        stream=f"{keys.namespace}:work",
        group="g",
        consumer=name,
        handler=handler,
        dead_stream=keys.dead(f"{keys.namespace}:work"),
        config=ConsumerConfig(
            block_ms=50,
            min_idle_ms=config.pop("min_idle_ms", 200),
            reclaim_interval_ms=config.pop("reclaim_interval_ms", 50),
            retry_delay_s=config.pop("retry_delay_s", 0.05),
            **config,
        ),
    )


async def run_for(consumer, seconds):
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_failed_handler_leaves_entry_pending_and_another_consumer_reclaims_it(redis, keys):
    # C20 / C15: ack only after success; a live worker claims what a dead one left.
    stream = f"{keys.namespace}:work"
    seen = []

    async def failing(entry_id, fields):
        raise RuntimeError("boom")

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    c1 = make(redis, keys, "w1", failing)
    await c1.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await c1.run_until_idle()
    assert (await redis.xpending(stream, "g"))["pending"] == 1
    c2 = make(redis, keys, "w2", ok)
    await run_for(c2, 0.6)
    assert seen == [b"1"] and c2.reclaimed == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_restarted_consumer_drains_its_own_pending_first(redis, keys):
    stream = f"{keys.namespace}:work"
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)  # delivered, then the process "died"
    seen = []

    async def ok(entry_id, fields):
        seen.append(entry_id)

    again = make(redis, keys, "w1", ok, min_idle_ms=3_600_000)
    await again.run_until_idle()
    assert len(seen) == 1 and (await redis.xpending(stream, "g"))["pending"] == 0


async def test_poison_entry_goes_to_the_dead_letter_stream_and_others_flow(redis, keys):
    # C17: after N deliveries the entry moves to the dead-letter stream; it never blocks others.
    stream = f"{keys.namespace}:work"
    dead_seen = []

    async def handler(entry_id, fields):
        if fields[b"x"] == b"poison":
            raise ValueError("cannot handle")

    async def on_dead(entry_id, fields, error):
        dead_seen.append((fields[b"x"], error))

    c = make(redis, keys, "w1", handler, min_idle_ms=10, max_deliveries=3)
    c.on_dead_letter = on_dead
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"poison"})
    await redis.xadd(stream, {b"x": b"fine"})
    await run_for(c, 1.5)
    assert dead_seen == [(b"poison", "ValueError: cannot handle")]
    dead = await redis.xrange(keys.dead(stream))
    assert len(dead) == 1 and dead[0][1][b"dead_deliveries"] == b"3" and dead[0][1][b"x"] == b"poison"
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert c.handled == 1


async def _run_until_dead_lettered(redis, keys, consumer, stream: str, settle_s: float = 0.0) -> list:
    """Publish one poison entry on ``stream``, run ``consumer`` until the entry is on the
    dead-letter stream (up to 10 s) and ``settle_s`` more, stop it → the dead-letter entries."""
    await consumer.ensure_group()
    await redis.xadd(stream, {b"x": b"poison"})
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    for _ in range(500):
        if await redis.xlen(keys.dead(stream)):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(settle_s)
    stop.set()
    await asyncio.wait_for(task, 5)
    return await redis.xrange(keys.dead(stream))


@pytest.mark.parametrize(
    "max_deliveries", [1, Settings.model_fields["max_deliveries"].default]
)  # the default, AGENTSTREAM_MAX_DELIVERIES=5
async def test_a_poison_entry_is_delivered_exactly_max_deliveries_times_and_its_dead_letter_says_so(
    redis, keys, max_deliveries
):
    # "5" means: the handler starts at most 5 times; the dead letter's count is those starts
    stream = f"{keys.namespace}:work"
    starts = []

    async def always_fails(entry_id, fields):
        starts.append(entry_id)
        raise ValueError("cannot handle")

    c = make(redis, keys, "w1", always_fails, max_deliveries=max_deliveries, retry_delay_s=0.01)
    (dead,) = await _run_until_dead_lettered(redis, keys, c, stream, settle_s=0.2)  # nothing more starts after
    assert len(starts) == max_deliveries
    assert dead[1][b"dead_deliveries"] == str(max_deliveries).encode()
    letter = (await deadletters.read(redis, keys, [stream]))[0]
    assert letter.deliveries == max_deliveries


async def test_a_dead_letter_round_that_fails_is_not_counted_as_a_delivery(redis, keys):
    stream = f"{keys.namespace}:work"
    starts, hook_calls = [], []

    async def always_fails(entry_id, fields):
        starts.append(entry_id)
        raise ValueError("cannot handle")

    async def hook(entry_id, fields, error):  # Redis fails while the failure is put into the trace
        hook_calls.append(entry_id)
        if len(hook_calls) < 3:
            raise ConnectionError("Redis went away")

    c = make(redis, keys, "w1", always_fails, max_deliveries=2, retry_delay_s=0.01)
    c.on_dead_letter = hook
    (dead,) = await _run_until_dead_lettered(redis, keys, c, stream)
    assert len(starts) == 2 and len(hook_calls) == 3
    assert dead[1][b"dead_deliveries"] == b"2"  # the two rounds that failed to move it started nothing


async def test_group_deleted_under_a_running_consumer_is_recreated(redis, keys, caplog):
    stream = f"{keys.namespace}:work"
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    c = make(redis, keys, "w1", ok)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    await asyncio.sleep(0.2)
    await redis.delete(stream)  # a flush / a restart without persistence
    await asyncio.sleep(0.3)
    await redis.xadd(stream, {b"x": b"after"})
    for _ in range(50):
        if seen:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert seen == [b"after"]
    assert any("recreating" in r.getMessage() for r in caplog.records)


async def test_group_created_before_entries_delivers_existing_entries(redis, keys):
    # C20: the group starts at 0, reads use '>': entries published before any worker are delivered.
    stream = f"{keys.namespace}:work"
    await redis.xadd(stream, {b"x": b"early"})
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    await make(redis, keys, "w1", ok).run_until_idle()
    assert seen == [b"early"]


# --- issue 4: reclaim, renewal, real-delivery counting, dead letters, lost entries ------------


async def pending_of(redis, stream):
    return await redis.xpending_range(stream, "g", min="-", max="+", count=100)


async def test_c15_entry_of_a_killed_worker_is_claimed_by_a_live_one_and_pel_ends_empty(redis, keys):
    # C15: w1 took 1-0 and died before XACK; w2 only reads '>' yet must finish it within min-idle.
    stream = f"{keys.namespace}:work"
    await make(redis, keys, "w1", None).ensure_group()
    await redis.xadd(stream, {b"call_id": b"call_1"})
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)  # delivered to w1, then kill -9
    results = []

    async def ok(entry_id, fields):
        results.append(fields[b"call_id"])

    w2 = make(redis, keys, "w2", ok, min_idle_ms=300)
    await run_for(w2, 1.2)
    assert results == [b"call_1"]  # exactly one result for call_1
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_c20_reclaim_actually_issues_claim_commands(redis, keys):
    # C20: "the reclaim path is verified to actually issue claim commands".
    before = await command_calls(redis, "cmdstat_xautoclaim")

    async def ok(entry_id, fields):
        pass

    await run_for(make(redis, keys, "w1", ok), 0.5)
    assert await command_calls(redis, "cmdstat_xautoclaim") - before >= 3  # reclaim_interval_ms=50 over 0.5 s


@pytest.mark.slow
async def test_a_live_workers_long_job_is_not_stolen_and_renewals_are_not_deliveries(redis, keys):
    # min_idle 200 ms, the handler takes 1.5 s: without claim renewal w2 would claim and run it too.
    stream = f"{keys.namespace}:work"
    runs = []

    async def slow(entry_id, fields):
        runs.append(entry_id)
        await asyncio.sleep(1.5)

    w1, w2 = make(redis, keys, "w1", slow), make(redis, keys, "w2", slow)
    await w1.ensure_group()
    await redis.xadd(stream, {b"x": b"long"})
    stop = asyncio.Event()
    t1 = asyncio.create_task(w1.run(stop))
    await asyncio.sleep(0.3)
    t2 = asyncio.create_task(w2.run(stop))
    for _ in range(60):
        await asyncio.sleep(0.05)
        pending = await pending_of(redis, stream)
        if runs and pending:
            assert pending[0]["times_delivered"] == 1  # XCLAIM JUSTID renewals count no delivery
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(asyncio.gather(t1, t2), 5)
    assert len(runs) == 1 and w2.reclaimed == 0 and w1.claim_renewals >= 2
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_c17_entry_reread_and_reclaimed_many_times_is_not_dead_lettered(redis, keys):
    # C17, entry 6-0: held, released and re-read 10+ times (Redis times_delivered ≥ 10), never
    # failed: agentstream counts only real handler starts, so it is processed normally.
    stream = f"{keys.namespace}:work"
    seen, dead = [], []

    async def ok(entry_id, fields):
        seen.append(entry_id)

    async def on_dead(entry_id, fields, error):
        dead.append(entry_id)

    c = make(redis, keys, "w1", ok, max_deliveries=3)
    c.on_dead_letter = on_dead
    await c.ensure_group()
    entry = (await redis.xadd(stream, {b"call_id": b"slow"})).decode()
    await redis.xreadgroup("g", "other", {stream: ">"}, count=1)
    for _ in range(6):  # another consumer's re-reads and ownership moves
        await redis.xreadgroup("g", "other", {stream: "0"}, count=10)
        await redis.xclaim(stream, "g", "other", 0, [entry])
    assert (await pending_of(redis, stream))[0]["times_delivered"] >= 10
    await redis.xclaim(stream, "g", "w1", 0, [entry], justid=True)  # now it is w1's own pending entry
    await c.run_until_idle()
    assert seen == [entry] and dead == []
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_c17_poison_entry_that_kills_its_worker_is_dead_lettered_with_a_failure(redis, keys):
    # C17, entry 5-0: each handler start dies before XACK (kill -9: no exception, no counter of
    # the app's own). After N real starts the entry goes to the dead-letter stream with its payload,
    # its count and a last error, the failure hook runs, and the next entry flows.
    stream = f"{keys.namespace}:work"
    await make(redis, keys, "w0", None).ensure_group()
    await redis.xadd(stream, {b"call_id": b"big"})
    started = []

    async def dies(entry_id, fields):
        started.append(entry_id)
        await asyncio.sleep(3600)  # the process is killed in here

    for i in range(3):
        c = make(redis, keys, f"w{i}", dies, min_idle_ms=100, max_deliveries=3)

        async def killed(*args, **kwargs):  # kill -9: nothing is given back, nothing uncounted
            return None

        c._release = killed
        task = asyncio.create_task(c.run(asyncio.Event()))
        while len(started) < i + 1:
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    dead_hook, fine = [], []

    async def handler(entry_id, fields):
        fine.append(fields[b"call_id"])

    async def on_dead(entry_id, fields, error):
        dead_hook.append((fields[b"call_id"], error))

    await redis.xadd(stream, {b"call_id": b"next"})
    c = make(redis, keys, "w9", handler, min_idle_ms=100, max_deliveries=3)
    c.on_dead_letter = on_dead
    await run_for(c, 1.0)
    assert len(started) == 3
    assert dead_hook and dead_hook[0][0] == b"big" and dead_hook[0][1].startswith("unknown")
    (dead,) = await redis.xrange(keys.dead(stream))
    assert dead[1][b"call_id"] == b"big" and dead[1][b"dead_deliveries"] == b"3"  # the 3 starts it killed
    assert fine == [b"next"]
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert not await redis.hgetall(c.attempts_key)


async def test_failed_handler_is_retried_by_its_own_consumer_without_waiting_for_min_idle(redis, keys):
    stream = f"{keys.namespace}:work"
    calls = []

    async def flaky(entry_id, fields):
        calls.append(entry_id)
        if len(calls) == 1:
            raise RuntimeError("transient")

    c = make(redis, keys, "w1", flaky, min_idle_ms=3_600_000)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await run_for(c, 0.6)
    assert len(calls) == 2 and c.handled == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_deferred_entries_come_back_and_deferrals_are_not_deliveries(redis, keys):
    from agentstream.runtime.consumer import Deferred

    stream = f"{keys.namespace}:work"
    calls = []

    async def busy(entry_id, fields):
        calls.append(entry_id)
        if len(calls) < 6:
            raise Deferred(0.03, "busy")

    c = make(redis, keys, "w1", busy, min_idle_ms=3_600_000, max_deliveries=2)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await run_for(c, 1.0)
    assert len(calls) == 6 and c.handled == 1 and c.dead_lettered == 0


async def test_c18_pending_entry_without_a_body_is_acked_reported_and_the_consumer_goes_on(redis, keys):
    # C18: someone trimmed with MAXLEN; the PEL still lists 1-0 but its body is nil.
    stream = f"{keys.namespace}:work"
    c0 = make(redis, keys, "w1", None)
    await c0.ensure_group()
    await redis.xadd(stream, {b"ev": b"e1"}, id="1-0")
    await redis.xreadgroup("g", "w1", {stream: ">"})  # not acked
    await redis.xadd(stream, {b"ev": b"e2"}, id="2-0", maxlen=1, approximate=False)  # 1-0 trimmed away
    reread = await redis.xreadgroup("g", "w1", {stream: "0"})
    assert reread[0][1][0][1] in (None, {})  # [1-0, nil]
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"ev"])

    c = make(redis, keys, "w1", ok)
    await c.run_until_idle()
    assert seen == [b"e2"] and c.lost == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    (lost,) = await redis.xrange(keys.dead(stream))
    assert lost[1][b"dead_source_id"] == b"1-0" and lost[1][b"dead_error"].startswith(b"lost")


async def test_missing_stream_is_recreated_with_backoff_not_a_hot_loop(redis, keys, caplog):
    # The key exists with the wrong type: every group creation fails. Backoff bounds the attempts.
    stream = f"{keys.namespace}:work"
    await redis.set(stream, b"not a stream")
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"x"])

    c = make(redis, keys, "w1", ok)
    attempts = []
    real = c.ensure_group

    async def counted():
        attempts.append(1)
        await real()

    c.ensure_group = counted
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    await asyncio.sleep(1.5)
    assert 2 <= len(attempts) <= 8  # 0.1 + 0.2 + 0.4 + 0.8 s of backoff, not thousands of tries
    await redis.delete(stream)
    await redis.xadd(stream, {b"x": b"after"})
    for _ in range(80):
        if seen:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert seen == [b"after"]


async def test_shutdown_past_the_grace_period_releases_unfinished_entries_for_others_at_once(redis, keys):
    # SIGTERM, and the grace period runs out: the handler is cancelled, the entry stays pending
    # but is marked long idle, so a consumer with a one-hour min_idle claims it at its first
    # look; the interrupted start is not counted as a delivery.
    from agentstream.runtime.runner import run_consumers

    stream = f"{keys.namespace}:work"
    started = asyncio.Event()

    async def forever(entry_id, fields):
        started.set()
        await asyncio.sleep(3600)

    c1 = make(redis, keys, "w1", forever, min_idle_ms=3_600_000)
    await c1.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    stop = asyncio.Event()
    task = asyncio.create_task(run_consumers([c1], stop=stop, grace_s=0.3, handle_signals=False))
    await asyncio.wait_for(started.wait(), 5)
    stop.set()
    await asyncio.wait_for(task, 10)
    done = []

    async def ok(entry_id, fields):
        done.append(entry_id)

    c2 = make(redis, keys, "w2", ok, min_idle_ms=3_600_000)
    await run_for(c2, 0.4)
    assert len(done) == 1 and c2.reclaimed == 1
    assert not await redis.hgetall(c2.attempts_key)


def test_claim_option_only_where_the_server_has_it():
    from agentstream.runtime.claims import parse_version, supports_claim_option

    assert not supports_claim_option(parse_version("7.0.15"))
    assert not supports_claim_option(parse_version("8.2.1"))
    assert supports_claim_option(parse_version("8.4.0"))
    assert supports_claim_option(parse_version("9.0.0-rc1"))


async def test_reads_use_xreadgroup_claim_on_servers_that_have_it(redis, keys, monkeypatch):
    # Redis here is 7.0 (XAUTOCLAIM); pretend 8.4 and check the read carries CLAIM <min_idle>.
    import agentstream.runtime.consumer as consumer_module

    async def fake_version(_redis):
        return (8, 4, 0)

    monkeypatch.setattr(consumer_module, "server_version", fake_version)
    sent = {}
    c = make(redis, keys, "w1", None, min_idle_ms=1234)
    real = redis.xreadgroup

    async def spy(*args, **kwargs):
        sent.update(kwargs)
        kwargs.pop("claim_min_idle_time", None)  # this server does not understand it
        return await real(*args, **kwargs)

    monkeypatch.setattr(redis, "xreadgroup", spy)
    await run_for(c, 0.2)
    assert sent.get("claim_min_idle_time") == 1234


async def test_c18_claimed_entry_trimmed_while_pending_is_lost_not_a_crash_on_redis_7_and_6_2(versioned_redis, keys):
    # C18 on reclaim: a dead consumer's pending entry was trimmed away. Redis 7 lists it among
    # XAUTOCLAIM's deleted ids; Redis 6.2 claims it and replies nil in its place (no id).
    redis = versioned_redis
    stream = f"{keys.namespace}:work"
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    await redis.xadd(stream, {b"ev": b"gone"}, id="1-0")
    await redis.xreadgroup("g", "ghost", {stream: ">"}, count=1)  # the ghost dies holding it
    await redis.xtrim(stream, maxlen=0, approximate=False)
    await redis.xadd(stream, {b"ev": b"kept"}, id="2-0")
    await redis.xreadgroup("g", "ghost", {stream: ">"}, count=1)  # and this one, still there
    seen = []

    async def ok(entry_id, fields):
        seen.append(fields[b"ev"])

    c = make(redis, keys, "w1", ok, min_idle_ms=10)
    await asyncio.sleep(0.05)
    await run_for(c, 0.5)
    assert seen == [b"kept"] and c.lost == 1
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    (lost,) = await redis.xrange(keys.dead(stream))
    assert lost[1][b"dead_source_id"] == b"1-0" and lost[1][b"dead_error"].startswith(b"lost")


async def test_c18_own_pending_entry_without_a_body_on_redis_7_and_6_2(versioned_redis, keys):
    # The restarted consumer's own PEL (XREADGROUP from 0) lists a trimmed entry with no body.
    redis = versioned_redis
    stream = f"{keys.namespace}:work"
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    await redis.xadd(stream, {b"ev": b"gone"}, id="1-0")
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)
    await redis.xtrim(stream, maxlen=0, approximate=False)
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000)
    await run_for(c, 0.3)
    assert c.lost == 1 and (await redis.xpending(stream, "g"))["pending"] == 0


async def test_a_consumer_that_dies_with_an_error_fails_the_service(redis, keys):
    # A consumer task that crashes must not leave the process exiting 0 with nothing consumed.
    from agentstream.errors import ServiceFailed
    from agentstream.runtime.runner import run_consumers

    class Broken:
        stream = f"{keys.namespace}:work"

        async def run(self, stop):
            raise AttributeError("'NoneType' object has no attribute 'encode'")

    healthy = make(redis, keys, "w1", None)
    with pytest.raises(ServiceFailed, match="AttributeError") as info:
        await asyncio.wait_for(run_consumers([healthy, Broken()], grace_s=2, handle_signals=False), 10)
    assert isinstance(info.value.__cause__, AttributeError)


async def test_an_entry_read_new_costs_no_command_for_its_count_and_one_given_back_unstarted_counts_none(redis, keys):
    # the first start of an entry read new is counted by its place in the pending entries list:
    # no count is written while it runs; one read but never started is given back with 0 starts,
    # so its next delivery is its first start, not its second
    stream = f"{keys.namespace}:work"
    seen = []

    async def handler(entry_id, fields):
        seen.append(await redis.hget(c.attempts_key, entry_id))

    c = make(redis, keys, "w1", handler, min_idle_ms=60_000)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"1"})
    await run_for(c, 0.3)
    assert seen == [None] and c.handled == 1  # handled with no count written, then acknowledged
    assert not await redis.hgetall(c.attempts_key)

    late = (await redis.xadd(stream, {b"x": b"2"})).decode()
    stop = asyncio.Event()
    stop.set()  # a shutdown began as the read came back: the entry is not started
    await c._read_new(stop, block_ms=50)
    assert await redis.hget(c.attempts_key, late) == b"0"
    starts = []

    async def counting(entry_id, fields):
        starts.append(int(await redis.hget(c2.attempts_key, entry_id)))

    c2 = make(redis, keys, "w2", counting, min_idle_ms=100)
    await run_for(c2, 0.6)  # claims the given-back entry: its first start
    assert starts == [1]


async def test_entries_whose_handlers_finish_together_are_acknowledged_by_one_command(redis, keys):
    # handlers that finish in the same turn of the event loop share one XACK (the first waits
    # one turn for the others); every entry is acknowledged and its counters dropped
    stream = f"{keys.namespace}:work"
    go = asyncio.Event()
    started = []

    async def handler(entry_id, fields):
        started.append(entry_id)
        await go.wait()

    c = make(redis, keys, "w1", handler, min_idle_ms=60_000, concurrency=30)
    await c.ensure_group()
    for n in range(20):
        await redis.xadd(stream, {b"x": str(n).encode()})
    await redis.hset(c.attempts_key, mapping={"0-1:error": "an older entry's: untouched"})
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    for _ in range(200):
        if len(started) == 20:
            break
        await asyncio.sleep(0.01)
    assert len(started) == 20
    before = await command_calls(redis, "cmdstat_xack")
    go.set()
    for _ in range(200):
        if c.handled == 20 and (await redis.xpending(stream, "g"))["pending"] == 0:
            break
        await asyncio.sleep(0.01)
    acks = await command_calls(redis, "cmdstat_xack") - before
    stop.set()
    await asyncio.wait_for(task, 5)
    assert c.handled == 20 and (await redis.xpending(stream, "g"))["pending"] == 0
    assert acks == 1
    assert await redis.hgetall(c.attempts_key) == {b"0-1:error": b"an older entry's: untouched"}


async def test_an_entry_acknowledged_with_others_whose_handler_started_twice_has_its_counters_dropped(redis, keys):
    stream = f"{keys.namespace}:work"
    failed = set()

    async def handler(entry_id, fields):
        if fields[b"x"] == b"flaky" and entry_id not in failed:
            failed.add(entry_id)
            raise RuntimeError("once")

    c = make(redis, keys, "w1", handler, min_idle_ms=60_000, concurrency=8)
    await c.ensure_group()
    for x in (b"flaky", b"a", b"b"):
        await redis.xadd(stream, {b"x": x})
    await run_for(c, 0.6)
    assert c.handled == 3 and (await redis.xpending(stream, "g"))["pending"] == 0
    assert not await redis.hgetall(c.attempts_key)  # the flaky one's count and error went with its ack


async def test_a_handler_that_acknowledged_its_entry_itself_gets_no_second_acknowledgement(redis, keys):
    """A handler whose last write acknowledged its entry (a script, see current_delivery) says
    so; the consumer then sends nothing for it. Tasks the handler starts see no delivery."""
    from agentstream.runtime.consumer import current_delivery

    stream = f"{keys.namespace}:work"
    seen: list = []

    async def acknowledging(entry_id, fields):
        delivery = current_delivery()
        assert delivery is not None and delivery.ack_args() == (stream, "g", c.attempts_key, entry_id)
        seen.append(await asyncio.create_task(_delivery_in_a_task()))
        if fields[b"x"] == b"self":
            await redis.xack(stream, "g", entry_id)
            delivery.acknowledged = True

    async def _delivery_in_a_task():
        return current_delivery()

    c = make(redis, keys, "w1", acknowledging)
    await c.ensure_group()
    sent: list = []
    real = c._ack_ids

    async def counted(ids):
        sent.extend(ids)
        await real(ids)

    c._ack_ids = counted
    own = (await redis.xadd(stream, {b"x": b"self"})).decode()
    other = (await redis.xadd(stream, {b"x": b"consumer"})).decode()
    await c.run_until_idle()
    assert current_delivery() is None and seen == [None, None]
    assert sent == [other] and own not in sent and c.handled == 2
    assert (await redis.xpending(stream, "g"))["pending"] == 0


async def test_after_one_crash_entries_run_side_by_side_and_after_two_alone(redis, keys):
    # A process killed with several handlers running leaves each of their entries started once:
    # they run side by side again (handling each alone made one kill -9 cost minutes of recovery),
    # while an entry in its second crash runs alone, so a poison entry cannot keep taking others down.
    stream = f"{keys.namespace}:work"
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000, concurrency=8)
    await c.ensure_group()
    ids = [(await redis.xadd(stream, {b"x": str(i).encode()})).decode() for i in range(5)]
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=5)  # delivered, then the process "died"
    # ids 0-2 started once (no count written: see claims.start_attempt), id 3 twice, id 4 never
    await redis.hset(c.attempts_key, mapping={ids[3]: 2, ids[4]: 0})
    spans: dict[str, tuple[float, float]] = {}

    async def handler(entry_id, fields):
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.3)
        spans[entry_id] = (started, asyncio.get_running_loop().time())

    again = make(redis, keys, "w1", handler, min_idle_ms=3_600_000, concurrency=8)
    await again.run_until_idle()
    assert sorted(spans) == sorted(ids)

    def beside(entry_id: str) -> set[str]:
        start, end = spans[entry_id]
        return {other for other, (s, e) in spans.items() if other != entry_id and s < end and start < e}

    assert beside(ids[3]) == set()  # its third start: alone
    assert {ids[1], ids[2]} <= beside(ids[0])  # their second start: side by side
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert not await redis.hgetall(c.attempts_key)


async def test_suspects_of_one_kill_run_together_in_halved_groups_never_beside_innocent_entries(redis, keys):
    # Entries that failed twice (a killed process's suspects) ran alone, one at a time: 64 of
    # them after two kills took 64 tool run times. Now they run beside each other in groups of
    # half the handlers (halved again at each further crash), and never beside an entry that is
    # no suspect, so a poison entry still takes no innocent one down with it.
    stream = f"{keys.namespace}:work"
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000, concurrency=8)
    await c.ensure_group()
    ids = [(await redis.xadd(stream, {b"x": str(i).encode()})).decode() for i in range(8)]
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=8)  # delivered, then the process "died"
    suspects = set(ids[:6])  # started twice before: their third start is a suspect's, group of 8 / 2
    await redis.hset(c.attempts_key, mapping={**dict.fromkeys(ids[:6], 2), ids[6]: 0, ids[7]: 0})
    spans: dict[str, tuple[float, float]] = {}

    async def handler(entry_id, fields):
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.3)
        spans[entry_id] = (started, asyncio.get_running_loop().time())

    again = make(redis, keys, "w1", handler, min_idle_ms=3_600_000, concurrency=8)
    await again.run_until_idle()
    assert sorted(spans) == sorted(ids)

    def beside(entry_id: str) -> set[str]:
        start, end = spans[entry_id]
        return {other for other, (s, e) in spans.items() if other != entry_id and s < end and start < e}

    for entry in suspects:
        assert beside(entry) <= suspects  # no innocent entry beside a suspect
    most = max(sum(1 for s, e in spans.values() if s <= at < e) for at, _ in spans.values())
    assert most == 4  # a group: half of the 8 handlers, not one at a time and not all 6
    assert (await redis.xpending(stream, "g"))["pending"] == 0
    assert not await redis.hgetall(c.attempts_key)


async def test_a_dead_consumers_idle_entry_takes_the_next_free_slot_before_new_entries(redis, keys):
    # A consumer whose every slot was busy when its look for idle entries came skipped it until
    # the next look, and meanwhile filled each freed slot with a new entry: under a steady load
    # a dead consumer's entries waited behind the queue. The freed slot now goes to the claim.
    stream = f"{keys.namespace}:work"
    order: list[bytes] = []

    async def handler(entry_id, fields):
        order.append(fields[b"x"])
        if fields[b"x"].startswith(b"new"):
            await asyncio.sleep(0.5)

    c = make(redis, keys, "w1", handler, concurrency=1, min_idle_ms=300, reclaim_interval_ms=300)
    await c.ensure_group()
    await redis.xadd(stream, {b"x": b"dead's"})
    await redis.xreadgroup("g", "w0", {stream: ">"}, count=1)  # w0 took it and died
    for i in range(3):
        await redis.xadd(stream, {b"x": f"new-{i}".encode()})
    await run_for(c, 1.4)
    # right after the entry that held the slot (first, when the look found it idle already)
    assert b"dead's" in order and order.index(b"dead's") <= 1, order


async def test_an_entry_killed_while_it_waits_for_its_turn_has_not_started(redis, keys):
    # An entry read beside a running suspect waits for its turn; a kill meanwhile counted a
    # failed start for it, so entries that never ran became suspects themselves after two kills,
    # and more and more of a busy worker's entries ran apart from the others.
    stream = f"{keys.namespace}:work"
    c = make(redis, keys, "w1", None, min_idle_ms=3_600_000, concurrency=4)
    await c.ensure_group()
    suspect = (await redis.xadd(stream, {b"x": b"suspect"})).decode()
    await redis.xreadgroup("g", "w1", {stream: ">"}, count=1)
    await redis.hset(c.attempts_key, suspect, 2)  # two failed starts: its third is a suspect's
    started: list[bytes] = []

    async def handler(entry_id, fields):
        started.append(fields[b"x"])
        await asyncio.sleep(3600)  # the process is killed in here

    w = make(redis, keys, "w1", handler, min_idle_ms=3_600_000, concurrency=4)

    async def killed(*args, **kwargs):  # kill -9: nothing is given back, nothing uncounted
        return None

    w._release = killed
    task = asyncio.create_task(w.run(asyncio.Event()))
    while not started:
        await asyncio.sleep(0.02)
    fresh = (await redis.xadd(stream, {b"x": b"fresh"})).decode()
    while fresh not in w._inflight:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # it waits for the suspect's turn to end
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert started == [b"suspect"]
    assert await redis.hget(w.attempts_key, suspect) == b"3"
    assert await redis.hget(w.attempts_key, fresh) == b"0"  # never started: no failed start
