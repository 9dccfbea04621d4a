"""The gateway's perimeter (issue 33, items 3 and 10) in the test's event loop on a real Redis:
how much of a request body each route reads, from a caller with and without a key, counted at the
source (httpx's ASGI transport pulls the body chunk by chunk as the app asks for it)."""

from __future__ import annotations

import json

import httpx
import pytest

from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.wire.events import TurnEnded, TurnInput
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.perimeter import bearer_token, declared_length
from agentstream_services.gateway.settings import GatewaySettings
from tests.support.apps import app
from tests.support.gateway import CALC_KEY, KEYS_DOCUMENT, auth

pytestmark = pytest.mark.integration

LIMIT = 4096
CHUNK = 1024


def _client(store, keys, **gateway):
    settings = Settings(namespace=keys.namespace)
    api = create_api(
        app,
        settings,
        GatewaySettings(keys=KEYS_DOCUMENT, **{"max_body_bytes": LIMIT, **gateway}),
        store,
        load_keys(text=KEYS_DOCUMENT),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway")


class _Body:
    """A request body of ``chunks`` chunks that counts how many bytes the app pulled."""

    def __init__(self, chunks: int, first: bytes = b"") -> None:
        self.chunks = chunks
        self.first = first
        self.sent = 0

    async def __aiter__(self):
        for i in range(self.chunks):
            data = (self.first if i == 0 and self.first else b"x" * CHUNK).ljust(CHUNK, b" ")
            self.sent += len(data)
            yield data


def _routes(trace_id: str) -> list[tuple[str, str]]:
    return [
        ("POST", "/v1/turns"),
        ("POST", f"/v1/traces/{trace_id}/cancel"),
        ("GET", f"/v1/traces/{trace_id}"),
        ("GET", f"/v1/traces/{trace_id}/turns/t/reply?timeout_s=0"),
        ("GET", "/v1/conversations"),
        ("GET", "/v1/agents"),
        ("GET", "/v1/dead-letters"),
        ("GET", f"/v1/traces/{trace_id}/explain?step=0"),
        ("POST", f"/v1/traces/{trace_id}/approvals"),
    ]


async def test_without_a_key_no_route_reads_one_byte_of_the_body(store, keys):
    await store.append("p1", TurnInput(turn_id="t", agent="calc", text="hi"))
    async with _client(store, keys) as client:
        for method, path in _routes("p1"):
            for headers in ({}, auth("ask_wrong"), {"Authorization": "Basic x"}):
                body = _Body(10_000)  # 10 MB, chunked
                response = await client.request(method, path, content=body, headers=headers)
                assert response.status_code == 401, (method, path, response.text)
                assert body.sent == 0, (method, path, body.sent)
                assert response.headers["www-authenticate"] == "Bearer"


async def test_with_a_key_a_body_over_the_limit_is_413_as_soon_as_it_passes_it(store, keys):
    await store.append("p2", TurnInput(turn_id="t", agent="calc", text="hi"))
    await store.append("p2", TurnEnded(turn_id="t", answer="ok"))
    async with _client(store, keys) as client:
        for method, path in _routes("p2"):
            body = _Body(10_000, first=b'{"reason": "')
            response = await client.request(method, path, content=body, headers=auth(CALC_KEY))
            if body.sent == 0:  # a route that reads no body never pulls it
                assert response.status_code != 413, (method, path)
                continue
            assert response.status_code == 413, (method, path, response.text)
            assert body.sent <= LIMIT + CHUNK, (method, path, body.sent)
            assert "AGENTSTREAM_GATEWAY_MAX_BODY_BYTES" in response.json()["detail"]
        # a declared length over the limit: refused before the body is pulled
        body = _Body(10)
        response = await client.post(
            "/v1/turns", content=body, headers={**auth(CALC_KEY), "Content-Length": str(LIMIT + 1)}
        )
        assert response.status_code == 413 and body.sent == 0
        # under the limit, the routes read their bodies as before
        ok = await client.post(
            "/v1/turns",
            json={"trace_id": "p3", "turn_id": "t1", "agent": "calc", "text": "2+2"},
            headers=auth(CALC_KEY),
        )
        assert ok.status_code == 202, ok.text


async def test_the_posting_routes_read_their_bodies_only_after_the_key(store, keys):
    await store.append("p4", TurnInput(turn_id="t", agent="calc", text="hi"))
    async with _client(store, keys) as client:
        for path in ("/v1/turns", "/v1/traces/p4/cancel", "/v1/traces/p4/approvals"):
            body = _Body(2, first=b"{not json")
            response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == 401 and body.sent == 0, path


async def test_every_answer_has_the_security_headers_and_api_answers_are_not_stored(store, keys):
    await store.append("p5", TurnInput(turn_id="t", agent="calc", text="hi"))
    async with _client(store, keys) as client:
        for path, api in [("/v1/traces/p5", True), ("/v1/agents", True), ("/console/", False), ("/healthz", False)]:
            response = await client.get(path, headers=auth(CALC_KEY))
            assert response.status_code == 200, path
            csp = response.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, path
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"
            assert (response.headers.get("cache-control") == "no-store") == api, path
        refused = await client.get("/v1/traces/p5")
        assert refused.status_code == 401 and refused.headers["cache-control"] == "no-store"


def test_the_perimeters_decisions():
    assert bearer_token([(b"authorization", b"Bearer abc")]) == "abc"
    assert bearer_token([(b"Authorization", b"bearer  abc ")]) == "abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer")]) is None
    assert bearer_token([]) is None
    assert declared_length([(b"content-length", b"12")]) == 12
    assert declared_length([]) is None
    for bad in (
        [(b"content-length", b"-1")],
        [(b"content-length", b"1e9")],
        [(b"content-length", b"1"), (b"content-length", b"2")],
    ):
        with pytest.raises(ValueError):
            declared_length(bad)


