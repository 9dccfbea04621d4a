"""Fork a conversation, on real Redis (issue 36, item 4): the fork's trace starts with a
``forked_from`` naming its source and holds the source's events up to the point, copied in one
atomic step, once per fork id; its model calls rebuild byte for byte (``trace verify``); it goes
on as a conversation of its own (a replaced input, a model call made again); the gateway's route
is under the source's key scopes, and refuses what it cannot fork."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.errors import ForkRefused
from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.runtime.forks import fork_conversation
from agentstream.wire.checks import WireLimits
from agentstream.wire.events import ForkedFrom, ModelOutput, TurnEnded, TurnInput
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.settings import GatewaySettings
from tests.support import apps
from tests.support.gateway import ADMIN_KEY, CALC_KEY, KEYS_DOCUMENT, PLAN_KEY, auth
from tests.support.inprocess import InProcess, events_of, publish, wait_reply
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


def _env(redis_url, namespace, model) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_MODEL": "scripted-model",
    }


async def _cli(args, env):
    return await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)


async def _verified(env, trace_id: str, calls: int) -> None:
    result = await _cli(["trace", "verify", trace_id, "--app", "tests.support.apps:app"], env)
    assert result.exit_code == 0, result.output
    assert f"{calls}/{calls} model calls rebuilt from the stored trace match" in result.output


async def _two_turns(redis, keys, trace_id: str) -> None:
    await publish(redis, keys, trace_id=trace_id, turn_id="t1", agent="plan", text="FIRST do: work(1)")
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    await publish(redis, keys, trace_id=trace_id, turn_id="t2", agent="plan", text="SECOND do: work(2)")
    assert (await wait_reply(redis, keys, "t2")).status == "ended"


def _calls(events) -> int:
    return sum(isinstance(e, ModelOutput) for e in events)


async def test_a_fork_after_a_turn_holds_its_history_rebuilds_and_goes_on_alone(
    redis, keys, services, store, model, redis_url, namespace
):
    await services.start("p1", "agent-loop", "tool-worker")
    await _two_turns(redis, keys, "f1")
    env = _env(redis_url, namespace, model)
    refused = await _cli(["fork", "f1", "--turn", "nope"], env)
    assert refused.exit_code == 2 and "holds no turn 'nope' (its latest turns: t1, t2)" in refused.output
    made = await _cli(["fork", "f1", "--turn", "t1", "--to", "f1-alt"], env)
    assert made.exit_code == 0, made.output
    assert made.stdout.strip() == "f1-alt"
    source = await events_of(store, "f1")
    fork = await events_of(store, "f1-alt")
    first = fork[0]
    assert isinstance(first, ForkedFrom) and first.source_trace_id == "f1" and first.turn_id == "t1"
    t1_events = [e for e in source if getattr(e, "turn_id", None) == "t1"]
    assert fork[1:] == t1_events and first.copied == len(t1_events)  # copied as stored
    ended_at = next(entry for entry, e in await store.read("f1") if isinstance(e, TurnEnded) and e.turn_id == "t1")
    assert first.source_entry_id == ended_at
    await _verified(env, "f1-alt", _calls(fork))
    shown = await _cli(["trace", "show", "f1-alt"], env)
    assert "forked from trace f1" in shown.output and "after turn t1" in shown.output
    explained = await _cli(
        ["trace", "explain", "f1-alt", "--turn", "t1", "--step", "0", "--app", "tests.support.apps:app"], env
    )
    assert explained.exit_code == 0, explained.output
    assert "forked from trace f1" in explained.output
    # the fork goes on alone: its next turn sees t1, not the source's t2
    await publish(redis, keys, trace_id="f1-alt", turn_id="t9", agent="plan", text="ALT do: work(3)")
    assert (await wait_reply(redis, keys, "t9")).status == "ended"
    alt = [b.decode() for b in model.requests if "ALT do" in b.decode()]
    assert alt and all("FIRST" in b and "SECOND" not in b for b in alt)
    assert not any(isinstance(e, TurnInput) and e.turn_id == "t9" for e in await events_of(store, "f1"))
    await _verified(env, "f1-alt", _calls(await events_of(store, "f1-alt")))


async def test_a_fork_with_the_input_replaced_runs_the_new_input_on_the_history_before(
    redis, keys, services, store, model, redis_url, namespace
):
    await services.start("p1", "agent-loop", "tool-worker")
    await _two_turns(redis, keys, "f2")
    forked = await fork_conversation(store, "f2", turn_id="t2", text="EDITED do: work(5)", fork_id="f2-edit", by="test")
    assert forked.created and forked.forked_from.replaced and forked.turn_entry
    reply = await wait_reply(redis, keys, "t2", timeout_s=30)  # the first t2 reply is the source's
    assert reply.status == "ended"

    async def fork_ended():
        return any(isinstance(e, TurnEnded) and e.turn_id == "t2" for e in await events_of(store, "f2-edit"))

    for _ in range(300):
        if await fork_ended():
            break
        await asyncio.sleep(0.05)
    fork = await events_of(store, "f2-edit")
    inputs = [e for e in fork if isinstance(e, TurnInput)]
    assert [(i.turn_id, i.text) for i in inputs] == [("t1", "FIRST do: work(1)"), ("t2", "EDITED do: work(5)")]
    edited = [b.decode() for b in model.requests if "EDITED" in b.decode()]
    assert edited and all("FIRST" in b and "SECOND" not in b for b in edited)
    await _verified(_env(redis_url, namespace, model), "f2-edit", _calls(fork))


async def test_a_fork_before_a_model_call_makes_that_call_again(
    redis, keys, services, store, model, redis_url, namespace
):
    await services.start("p1", "agent-loop", "tool-worker")
    await _two_turns(redis, keys, "f3")
    forked = await fork_conversation(store, "f3", turn_id="t2", step=1, fork_id="f3-again")
    assert forked.created and forked.forked_from.step == 1
    for _ in range(300):
        fork = await events_of(store, "f3-again")
        if any(isinstance(e, TurnEnded) for e in fork if getattr(e, "turn_id", None) == "t2"):
            break
        await asyncio.sleep(0.05)
    fork = await events_of(store, "f3-again")
    t2_outputs = [e.step for e in fork if isinstance(e, ModelOutput) and e.turn_id == "t2"]
    assert t2_outputs == [0, 1]  # step 0 copied, step 1 made again by the fork's agent loop
    assert isinstance(fork[-1], TurnEnded) and fork[-1].turn_id == "t2"
    await _verified(_env(redis_url, namespace, model), "f3-again", _calls(fork))


async def test_a_fork_is_made_once_per_fork_id_and_never_over_another_trace(store, keys, redis):
    await store.append("f4", TurnInput(turn_id="t1", agent="calc", text="q"))
    await store.append("f4", TurnEnded(turn_id="t1", answer="a"))
    await store.append("other", TurnInput(turn_id="x", agent="calc", text="someone's"))
    first = await fork_conversation(store, "f4", turn_id="t1", fork_id="f4-x")
    again = await fork_conversation(store, "f4", turn_id="t1", fork_id="f4-x")
    assert first.created and not again.created and again.forked_from == first.forked_from
    assert len(await store.read("f4-x")) == 3  # written once
    with pytest.raises(ForkRefused, match="is a fork of another point") as other_point:
        await fork_conversation(store, "f4", turn_id="t1", text="changed", fork_id="f4-x")
    assert other_point.value.kind == "conflict"
    with pytest.raises(ForkRefused, match="exists already") as taken:
        await fork_conversation(store, "f4", turn_id="t1", fork_id="other")
    assert taken.value.kind == "conflict"
    assert len(await store.read("other")) == 1  # untouched
    results = await asyncio.gather(
        *(fork_conversation(store, "f4", turn_id="t1", fork_id="f4-race", expire_ms=60_000) for _ in range(8))
    )
    assert sum(r.created for r in results) == 1 and len(await store.read("f4-race")) == 3
    assert 0 < await redis.pttl(keys.trace("f4-race")) <= 60_000  # retention, as for any trace
    assert 0 < await redis.pttl(keys.trace_keys("f4-race")) <= 60_000


# --- the gateway ---------------------------------------------------------------------------------


def _client(store, keys, **limits):
    settings = Settings(namespace=keys.namespace, **limits)
    api = create_api(apps.app, settings, GatewaySettings(keys=KEYS_DOCUMENT), store, load_keys(text=KEYS_DOCUMENT))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway")


async def _calc_conversation(store, trace_id: str) -> None:
    await store.append(trace_id, TurnInput(turn_id="t1", agent="calc", text="2 + 2?"))
    await store.append(trace_id, TurnEnded(turn_id="t1", answer="4"))
    await store.append(trace_id, TurnInput(turn_id="t2", agent="calc", text="3 + 3?"))


async def test_the_gateway_forks_under_the_source_keys_scopes(store, keys):
    await _calc_conversation(store, "g1")
    async with _client(store, keys) as client:
        made = await client.post(
            "/v1/traces/g1/forks", json={"turn_id": "t1", "fork_id": "g1-f"}, headers=auth(CALC_KEY)
        )
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["trace_id"] == "g1-f" and body["created"] and body["copied"] == 2
        assert body["stream_url"] == "/v1/traces/g1-f/stream"
        again = await client.post(
            "/v1/traces/g1/forks", json={"turn_id": "t1", "fork_id": "g1-f"}, headers=auth(CALC_KEY)
        )
        assert again.status_code == 201 and not again.json()["created"]
        trace = await client.get("/v1/traces/g1-f", headers=auth(CALC_KEY))
        assert trace.status_code == 200, trace.text  # the fork is the key's conversation too
    first = (await store.read("g1-f"))[0][1]
    assert isinstance(first, ForkedFrom) and first.by == "gateway:calc-backend"


@pytest.mark.parametrize(
    ("headers", "body", "status", "says"),
    [
        ({}, {"turn_id": "t1"}, 401, "a valid API key is needed"),
        (auth("ask_wrong-0123456789abcdef0123456789abcdef"), {"turn_id": "t1"}, 401, "a valid API key"),
        (
            auth(PLAN_KEY),
            {"turn_id": "t1"},
            404,
            "no trace 'g2' among this key's conversations",
        ),  # no scope on the source
        (auth(CALC_KEY), {"turn_id": "nope"}, 404, "holds no turn 'nope'"),
        (auth(CALC_KEY), {"turn_id": "t1", "step": 7}, 404, "has no model call 7"),
        (auth(CALC_KEY), {"turn_id": "t2"}, 409, "has not ended"),
        (auth(CALC_KEY), {"turn_id": "t1", "fork_id": "g2"}, 422, "trace id of its own"),
        (auth(CALC_KEY), {"turn_id": "t1", "fork_id": "a/b"}, 422, "cannot name a trace"),
        (auth(CALC_KEY), {"turn_id": "t1", "step": 0, "text": "x"}, 422, "not both"),
        (auth(CALC_KEY), {"turn_id": "t1", "text": "x" * 3000}, 413, "AGENTSTREAM_MAX_TURN_BYTES"),
        (auth(CALC_KEY), {"turn_id": ""}, 422, "turn_id"),
        (auth(CALC_KEY), {"turn_id": "t1", "step": -1}, 422, "step"),
        (auth(CALC_KEY), {"turn_id": "t1", "step": True}, 422, "step"),  # not read as 1
        (auth(CALC_KEY), {"turn_id": "t1", "fork_id": "g2-a\u0000b"}, 422, "control"),  # as a turn's trace id
        # the wire's limit is in UTF-8 bytes: 200 characters of 2 bytes are over 256
        (auth(CALC_KEY), {"turn_id": "t1", "fork_id": "é" * 200}, 422, "a fork id is 400 bytes, over the limit"),
        (auth(CALC_KEY), {"turn_id": "t1", "fork_id": "g2-" + "f" * 300}, 422, "AGENTSTREAM_MAX_ID_BYTES=256"),
        (auth(CALC_KEY), {"turn_id": "t" * 300}, 422, "a turn id is 300 bytes"),
    ],
)
async def test_the_gateway_refuses_a_fork_it_cannot_make(store, keys, headers, body, status, says):
    await _calc_conversation(store, "g2")
    async with _client(store, keys, max_turn_bytes=2048) as client:
        got = await client.post("/v1/traces/g2/forks", json=body, headers=headers)
    assert got.status_code == status, got.text
    assert says in got.text, got.text
    assert not [k for k in await store.redis.keys(f"{keys.namespace}:*") if b"g2-" in k or b"a/b" in k]


async def test_a_replaced_input_needs_the_right_to_its_agent(store, keys):
    await store.append("g3", TurnInput(turn_id="t1", agent="plan", text="plan it"))
    await store.append("g3", TurnEnded(turn_id="t1", answer="done"))
    async with _client(store, keys) as client:
        assert (
            await client.post("/v1/traces/g3/forks", json={"turn_id": "t1", "text": "again"}, headers=auth(CALC_KEY))
        ).status_code == 404
        made = await client.post(
            "/v1/traces/g3/forks", json={"turn_id": "t1", "text": "again", "fork_id": "g3-f"}, headers=auth(ADMIN_KEY)
        )
        assert made.status_code == 201 and made.json()["turn_entry"]
    published = await store.redis.xrange(keys.turns_for("g3-f"))
    assert [json.loads(f[b"turn"])["text"] for _, f in published] == ["again"]


@pytest.mark.parametrize("how", [{}, {"step": 0}, {"text": "again"}])
async def test_no_fork_is_made_that_a_turn_could_not_reach(store, keys, how):
    """A fork id over ``AGENTSTREAM_MAX_ID_BYTES`` (every later turn to it would be refused) is
    refused by the fork itself, whoever calls it, and nothing is written."""
    await _calc_conversation(store, "g9")
    for fork_id in ("g9-" + "f" * 300, "é" * 200):
        with pytest.raises(ForkRefused) as refused:
            await fork_conversation(store, "g9", turn_id="t1", fork_id=fork_id, **how)
        assert refused.value.kind == "invalid" and "over the limit AGENTSTREAM_MAX_ID_BYTES=256" in str(refused.value)
    if not how:
        wider = WireLimits(max_id_bytes=512)
        made = await fork_conversation(store, "g9", turn_id="t1", fork_id="g9-" + "f" * 300, limits=wider)
        assert made.created  # under a configured limit that holds it, it is a fork as any other
    assert not [k for k in await store.redis.keys(f"{keys.namespace}:*") if "é".encode() in k]


@pytest.mark.parametrize("how", [[], ["--step", "0"]])
async def test_the_fork_command_refuses_a_fork_id_no_turn_could_reach_before_anything_is_written(
    store, keys, redis_url, namespace, how, capsys, monkeypatch
):
    """``fork --to`` over ``AGENTSTREAM_MAX_ID_BYTES`` made the fork and exited 0; every later
    turn to it was refused. Now exit 2, naming --to, with the wire's reason; nothing written."""
    from agentstream.cli import commands as cli_module

    await _calc_conversation(store, "g8")
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    for fork_id in ("g8-" + "f" * 300, "é" * 200):
        with pytest.raises(SystemExit) as exited:
            await asyncio.to_thread(cli_module.main, ["fork", "g8", "--turn", "t1", "--to", fork_id, *how])
        err = capsys.readouterr().err
        assert exited.value.code == 2, err
        assert "'--to'" in err and "over the limit AGENTSTREAM_MAX_ID_BYTES=256" in err, err
    assert not [k for k in await store.redis.keys(f"{keys.namespace}:*") if b"fff" in k or "é".encode() in k]
    monkeypatch.setenv("AGENTSTREAM_MAX_ID_BYTES", "512")  # the configured limit, not a constant
    wider = await _cli(["fork", "g8", "--turn", "t1", "--to", "g8-" + "f" * 300], dict(os.environ))
    assert wider.exit_code == 0, wider.output
