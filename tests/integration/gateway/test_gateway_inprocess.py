"""The gateway's ASGI app in the test's event loop (httpx's ASGI transport) on a real Redis: CORS
when origins are configured, readiness, the recent-conversations index, rate-limit windows."""

from __future__ import annotations

import socket

import httpx
import pytest
import redis.asyncio as aioredis

from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.runtime import conversations, ratelimit
from agentstream.runtime.store import TraceStore
from agentstream.steps.timeline import conversation_filter
from agentstream.wire.events import TaskInput, TurnEnded, TurnInput
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.settings import GatewaySettings
from tests.support.apps import app
from tests.support.gateway import ADMIN_KEY, CALC_KEY, KEYS_DOCUMENT, auth

pytestmark = pytest.mark.integration


def _client(store, keys, **gateway):
    settings = Settings(namespace=keys.namespace)
    api = create_api(
        app, settings, GatewaySettings(keys=KEYS_DOCUMENT, **gateway), store, load_keys(text=KEYS_DOCUMENT)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway")


async def test_cors_answers_only_the_configured_origins(store, keys):
    async with _client(store, keys, cors_origins="https://ops.example.com") as client:
        allowed = await client.options(
            "/v1/turns",
            headers={
                "Origin": "https://ops.example.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert (
            allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://ops.example.com"
        )
        other = await client.options(
            "/v1/turns", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in other.headers
        plain = await client.get("/v1/agents", headers={**auth(CALC_KEY), "Origin": "https://ops.example.com"})
        assert plain.headers["access-control-allow-origin"] == "https://ops.example.com"


async def test_conversations_list_newest_first_and_pages(store, keys):
    for i in range(5):
        trace_id = f"c{i}"
        await store.append(trace_id, TurnInput(turn_id="t", agent="calc", text=f"question {i}"))
        if i % 2:
            await store.append(trace_id, TurnEnded(turn_id="t", answer=f"answer {i}"))
        await conversations.note_turn(store, trace_id, at_ms=1_000 + i)
    await conversations.note_turn(store, "gone", at_ms=2_000)  # deleted by retention: left out
    async with _client(store, keys) as client:
        first = (await client.get("/v1/conversations", params={"limit": 3}, headers=auth(CALC_KEY))).json()
        assert [c["trace_id"] for c in first["conversations"]] == ["c4", "c3", "c2"]  # "gone" is skipped
        assert first["next_before_ms"] == 1_002
        rest = (
            await client.get("/v1/conversations", params={"before_ms": first["next_before_ms"]}, headers=auth(CALC_KEY))
        ).json()
        assert [(c["trace_id"], c["state"]) for c in rest["conversations"]] == [("c1", "ended"), ("c0", "running")]
        assert rest["next_before_ms"] is None  # the index holds no older one


async def _filtered(client, key=CALC_KEY, **params):
    response = await client.get("/v1/conversations", params=params, headers=auth(key))
    assert response.status_code == 200, response.text
    body = response.json()
    return [c["trace_id"] for c in body["conversations"]], body["next_before_ms"]


async def test_conversations_are_found_by_agent_state_time_and_metadata(store, keys):
    rows = [  # trace, agent, ended, metadata, index time
        ("f0", "calc", True, {"team": "red", "ticket": "a=1"}, 1_000),
        ("f1", "plan", False, {"team": "red"}, 1_001),
        ("f2", "calc", False, {"team": "blue"}, 1_002),
        ("f3", "calc", True, {"team": "red"}, 1_003),
        ("f4", "plan", True, {}, 1_004),
    ]
    for trace_id, agent, ended, metadata, at in rows:
        await store.append(trace_id, TurnInput(turn_id="t", agent=agent, text="q", metadata=metadata))
        if ended:
            await store.append(trace_id, TurnEnded(turn_id="t", answer="a"))
        await conversations.note_turn(store, trace_id, at_ms=at)
    async with _client(store, keys) as client:
        admin = ADMIN_KEY
        assert await _filtered(client, admin, agent="calc") == (["f3", "f2", "f0"], None)
        assert await _filtered(client, admin, state="ended") == (["f4", "f3", "f0"], None)
        assert await _filtered(client, admin, meta="team=red") == (["f3", "f1", "f0"], None)
        assert await _filtered(client, admin, meta=["team=red", "ticket=a=1"]) == (["f0"], None)  # "=" in a value
        assert await _filtered(client, admin, agent="calc", state="ended", meta="team=red") == (["f3", "f0"], None)
        assert await _filtered(client, admin, after_ms=1_001, before_ms=1_004) == (["f3", "f2", "f1"], None)
        # pages of a filter: each full page says where the next starts
        assert await _filtered(client, admin, state="ended", limit=2) == (["f4", "f3"], 1_003)
        assert await _filtered(client, admin, state="ended", limit=2, before_ms=1_003) == (["f0"], None)
        # the key's scope holds under a filter: calc's key never sees plan's conversations
        assert await _filtered(client, CALC_KEY, meta="team=red") == (["f3", "f0"], None)
        assert await _filtered(client, CALC_KEY, agent="plan") == ([], None)
        rows_out = (await client.get("/v1/conversations", params={"agent": "calc"}, headers=auth(admin))).json()
        assert rows_out["conversations"][0]["metadata"] == {"team": "red"}


async def test_a_rare_filter_answers_a_short_page_with_where_to_go_on(store, keys):
    for i in range(30):
        trace_id = f"r{i}"
        await store.append(trace_id, TurnInput(turn_id="t", agent="calc", text="q", metadata={"n": str(i)}))
        await conversations.note_turn(store, trace_id, at_ms=10_000 + i)
    found, cursor = await conversations.find(
        store, limit=5, keep=_keep_all, where=conversation_filter(meta=["n=3"]), scan_max=10
    )
    assert found == [] and cursor == 10_020  # read 10 entries (29..20), none matched: go on from there
    found, cursor = await conversations.find(
        store, limit=5, keep=_keep_all, where=conversation_filter(meta=["n=3"]), before_ms=10_004, scan_max=10
    )
    assert [s.trace_id for s in found] == ["r3"] and cursor is None


async def _keep_all(state) -> bool:
    return True


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"state": "sleeping"}, "state must be one of running"),
        ({"agent": ""}, "agent"),
        ({"agent": "x" * 257}, "agent"),
        ({"meta": "no-equals"}, "meta must be key=value, got 'no-equals'"),
        ({"meta": "=value"}, "meta must be key=value"),
        ({"meta": [f"k{i}=v" for i in range(9)]}, "at most 8 times"),
        ({"meta": "k=" + "v" * 513}, "a value at most 512"),
        ({"meta": "k" * 129 + "=v"}, "a key is at most 128"),
        ({"after_ms": "-1"}, "after_ms"),
        ({"after_ms": "soon"}, "after_ms"),
        ({"before_ms": str(2**60)}, "before_ms"),
        ({"after_ms": "2000", "before_ms": "1000"}, "after_ms (2000) must be before before_ms (1000)"),
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
    ],
)
async def test_conversation_filters_refuse_bad_values_and_say_which(store, keys, params, says):
    async with _client(store, keys) as client:
        response = await client.get("/v1/conversations", params=params, headers=auth(CALC_KEY))
        assert response.status_code == 422, response.text
        assert says in response.text
        anonymous = await client.get("/v1/conversations", params={"agent": "calc"})
        assert anonymous.status_code == 401