async def test_ids_with_dot_segments_or_braces_are_refused_on_every_trace_route(store, keys):
    # issue 33, items 4 and 9: the browser normalised /v1/traces/a/../../traces/<victim>
    async with _client(store, keys) as client:
        for trace_id in ("a%2F..%2F..%2Ftraces%2Fvictim", "x%2F%2E%2E", "a%2F.", "%7Dx", "x%7B"):
            for method, path in _routes(trace_id)[1:4] + [("GET", f"/v1/traces/{trace_id}/stream")]:
                response = await client.request(method, path, headers=auth(CALC_KEY))
                assert response.status_code == 422, (method, path, response.text)
                assert "cannot name a trace" in response.json()["detail"]
        for trace_id in ("a/../b", "}x", "."):
            body = {"trace_id": trace_id, "turn_id": "t1", "agent": "calc", "text": "2+2"}
            refused = await client.post("/v1/turns", json=body, headers=auth(CALC_KEY))
            assert refused.status_code == 422 and "$.trace_id" in refused.json()["detail"], refused.text


async def test_long_polls_are_capped_per_key_and_per_replica_with_429(store, keys):
    import asyncio

    from tests.support.gateway import ADMIN_KEY, PLAN_KEY

    await store.append("w1", TurnInput(turn_id="t", agent="calc", text="hi"))
    await store.append("w2", TurnInput(turn_id="t", agent="plan", text="hi"))
    settings = Settings(namespace=keys.namespace)
    api = create_api(
        app,
        settings,
        GatewaySettings(keys=KEYS_DOCUMENT, max_streams=3, max_streams_per_key=2),
        store,
        load_keys(text=KEYS_DOCUMENT),
    )
    held = api.state.open_streams
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway") as client:

        def poll(trace_id: str, key: str, timeout_s: float = 30):
            return client.get(f"/v1/traces/{trace_id}/turns/t/reply?timeout_s={timeout_s}", headers=auth(key))

        waiting = [asyncio.create_task(poll("w1", CALC_KEY)) for _ in range(2)]
        while held.total < 2:
            await asyncio.sleep(0.01)
        over_key = await poll("w1", CALC_KEY)
        assert over_key.status_code == 429 and "AGENTSTREAM_GATEWAY_MAX_STREAMS_PER_KEY" in over_key.text
        assert over_key.headers["retry-after"] == "1"
        waiting.append(asyncio.create_task(poll("w2", PLAN_KEY)))  # another key still gets in
        while held.total < 3:
            await asyncio.sleep(0.01)
        over_all = await poll("w1", ADMIN_KEY)
        assert over_all.status_code == 429 and "AGENTSTREAM_GATEWAY_MAX_STREAMS)" in over_all.text
        assert (await poll("w1", ADMIN_KEY, timeout_s=0)).status_code == 202  # an answer without a wait is not held
        await store.append("w1", TurnEnded(turn_id="t", answer="done"))
        await store.append("w2", TurnEnded(turn_id="t", answer="done"))
        assert [r.status_code for r in await asyncio.gather(*waiting)] == [200, 200, 200]
    assert (held.total, held.by_key) == (0, {})


