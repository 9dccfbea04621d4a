"""Gateway keys confined to one backend's conversations (issue 33, item 2): a key with ``backend``
publishes, reads, lists and cancels only trace ids under its backend's prefix and names only its
replies streams, by the agent loop's own rule (agentstream.wire.backends); a key for every agent
with a backend does not read the dead letters."""

from __future__ import annotations

import json

import httpx
import pytest

from agentstream.errors import ConfigError
from agentstream.ops.apikeys import hash_key, load_keys
from agentstream.ops.settings import Settings
from agentstream.runtime import conversations
from agentstream.wire.events import TurnInput
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.settings import GatewaySettings
from tests.support.apps import app
from tests.support.gateway import auth

pytestmark = pytest.mark.integration

A_KEY = "ask_test-backend7-0123456789abcdef0123456789abcdef"
B_KEY = "ask_test-backend8-0123456789abcdef0123456789abcdef"
DOCUMENT = json.dumps(
    {
        "keys": [
            {"name": "seven", "sha256": hash_key(A_KEY), "agents": ["*"], "backend": "backend-7"},
            {"name": "eight", "sha256": hash_key(B_KEY), "agents": ["calc"], "backend": "backend-8"},
        ]
    }
)


def _client(store, keys):
    settings = Settings(namespace=keys.namespace, backends="backend-7,backend-8")
    api = create_api(app, settings, GatewaySettings(keys=DOCUMENT), store, load_keys(text=DOCUMENT))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway")


def _turn(**fields) -> str:
    return json.dumps({"agent": "calc", "text": "What is 6 * 7?", **fields})


async def test_a_backend_key_reaches_only_its_backends_conversations(store, keys):
    private = "backend-8:private"
    await store.append(private, TurnInput(turn_id="t1", agent="calc", text="B's secret"))
    await conversations.note_turn(store, private)
    await store.append("backend-7:mine", TurnInput(turn_id="t1", agent="calc", text="A's own"))
    await conversations.note_turn(store, "backend-7:mine")
    replies_b = f"{keys.replies}:backend-8"
    async with _client(store, keys) as client:
        a = auth(A_KEY)
        for body in (
            _turn(trace_id=private, turn_id="t2"),  # into B's conversation
            _turn(trace_id="backend-7:new", turn_id="t1", reply_to=replies_b),  # onto B's replies
            _turn(trace_id="unconfined", turn_id="t1"),  # outside any backend
        ):
            got = await client.post("/v1/turns", content=body, headers=a)
            assert got.status_code == 403 and "backend-7" in got.json()["detail"], got.text
        for path in (f"/v1/traces/{private}", f"/v1/traces/{private}/turns/t1/reply?timeout_s=0"):
            assert (await client.get(path, headers=a)).status_code == 404, path
        got = await client.post(f"/v1/traces/{private}/cancel", json={}, headers=a)
        assert got.status_code == 404, got.text
        listed = (await client.get("/v1/conversations", headers=a)).json()["conversations"]
        assert [c["trace_id"] for c in listed] == ["backend-7:mine"]
        assert (await client.get("/v1/dead-letters", headers=a)).status_code == 403  # "*" with a backend
        assert not await store.redis.exists(keys.trace("backend-7:new"), keys.trace("unconfined"))
        # its own: published, read
        ok = await client.post("/v1/turns", content=_turn(trace_id="backend-7:mine", turn_id="t2"), headers=a)
        assert ok.status_code == 202, ok.text
        assert (await client.get("/v1/traces/backend-7:mine", headers=a)).status_code == 200
        # and B's key sees its own conversation, not A's
        b = auth(B_KEY)
        assert (await client.get(f"/v1/traces/{private}", headers=b)).status_code == 200
        assert (await client.get("/v1/traces/backend-7:mine", headers=b)).status_code == 404
        listed = (await client.get("/v1/conversations", headers=b)).json()["conversations"]
        assert [c["trace_id"] for c in listed] == [private]


@pytest.mark.parametrize("backend", ["a:b", "", "a b", "a{b}", 7])
def test_a_key_names_a_usable_backend(backend):
    document = json.dumps({"keys": [{"name": "k", "sha256": "0" * 64, "agents": ["calc"], "backend": backend}]})
    with pytest.raises(ConfigError, match="backend"):
        load_keys(text=document)


async def test_a_backend_key_forks_only_into_its_backends_conversations(store, keys):
    from agentstream.wire.events import ForkedFrom, TurnEnded

    mine = "backend-7:mine"
    await store.append(mine, TurnInput(turn_id="t1", agent="calc", text="A's own"))
    await store.append(mine, TurnEnded(turn_id="t1", answer="42"))
    async with _client(store, keys) as client:
        a = auth(A_KEY)
        for fork_id in ("elsewhere", "backend-8:taken-over"):
            got = await client.post(f"/v1/traces/{mine}/forks", json={"turn_id": "t1", "fork_id": fork_id}, headers=a)
            assert got.status_code == 403, got.text
            assert not await store.read(fork_id)
        made = await client.post(f"/v1/traces/{mine}/forks", json={"turn_id": "t1"}, headers=a)
        assert made.status_code == 201, made.text
        assert made.json()["trace_id"].startswith("backend-7:mine.fork-")  # the default stays in the backend
        stolen = await client.post(f"/v1/traces/{mine}/forks", json={"turn_id": "t1"}, headers=auth(B_KEY))
        assert stolen.status_code == 404  # B may not see A's conversation, so not fork it
    first = (await store.read(made.json()["trace_id"]))[0][1]
    assert isinstance(first, ForkedFrom) and first.source_trace_id == mine
