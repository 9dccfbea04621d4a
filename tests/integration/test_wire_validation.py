"""Turn validation (empty text), the wire schemas, malformed work entries on the errors stream,
and what a trace and a reply say about an answer cut off by the output limit or a late result."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from agentstream.agent_loop.loop import AgentLoop
from agentstream.cli.commands import Describer, cli
from agentstream.errors import TurnRejected
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, Reply, ToolCall, ToolOutput, TurnEnded, TurnInput
from agentstream.wire.keys import WAKE_FIELD
from agentstream_services.compaction.compactor import Compactor
from agentstream_services.tool_worker.worker import ToolWorker
from tests.support import apps
from tests.support.inprocess import InProcess, errors_of, publish, replies, wait_for, wait_reply
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_a_turn_with_empty_text_is_rejected_naming_the_field(text):
    payload = json.dumps({"trace_id": "c", "turn_id": "t", "agent": "calc", "text": text})
    with pytest.raises(TurnRejected) as caught:
        codec.decode_turn(payload)
    assert "$.text" in caught.value.reason
    assert (caught.value.trace_id, caught.value.turn_id) == ("c", "t")  # so the turn fails bad_turn in its trace


def test_the_schemas_show_the_constraints_and_the_reply():
    runner = CliRunner()
    turn = json.loads(runner.invoke(cli, ["schema", "turn"]).output)
    props = turn["$defs"]["TurnMessage"]["properties"]
    assert all(props[name]["minLength"] == 1 for name in ("trace_id", "turn_id", "agent"))
    assert {"type": "string", "minLength": 1} in props["text"]["anyOf"]  # `text`, or the typed `input`
    result = runner.invoke(cli, ["schema", "reply"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output)["$defs"]["Reply"]
    assert {"status", "answer", "code", "reason", "stop_reason"} <= set(reply["properties"])
    assert (
        codec.decode_reply(codec.encode(Reply(trace_id="c", turn_id="t", status="ended", answer="a"))).stop_reason
        is None
    )


async def test_work_entries_without_their_field_are_reported_by_name(store, redis, keys):
    loop = AgentLoop(apps.app, store, {})
    await loop.on_wake("1-0", {b"trace": b"c1"})
    await loop.on_cancel("2-0", {b"trace": b"c1"})
    await ToolWorker(apps.app, store).on_job("3-0", {b"jbo": b"{}"})
    await Compactor(apps.app, store, {}).on_job("4-0", {})
    await loop.on_turn("5-0", {b"text": b"hello", b"agent": b"calc"})
    errors = await errors_of(redis, keys)
    assert len(errors) == 5, errors
    for error, field in zip(errors[:4], ["wake", "cancel", "job", "compaction"], strict=True):
        assert f"entry has no field '{field}'" in error["error"] and "truncated" not in error["error"], error
    assert json.loads(errors[0]["payload"]) == {"trace": "c1"}
    turn_error = errors[4]
    assert "has no field 'turn'" in turn_error["error"]
    assert json.loads(turn_error["payload"]) == {"text": "hello", "agent": "calc"}  # what arrived, for an operator
    assert WAKE_FIELD == b"wake"


def test_trace_lines_mark_a_cut_off_answer_and_a_late_result():
    describer = Describer()
    lines = [
        describer(e)
        for e in [
            TurnInput(turn_id="t1", agent="calc", text="hi"),
            ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="slow", arguments="{}"),)),
            ModelOutput(turn_id="t1", step=1, content="the answer is 4", stop_reason="length"),
            TurnEnded(turn_id="t1", answer="the answer is 4"),
            ToolOutput(turn_id="t1", call_id="c1", name="slow", text="done"),
            TurnInput(turn_id="t2", agent="calc", text="again"),
            ModelOutput(turn_id="t2", step=0, content="5"),
            TurnEnded(turn_id="t2", answer="5"),
        ]
    ]
    assert "length: cut off by the output limit" in lines[2]
    assert lines[3].startswith("✓ answer (cut off by the output limit): the answer is 4")
    assert "late: it arrived after its turn had ended" in lines[4]
    assert lines[7] == "✓ answer: 5"


async def test_trace_show_prints_the_marks(store, redis_url, namespace):
    for event in [
        TurnInput(turn_id="t1", agent="calc", text="hi"),
        ModelOutput(turn_id="t1", step=0, content="abc", stop_reason="length"),
        TurnEnded(turn_id="t1", answer="abc"),
    ]:
        await store.append("cut", event)
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["trace", "show", "cut"],
        env={"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace},
    )
    assert result.exit_code == 0 and "✓ answer (cut off by the output limit): abc" in result.output, result.output


def cut_off_rule(body):
    return {"message": {"role": "assistant", "content": "The answer is"}, "finish_reason": "length"}


async def test_the_reply_of_a_cut_off_answer_carries_its_stop_reason(redis_url, namespace, redis, keys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    with ScriptedModelServer(cut_off_rule) as model:
        services = InProcess(
            apps.app,
            redis_url,
            namespace,
            model.base_url,
            env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
        )
        try:
            await services.start("p1", "agent-loop")
            await publish(redis, keys, trace_id="c", turn_id="t1", agent="calc", text="what is 2 + 2?")
            reply = await wait_reply(redis, keys, "t1")
        finally:
            await services.stop_all()
    assert reply.status == "ended" and reply.answer == "The answer is" and reply.stop_reason == "length", reply


HASH_TAG_BREAKERS = ["}x", "x}", "{x", "a}b{c", "{}", "x}:trace:{y"]
DOT_SEGMENTS = [".", "..", "a/..", "../b", "a/./b", "a/../../traces/victim"]
KEY_NAME_CHARACTERS = ["a:b", "a*b?[c]", "a b", "ü-ß", "a/b.c", "..x", "x..", "%2E%2E", "a\\b", "#1"]


async def test_ids_that_would_break_a_key_name_are_refused_bad_turn_and_others_answered(
    redis_url, namespace, redis, keys, store, scripted_model
):
    """Issue 33, items 4 and 9 (single Redis and, with AGENTSTREAM_TEST_REDIS=cluster, a cluster):
    a trace id that closes the hash tag early split a trace's keys across slots, so the turn was
    dead-lettered with CROSSSLOT and nobody heard of it. Each is refused on the errors stream,
    naming the field, and nothing is written under a key it would name; every other character
    of key names is a trace like any other."""
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    refused = HASH_TAG_BREAKERS + DOT_SEGMENTS
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        for i, trace_id in enumerate(refused):
            await publish(redis, keys, trace_id=trace_id, turn_id=f"bad-{i}", agent="calc", text="What is 6 * 7?")
        for i, trace_id in enumerate(KEY_NAME_CHARACTERS):
            await publish(redis, keys, trace_id=trace_id, turn_id=f"good-{i}", agent="calc", text="What is 6 * 7?")
        for i, trace_id in enumerate(KEY_NAME_CHARACTERS):
            reply = await wait_reply(redis, keys, f"good-{i}")
            assert reply.status == "ended" and reply.trace_id == trace_id and "42" in reply.answer, reply
        errors = await wait_for(
            lambda: _errors_when(redis, keys, len(refused)), what=f"{len(refused)} refusals on the errors stream"
        )
    finally:
        await services.stop_all()
    for trace_id in refused:
        (error,) = [e for e in errors if f"`$.trace_id` is {trace_id!r}" in e["error"]]
        assert "hash tag" in error["error"] or "'..' part" in error["error"], error
        assert not await redis.exists(keys.trace(trace_id)), trace_id
    assert not any(r.turn_id.startswith("bad-") for r in (await replies(redis, keys)).values())
    for stream in keys.partitions_of(keys.turns):  # nothing left behind: no dead letter, nothing pending
        assert not await redis.exists(keys.dead(stream)), stream


async def _errors_when(redis, keys, count: int):
    errors = await errors_of(redis, keys)
    return errors if len(errors) >= count else None


def test_a_cancel_naming_such_a_trace_is_not_read():
    import msgspec

    for trace_id in HASH_TAG_BREAKERS + DOT_SEGMENTS:
        with pytest.raises(msgspec.DecodeError, match="trace_id"):
            codec.decode_cancel(json.dumps({"trace_id": trace_id}).encode())
    assert codec.decode_cancel(b'{"trace_id": "a:b/c.d"}').trace_id == "a:b/c.d"


def test_a_child_trace_of_a_dot_call_id_has_no_dot_segment():
    from agentstream.delegation import child_trace_id
    from agentstream.wire.keys import trace_id_problem

    for call_id in (".", "..", "}", "a/../b"):
        assert trace_id_problem(child_trace_id("conv", call_id)) is None, call_id
