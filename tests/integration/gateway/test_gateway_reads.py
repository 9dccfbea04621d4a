"""What a gateway request reads of a trace (issue 12): publishing a turn and waiting for a reply
check the key's right to the conversation and find the reply from the trace's fold, reading only
what was appended since the gateway last looked; a conversation deleted by retention and started
again under the same id is folded anew (its agents are the new ones)."""

from __future__ import annotations

import json

import httpx
import pytest

from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.wire.events import TurnEnded, TurnInput
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.settings import GatewaySettings
from tests.integration.test_step_cost import _Recorder, _text
from tests.support.apps import app
from tests.support.gateway import CALC_KEY, KEYS_DOCUMENT, auth

pytestmark = pytest.mark.integration


def _client(store, keys):
    settings = Settings(namespace=keys.namespace)
    api = create_api(app, settings, GatewaySettings(keys=KEYS_DOCUMENT), store, load_keys(text=KEYS_DOCUMENT))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway")


def _trace_reads(recorder: _Recorder, trace_key: str) -> list[str]:
    """Where each XRANGE of the trace started ("-": from its first entry)."""
    return [
        _text(c[2])
        for c in recorder.commands
        if _text(c[0]).upper() == "XRANGE" and _text(c[1]) == trace_key and "COUNT" not in map(_text, c[3:])
    ]


async def test_publishing_and_waiting_read_only_what_came_since_the_last_request(store, keys, redis):
    for n in range(40):  # a long conversation
        await store.append("g1", TurnInput(turn_id=f"t{n}", agent="calc", text=f"question {n}"))
        await store.append("g1", TurnEnded(turn_id=f"t{n}", answer=f"answer {n}"))
    recorder = _Recorder(store.redis)
    try:
        async with _client(store, keys) as client:
            for n in range(5):
                got = await client.get(
                    f"/v1/traces/g1/turns/t{n}/reply", params={"timeout_s": 0}, headers=auth(CALC_KEY)
                )
                assert got.status_code == 200 and got.json()["answer"] == f"answer {n}"
                body = json.dumps({"trace_id": "g1", "turn_id": f"new{n}", "agent": "calc", "text": "more"})
                assert (await client.post("/v1/turns", content=body, headers=auth(CALC_KEY))).status_code == 202
                await store.append(
                    "g1", TurnInput(turn_id=f"new{n}", agent="calc", text="more")
                )  # as the agent loop does
                await store.append("g1", TurnEnded(turn_id=f"new{n}", answer=f"more {n}"))
                got = await client.get(
                    f"/v1/traces/g1/turns/new{n}/reply", params={"timeout_s": 0}, headers=auth(CALC_KEY)
                )
                assert got.status_code == 200 and got.json()["answer"] == f"more {n}"
    finally:
        recorder.close()
    reads = _trace_reads(recorder, keys.trace("g1"))
    assert len(reads) == 15 and reads.count("-") == 1, reads  # the trace was read whole once, by the first request


async def test_a_conversation_deleted_and_started_again_is_folded_anew(store, keys, redis):
    await store.append("g2", TurnInput(turn_id="t1", agent="calc", text="question"))
    await store.append("g2", TurnEnded(turn_id="t1", answer="answer"))
    async with _client(store, keys) as client:
        got = await client.get("/v1/traces/g2/turns/t1/reply", params={"timeout_s": 0}, headers=auth(CALC_KEY))
        assert got.status_code == 200
        await redis.delete(keys.trace("g2"), keys.trace_keys("g2"))  # retention
        await store.append("g2", TurnInput(turn_id="t2", agent="plan", text="someone else's"))
        await store.append("g2", TurnEnded(turn_id="t2", answer="not for calc"))
        got = await client.get("/v1/traces/g2/turns/t2/reply", params={"timeout_s": 0}, headers=auth(CALC_KEY))
        assert got.status_code == 404  # the new conversation is plan's: the old fold's agents do not count
        body = json.dumps({"trace_id": "g2", "turn_id": "t3", "agent": "calc", "text": "let me in"})
        assert (await client.post("/v1/turns", content=body, headers=auth(CALC_KEY))).status_code == 403