@pytest.mark.slow
async def test_an_exhausted_redis_pool_is_503_with_a_reason_never_500(redis_url, keys):
    import asyncio

    import redis.asyncio as aioredis

    from agentstream.runtime.store import TraceStore
    from tests.support.gateway import ADMIN_KEY, PLAN_KEY

    small = aioredis.Redis(connection_pool=aioredis.ConnectionPool.from_url(redis_url, max_connections=2))
    store = TraceStore(small, keys)
    await store.append("x1", TurnInput(turn_id="t", agent="calc", text="hi"))
    await store.append("x2", TurnInput(turn_id="t", agent="plan", text="hi"))
    settings = Settings(namespace=keys.namespace)
    api = create_api(app, settings, GatewaySettings(keys=KEYS_DOCUMENT), store, load_keys(text=KEYS_DOCUMENT))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway") as client:
            waiting = [
                asyncio.create_task(client.get(f"/v1/traces/{t}/turns/t/reply?timeout_s=5", headers=auth(k)))
                for t, k in (("x1", CALC_KEY), ("x2", PLAN_KEY))
            ]
            while len(small.connection_pool._in_use_connections) < 2:  # both block in XREAD, one connection each
                await asyncio.sleep(0.01)
            refused = await client.get("/v1/traces/x1", headers=auth(ADMIN_KEY))
            assert refused.status_code == 503, refused.text
            assert "connections are all in use" in refused.json()["detail"] and refused.headers["retry-after"] == "1"
            await asyncio.gather(*waiting)
    finally:
        await small.aclose()


async def test_the_conversation_list_and_the_reads_use_one_rule(store, keys):
    from agentstream.runtime import conversations
    from tests.support.gateway import ADMIN_KEY, PLAN_KEY

    await store.append("mixed", TurnInput(turn_id="t1", agent="calc", text="a calc question"))
    await store.append("mixed", TurnInput(turn_id="t2", agent="plan", text="then a plan"))
    await conversations.note_turn(store, "mixed", at_ms=1_000)
    async with _client(store, keys) as client:
        for key in (PLAN_KEY, CALC_KEY):  # neither may read it, so neither sees it listed
            assert (await client.get("/v1/traces/mixed", headers=auth(key))).status_code == 404
            listed = (await client.get("/v1/conversations", headers=auth(key))).json()["conversations"]
            assert "mixed" not in {c["trace_id"] for c in listed}
        listed = (await client.get("/v1/conversations", headers=auth(ADMIN_KEY))).json()["conversations"]
        assert [c["trace_id"] for c in listed] == ["mixed"]


def test_a_refused_bodys_errors_quote_at_most_a_bounded_part_of_each_value():
    from agentstream_services.gateway.perimeter import ECHO_MAX_CHARS, bounded_errors

    long_text = "r" * 200_000
    errors = [
        {
            "type": "string_too_long",
            "loc": ("body", "reason"),
            "msg": "too long",
            "input": long_text,
            "ctx": {"max_length": 2000},
        },
        {"type": "missing", "loc": ("body", "call_id"), "msg": "Field required", "input": {"approved": True}},
        {"type": "value_error", "loc": ("body",), "msg": "bad", "input": 1, "ctx": {"error": ValueError("x" * 500)}},
    ]
    errors.append({"type": "model_attributes_type", "loc": ("body",), "msg": "not an object", "input": b'{"a": 1}'})
    errors.append({"type": "x", "loc": ("body",), "msg": "m", "input": {"raw": b"\xff", "set": {1}}})
    cut, whole, odd, raw, mixed = bounded_errors(errors)
    assert raw["input"] == '{"a": 1}'  # a text/plain body's bytes: as text (FastAPI's own answer does the same)
    assert json.dumps(mixed)  # whatever the input held, the answer is JSON
    assert isinstance(mixed["input"]["raw"], str)
    assert cut["loc"] == ("body", "reason") and cut["ctx"] == {"max_length": 2000}
    assert len(cut["input"]) < ECHO_MAX_CHARS + 40 and "200002 characters" in cut["input"]
    assert whole["input"] == {"approved": True}  # short values are kept as they were
    assert odd["ctx"]["error"] == "x" * ECHO_MAX_CHARS  # not JSON: shown as text, cut