async def test_the_index_is_capped(store):
    for i in range(12):
        await conversations.note_turn(store, f"t{i}", at_ms=i, keep=10)
    ids = [t for t, _ in await conversations.recent_ids(store, limit=50)]
    assert ids == [f"t{i}" for i in range(11, 1, -1)]


async def test_rate_windows_are_fixed_per_key(redis, keys):
    decisions = [await ratelimit.hit(redis, keys, "k", limit=2, window_s=60, now_s=120.5) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False] and decisions[2].retry_after_s == 60
    assert (await ratelimit.hit(redis, keys, "k", limit=2, window_s=60, now_s=180.0)).allowed  # the next window
    assert (await ratelimit.hit(redis, keys, "other", limit=2, window_s=60, now_s=120.5)).allowed
    assert 0 < await redis.ttl(keys.gateway_rate("k", 2)) <= 120


async def test_a_trace_without_a_turn_is_visible_only_to_an_all_agents_key(store, keys):
    from agentstream.wire.events import ToolOutput
    from tests.support.gateway import ADMIN_KEY

    await store.append("orphan", ToolOutput(turn_id="t", call_id="c", name="calculator", text="secret result"))
    async with _client(store, keys) as client:
        for path in ("/v1/traces/orphan", "/v1/traces/orphan/turns/t/reply?timeout_s=0"):
            refused = await client.get(path, headers=auth(CALC_KEY))
            assert refused.status_code == 404 and "secret" not in refused.text, path
        assert (await client.get("/v1/traces/orphan", headers=auth(ADMIN_KEY))).status_code == 200


async def test_a_turn_whose_input_its_agent_does_not_take_is_refused_at_the_gateway(store, keys):
    async with _client(store, keys) as client:
        for body, why in [
            (
                {
                    "trace_id": "g-in",
                    "turn_id": "t1",
                    "agent": "calc",
                    "input": {"text": "2+2", "tools": {"calculator": "off"}},
                },
                "unknown field `$.input.tools`",
            ),  # calc takes plain text: a `tools` field is not its type's
            ({"trace_id": "g-in", "turn_id": "t1", "agent": "calc", "input": {"txt": "2+2"}}, "`$.input.txt`"),
        ]:
            refused = await client.post("/v1/turns", json=body, headers=auth(CALC_KEY))
            assert refused.status_code == 422 and why in refused.text, refused.text
        accepted = await client.post(
            "/v1/turns",
            json={"trace_id": "g-in", "turn_id": "t1", "agent": "calc", "input": {"text": "2+2"}},
            headers=auth(CALC_KEY),
        )
        assert accepted.status_code == 202, accepted.text


