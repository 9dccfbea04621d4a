"""A cancel names a turn the trace holds and that has not ended; any other records nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.runtime.cancel import publish_cancel
from agentstream.wire.events import CancelMessage, CancelRequested
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, publish, wait_for, wait_reply
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration


@pytest.fixture
def model():
    with ScriptedModelServer(parallel_rule) as server:
        yield server


@pytest.fixture
async def services(redis_url, namespace, model, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    s = InProcess(apps.app, redis_url, namespace, model.base_url)
    yield s
    await s.stop_all()


async def _handled(redis, keys, entry_id: str) -> None:
    """Wait until the agent loop's group on the cancel stream has handled ``entry_id``."""

    async def done():
        for group in await redis.xinfo_groups(keys.cancel):
            last = group["last-delivered-id"]
            last = last.decode() if isinstance(last, bytes) else last
            if tuple(map(int, last.split("-"))) >= tuple(map(int, entry_id.split("-"))) and group["pending"] == 0:
                return True
        return False

    await wait_for(done, what=f"cancel {entry_id} handled")


async def test_a_cancel_of_an_unknown_or_ended_turn_records_nothing_and_a_later_turn_of_that_id_runs(
    redis, keys, services, store
):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c1", turn_id="t1", agent="plan", text="do: work(1)")
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    for turn_id in ("ghost", "t1"):  # not in the trace; already ended
        entry = await publish_cancel(redis, keys, CancelMessage(trace_id="c1", turn_id=turn_id, by="user"))
        await _handled(redis, keys, entry)
    assert not any(isinstance(e, CancelRequested) for e in await events_of(store, "c1"))
    await publish(redis, keys, trace_id="c1", turn_id="ghost", agent="plan", text="now do: work(2)")
    assert (await wait_reply(redis, keys, "ghost")).status == "ended"


async def test_cli_cancel_of_an_unknown_turn_says_so_publishes_nothing_and_does_not_wait(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c2", turn_id="t1", agent="plan", text="do: work(1)")
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    started = time.monotonic()
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["cancel", "c2", "--turn-id", "nope", "--wait-s", "60"])
    assert result.exit_code != 0 and "no such running turn" in result.output, result.output
    assert time.monotonic() - started < 20
    assert await redis.xlen(keys.cancel) == 0
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["cancel", "c2", "--turn-id", "t1", "--wait-s", "60"])
    assert "no such running turn" in result.output and "has already ended" in result.output, result.output
    assert await redis.xlen(keys.cancel) == 0