async def test_a_422_does_not_echo_an_oversized_body_back(store, keys):
    async with _client(store, keys, max_body_bytes=1_000_000) as client:
        answer = await client.post(
            "/v1/traces/c1/approvals",
            json={"call_id": "c" * 100_000, "approved": "yes", "reason": "r" * 300_000},
            headers=auth(CALC_KEY),
        )
    assert answer.status_code == 422, answer.text[:300]
    assert len(answer.content) < 2_000, len(answer.content)  # FastAPI's default sent the 400 KB back
    assert all("loc" in e and "msg" in e for e in answer.json()["detail"])


async def test_a_refused_path_or_query_value_is_quoted_short_and_a_turn_id_no_turn_can_have_is_422(store, keys):
    async with _client(store, keys) as client:
        long_turn = await client.get(f"/v1/traces/c1/turns/{'t' * 15_000}/reply?timeout_s=0", headers=auth(CALC_KEY))
        control = await client.get("/v1/traces/c1/turns/t%07/reply?timeout_s=0", headers=auth(CALC_KEY))
        long_after = await client.get(f"/v1/traces/c1?after={'1' * 15_000}", headers=auth(CALC_KEY))
        fine = await client.get("/v1/traces/c1/turns/t1/reply?timeout_s=0", headers=auth(CALC_KEY))
    assert long_turn.status_code == 422 and len(long_turn.content) < 400, long_turn.text[:200]
    assert "15,000 characters" in long_turn.json()["detail"]
    assert control.status_code == 422 and "control" in control.json()["detail"].lower(), control.text
    assert long_after.status_code == 422 and len(long_after.content) < 400, long_after.text[:200]
    assert fine.status_code in (202, 404), fine.text  # a well-formed id is asked about as before


async def test_every_id_of_a_path_query_or_body_is_held_to_the_wires_limit_in_bytes(store, keys):
    """One rule (:func:`agentstream.wire.checks.id_refusal`) and one message on every route: a
    trace path once said "1 to 512 characters" and bodies counted characters, while the wire
    refuses over ``AGENTSTREAM_MAX_ID_BYTES`` UTF-8 bytes."""
    await store.append("ct1", TurnInput(turn_id="t1", agent="calc", text="hi"))
    await store.append("ct1", TurnEnded(turn_id="t1", answer="ok"))
    wide = "é" * 200  # 200 characters, 400 bytes
    async with _client(store, keys) as client:
        asks = [
            ("GET", f"/v1/traces/{'x' * 10_000}", None, "a trace id is 10,000 bytes"),
            ("GET", f"/v1/traces/{wide}", None, "a trace id is 400 bytes"),
            ("GET", f"/v1/traces/{wide}/stream", None, "a trace id is 400 bytes"),
            ("GET", f"/v1/traces/ct1/stream?turn_id={wide}", None, "a turn id is 400 bytes"),
            ("GET", f"/v1/traces/ct1/explain?step=0&turn_id={wide}", None, "a turn id is 400 bytes"),
            ("GET", f"/v1/traces/ct1/turns/{wide}/reply?timeout_s=0", None, "a turn id is 400 bytes"),
            ("GET", f"/v1/conversations?agent={wide}", None, "an agent name is 400 bytes"),
            ("POST", "/v1/traces/ct1/forks", {"turn_id": "t1", "fork_id": wide}, "a fork id is 400 bytes"),
            ("POST", "/v1/traces/ct1/forks", {"turn_id": wide}, "a turn id is 400 bytes"),
            ("POST", "/v1/traces/ct1/cancel", {"turn_id": wide}, "a turn id is 400 bytes"),
            ("POST", "/v1/traces/ct1/approvals", {"call_id": wide, "approved": True}, "a call id is 400 bytes"),
            ("POST", "/v1/traces/ct1/approvals", {"call_id": " ", "approved": True}, "a call id cannot be empty"),
        ]
        for method, path, body, says in asks:
            response = await client.request(method, path, json=body, headers=auth(CALC_KEY))
            assert response.status_code == 422, (path, response.text[:300])
            detail = response.json()["detail"]
            assert says in detail, (path, detail)
            assert "empty" in says or "over the limit AGENTSTREAM_MAX_ID_BYTES=256" in detail, (path, detail)
            assert len(detail) < 400, detail
    assert await store.read(wide) == []  # no fork was made