async def test_a_turn_for_a_child_trace_id_is_refused_at_the_gateway(store, keys):
    # `<conversation>/<call id>` is a child trace's id: a key that may see the conversation could
    # otherwise post into its subagent's context, or begin that child's trace before its call did
    await store.append("g-p", TurnInput(turn_id="t1", agent="calc", text="hi"))
    await store.append(
        "g-p/call_1",
        TaskInput(
            turn_id="k1",
            agent="calc",
            text="sub",
            call_id="call_1",
            parent_trace_id="g-p",
            parent_turn_id="t1",
            root_trace_id="g-p",
            delegation="d",
        ),
    )
    async with _client(store, keys) as client:
        for trace_id, why in [
            ("g-p/call_1", "a child trace (opened by delegation 'd'"),
            ("g-p/call_2", "form of a child trace of conversation 'g-p'"),
        ]:
            body = {"trace_id": trace_id, "turn_id": "x1", "agent": "calc", "text": "2+2"}
            refused = await client.post("/v1/turns", json=body, headers=auth(CALC_KEY))
            assert refused.status_code == 422 and why in refused.text, refused.text
        own = await client.post(
            "/v1/turns",
            json={"trace_id": "g-org/conv-7", "turn_id": "t1", "agent": "calc", "text": "2+2"},
            headers=auth(CALC_KEY),
        )
        assert own.status_code == 202, own.text
    published = [await store.redis.xlen(s) for s in keys.partitions_of(keys.turns) if await store.redis.exists(s)]
    assert sum(published) == 1  # the own conversation's turn only


async def test_the_reply_is_the_wires_own_with_its_citations_and_a_dead_letter_is_deadletters_own(store, redis, keys):
    """One source of truth (issue 15): the gateway's reply is ``events.Reply`` as the agent loop
    publishes it (citations included), its OpenAPI schema is the wire's, and a dead letter is
    ``deadletters.DeadLetter`` with every field."""
    import dataclasses

    import msgspec

    from agentstream.runtime.deadletters import DeadLetter
    from agentstream.wire import codec
    from agentstream.wire.events import CitedSource, Reply
    from tests.support.gateway import ADMIN_KEY

    cited = CitedSource(
        number=1, id="https://example.com/a", kind="source", title="A", url="https://example.com/a", spans=((0, 5),)
    )
    await store.append("cites", TurnInput(turn_id="t", agent="calc", text="q", metadata={"user": "u7"}))
    await store.append("cites", TurnEnded(turn_id="t", answer="Paris", citations=(cited,)))
    await redis.xadd(
        keys.dead(keys.turns),
        {
            b"turn": b'{"trace_id":"dead-1"}',
            b"dead_source_stream": keys.turns.encode(),
            b"dead_source_id": b"1-0",
            b"dead_group": b"agent-loop",
            b"dead_deliveries": b"3",
            b"dead_error": b"boom",
        },
    )
    async with _client(store, keys) as client:
        got = await client.get("/v1/traces/cites/turns/t/reply", params={"timeout_s": 0}, headers=auth(CALC_KEY))
        assert got.status_code == 200, got.text
        reply = codec.decode_reply(got.content)
        assert reply == Reply(
            trace_id="cites", turn_id="t", status="ended", answer="Paris", metadata={"user": "u7"}, citations=(cited,)
        )
        document = (await client.get("/openapi.json")).json()
        fields = set(document["components"]["schemas"]["Reply"]["properties"])
        assert fields == set(Reply.__struct_fields__), fields
        path = document["paths"]["/v1/traces/{trace_id}/turns/{turn_id}/reply"]["get"]["responses"]["200"]
        assert path["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Reply"}
        letters = (await client.get("/v1/dead-letters", headers=auth(ADMIN_KEY))).json()["dead_letters"]
        assert set(document["components"]["schemas"]["DeadLetter"]["properties"]) == {
            f.name for f in dataclasses.fields(DeadLetter)
        }
    (letter,) = letters
    assert set(letter) == {f.name for f in dataclasses.fields(DeadLetter)}
    assert (letter["trace_id"], letter["deliveries"], letter["error"], letter["group"]) == (
        "dead-1",
        3,
        "boom",
        "agent-loop",
    )
    assert msgspec.json.decode(letter["payload"]["turn"]) == {"trace_id": "dead-1"}


async def test_readiness_is_redis_answering_ping(store, keys):
    async with _client(store, keys) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gone = aioredis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
    try:
        async with _client(TraceStore(gone, keys), keys) as client:
            down = await client.get("/readyz")
        assert down.status_code == 503 and down.json()["detail"].startswith("Redis: ")
    finally:
        await gone.aclose()
