"""A policy per turn for a busy conversation, on real Redis with the agent loop in process (issue
36, item 2): a turn message's ``busy_policy`` overrides the process's; ``rollback`` cancels the
running turn and leaves its events out of every later context, and ``trace verify`` still
rebuilds every recorded request byte for byte (the earlier ones with that turn, the later ones
without); an unknown policy is refused as ``bad_turn``."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.wire.events import CancelRequested, ModelOutput, ToolOutput, TurnFailed, TurnInput
from agentstream.wire.keys import TURN_FIELD
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


def _requests_of(model, needle: str) -> list[str]:
    return [body.decode() for body in model.requests if needle in body.decode()]


async def _verify(redis_url, namespace, model, trace_id: str):
    env = {
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_MODEL": "scripted-model",
    }
    args = ["trace", "verify", trace_id, "--app", "tests.support.apps:app"]
    return await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)


async def test_rollback_cancels_the_running_turn_and_later_contexts_leave_it_out(
    redis, keys, services, store, model, redis_url, namespace
):
    """The process queues by default; t2 names ``rollback``. t1 had made a model call and its tool
    was running: t1 ends cancelled, its late result is kept out, and neither t2's nor t3's model
    calls show anything of t1; `trace verify` matches every call, t1's own included."""
    os.environ["AGENTSTREAM_TEST_SLEEPY_S"] = "1.5"
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await publish(redis, keys, trace_id="r1", turn_id="t1", agent="plan", text="WRONG do: sleepy(oops)")
        await wait_for(lambda: _has_output(store, "r1", "t1"), what="t1's first model output")
        await publish(
            redis, keys, trace_id="r1", turn_id="t2", agent="plan", text="do: work(1)", busy_policy="rollback"
        )
        first = await wait_reply(redis, keys, "t1")
        assert first.status == "failed" and first.code == "cancelled" and "rolled back by turn t2" in first.reason
        assert (await wait_reply(redis, keys, "t2")).status == "ended"
        await publish(redis, keys, trace_id="r1", turn_id="t3", agent="plan", text="then do: work(2)")
        assert (await wait_reply(redis, keys, "t3")).status == "ended"

        async def late():
            return [e for e in await events_of(store, "r1") if isinstance(e, ToolOutput) and e.late]

        await wait_for(late, what="sleepy's late result")  # the tool ran on, ignoring the cancel
    finally:
        os.environ.pop("AGENTSTREAM_TEST_SLEEPY_S", None)
    events = await events_of(store, "r1")
    (t2_input,) = [e for e in events if isinstance(e, TurnInput) and e.turn_id == "t2"]
    assert t2_input.rolls_back == "t1"
    (cancel,) = [e for e in events if isinstance(e, CancelRequested)]
    assert cancel.turn_id == "t1" and cancel.by == "rollback"
    later = _requests_of(model, "do: work(1)")
    assert len(later) >= 3  # t2's two calls and t3's two (each shows t2)
    assert all("WRONG" not in body and "oops" not in body and "slept" not in body for body in later)
    assert any("then do: work(2)" in body for body in later)
    assert _requests_of(model, "WRONG")  # t1's own call showed it
    verified = await _verify(redis_url, namespace, model, "r1")
    assert verified.exit_code == 0, verified.output
    outputs = sum(isinstance(e, ModelOutput) for e in events)
    assert f"{outputs}/{outputs} model calls rebuilt from the stored trace match" in verified.output
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace, "OPENAI_BASE_URL": model.base_url}
    args = ["trace", "explain", "r1", "--turn", "t3", "--step", "0", "--app", "tests.support.apps:app"]
    explained = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert "left out as rolled back (busy policy rollback): turn t1" in explained.output, explained.output
    shown = await asyncio.to_thread(CliRunner().invoke, cli, ["trace", "show", "r1"], env=env)
    assert "rolls back turn t1" in shown.output


async def test_interrupt_per_turn_keeps_the_cancelled_turns_work_in_later_contexts(redis, keys, services, store, model):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="r2", turn_id="t1", agent="plan", text="KEEP SLOW do: work(1)")
    await wait_for(lambda: _model_saw(model, "SLOW"), what="the slow model request")
    await publish(redis, keys, trace_id="r2", turn_id="t2", agent="plan", text="do: work(3)", busy_policy="interrupt")
    first = await wait_reply(redis, keys, "t1")
    assert first.status == "failed" and first.code == "cancelled" and "interrupted by turn t2" in first.reason
    assert (await wait_reply(redis, keys, "t2")).status == "ended"
    t2_calls = _requests_of(model, "do: work(3)")
    assert t2_calls and all("KEEP SLOW" in body for body in t2_calls)  # t1's input is still history
    (t2_input,) = [e for e in await events_of(store, "r2") if isinstance(e, TurnInput) and e.turn_id == "t2"]
    assert t2_input.rolls_back is None


async def test_reject_per_turn_on_a_queueing_process_fails_only_that_turn(redis, keys, services, store, model):
    await services.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="r3", turn_id="t1", agent="plan", text="do: work(600)")
    await wait_for(lambda: _has_output(store, "r3", "t1"), what="t1's first model output")
    await publish(redis, keys, trace_id="r3", turn_id="t2", agent="plan", text="do: work(1)", busy_policy="reject")
    await publish(redis, keys, trace_id="r3", turn_id="t3", agent="plan", text="do: work(2)")  # the process's: queue
    rejected = await wait_reply(redis, keys, "t2")
    assert rejected.status == "failed" and rejected.code == "busy"
    assert "the turn's busy policy 'reject'" in rejected.reason and "'t1'" in rejected.reason
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    assert (await wait_reply(redis, keys, "t3")).status == "ended"
    inputs = [e.turn_id for e in await events_of(store, "r3") if isinstance(e, TurnInput)]
    assert inputs == ["t1", "t3"]


async def test_an_unknown_busy_policy_fails_the_turn_as_bad_turn_naming_the_field(redis, keys, services, store):
    await services.start("p1", "agent-loop", "tool-worker")
    body = {"trace_id": "r4", "turn_id": "t1", "agent": "plan", "text": "do: work(1)", "busy_policy": "later"}
    await redis.xadd(keys.turns_for("r4"), {TURN_FIELD: json.dumps(body).encode()})
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "failed" and reply.code == "bad_turn"
    assert "busy_policy" in reply.reason and "rollback" in reply.reason, reply.reason
    events = await events_of(store, "r4")
    assert [type(e) for e in events] == [TurnFailed]  # nothing of it entered the history


async def _has_output(store, trace_id: str, turn_id: str) -> bool:
    return any(isinstance(e, ModelOutput) and e.turn_id == turn_id for e in await events_of(store, trace_id))


async def _model_saw(model, needle: str) -> bool:
    return any(needle in body.decode() for body in model.requests)
