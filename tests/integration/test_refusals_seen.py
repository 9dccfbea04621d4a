"""A client that publishes an entry and waits for its outcome also sees the refusal of that
entry on the errors stream (``agentstream.runtime.reports.refusal_of``): the CLI's ``ask``,
``approve``/``deny`` and ``cancel`` end their wait with the reason instead of timing out as if
no agent loop ran. On a real Redis."""

from __future__ import annotations

import asyncio

import pytest

from agentstream.runtime.connection import connect
from agentstream.runtime.deltas import last_entry_id
from agentstream.runtime.reports import refusal_of, report_error
from agentstream.wire.keys import Keys

pytestmark = pytest.mark.integration


async def test_the_refusal_of_an_entry_is_found_among_other_reports_and_older_ones_are_not(redis_url, namespace):
    keys = Keys(namespace)
    redis = connect(redis_url)
    try:
        await report_error(
            redis, keys, "an older refusal of the same entry id", b"x", source=keys.approvals, entry="5-0"
        )
        after = await last_entry_id(redis, keys.errors)
        stop = asyncio.Event()
        watch = asyncio.create_task(
            refusal_of(redis, keys, source=keys.approvals, entry="5-0", after=after, stop=stop, block_ms=50)
        )
        await report_error(redis, keys, "another entry's refusal", b"x", source=keys.approvals, entry="6-0")
        await report_error(redis, keys, "same id, another stream", b"x", source=keys.cancel, entry="5-0")
        await report_error(redis, keys, "hostile: no source or entry", b"\xff" * 10)
        await redis.xadd(keys.errors, {b"junk": b"\xff\xfe"})  # a careless writer's entry
        await asyncio.sleep(0.2)
        assert not watch.done()  # none of those is this entry's refusal
        await report_error(
            redis, keys, "approval 5-0 decided nothing: its turn ended", b"x", source=keys.approvals, entry="5-0"
        )
        async with asyncio.timeout(10):
            assert await watch == "approval 5-0 decided nothing: its turn ended"
    finally:
        await redis.aclose()


async def test_a_wait_for_a_refusal_ends_with_none_when_stopped(redis_url, namespace):
    keys = Keys(namespace)
    redis = connect(redis_url)
    try:
        stop = asyncio.Event()
        watch = asyncio.create_task(
            refusal_of(redis, keys, source=keys.turns, entry="1-0", after="0-0", stop=stop, block_ms=50)
        )
        await asyncio.sleep(0.1)
        stop.set()
        async with asyncio.timeout(10):
            assert await watch is None
    finally:
        await redis.aclose()


async def test_ask_ends_its_wait_with_the_refusal_of_its_turn(redis_url, namespace):
    """No agent loop runs here: the test plays one that refuses the published turn before it had
    a trace (reported on the errors stream only). ``ask`` must print that reason and stop, not
    wait out its 60 s and say the agent loop may be down."""
    from typer.testing import CliRunner

    from agentstream.cli.commands import cli
    from agentstream.wire.keys import TURN_FIELD

    keys = Keys(namespace)
    trace_id = "conv-refused"
    stream = keys.turns_for(trace_id)
    redis = connect(redis_url)
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    asked = asyncio.create_task(
        asyncio.to_thread(
            CliRunner().invoke,
            cli,
            ["ask", "hello", "--agent", "calc", "--trace-id", trace_id, "--timeout-s", "60"],
            env=env,
        )
    )
    try:
        async with asyncio.timeout(30):
            while not (published := await redis.xrange(stream)):
                await asyncio.sleep(0.05)
        [(entry_id, fields)] = published
        assert TURN_FIELD in fields
        await report_error(
            redis,
            keys,
            "turn refused: the conversation's backend is not configured here",
            b"x",
            source=stream,
            entry=entry_id.decode(),
        )
        async with asyncio.timeout(30):
            result = await asked
    finally:
        await redis.aclose()
    assert result.exit_code == 1, result.output
    assert "the agent loop refused the turn: turn refused: the conversation's backend" in result.output, result.output
    assert "no answer within" not in result.output
