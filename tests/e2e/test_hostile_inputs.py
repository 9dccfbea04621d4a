"""Hostile entries on every stream a backend can write, against the services as separate OS
processes (issue 10, item 3): no payload stops a service, a listener or a consumer; each is
reported, and the services go on answering turns."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from agentstream.wire.keys import (
    AGENT_LOOP_GROUP,
    CANCEL_FIELD,
    JOB_FIELD,
    TOOL_WORKER_GROUP,
    TURN_FIELD,
    WAKE_FIELD,
    Keys,
)
from tests.support.procs import Services, publish_turn, wait_replies
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.e2e

NESTED = b"[" * 2048 + b"]" * 2048  # 4 KB of nesting: deeper than any decoder recurses
REPLIES_PREFIX = b"{namespace}:replies:"  # filled in per test (an empty suffix)


def hostile_payloads(ids: bytes) -> list[bytes]:
    """Deep nesting, wrong types, a huge payload, bytes that are not JSON, not an object."""
    return [
        b'{"trace_id":"h1","z":' + NESTED + b"}",  # unknown field, nested (msgspec: RecursionError)
        b'{"trace_id":"h1","turn_id":"ht","metadata":{"a":' + NESTED + b"}}",
        NESTED,
        b'{"trace_id":5,"turn_id":["x"],"call_id":{},"name":null}',
        b'{"trace_id":"h1","text":"' + b"x" * 2_000_000 + b'"}',  # 2 MB
        b"\xff\xfe\x00not json",
        b"",
        b"[]",
        ids,
        # what a decoder alone lets through or misreports (issue 11): a key twice, control and
        # invisible characters in ids, lone surrogates, an empty reply stream suffix
        b'{"trace_id":"h1","trace_id":"ok","turn_id":"hd","agent":"plan","text":"do: work(1)"}',
        b'{"trace_id":"h\\u0000","turn_id":"h\\u202e","call_id":"hc\\u001b","agent":"plan","text":"x","name":"work"}',
        b'{"trace_id":"h2","turn_id":"hs","agent":"plan","text":"ab\\ud83d"}',
        b'{"trace_id":"h3","turn_id":"hr","agent":"plan","text":"x","reply_to":"' + REPLIES_PREFIX + b'"}',
    ]


def test_no_payload_on_any_stream_stops_a_service(redis_url, namespace, tmp_path, client):
    keys = Keys(namespace)
    with ScriptedModelServer(parallel_rule) as model:
        services = Services(
            redis_url=redis_url,
            namespace=namespace,
            model_url=model.base_url,
            log_dir=tmp_path,
            extra_env={"AGENTSTREAM_MIN_IDLE_MS": "1000", "AGENTSTREAM_MAX_DELIVERIES": "2"},
        )
        try:
            loop = services.start("loop", "agent-loop")
            worker = services.start("tools", "tool-worker")
            publish_turn(client, keys, trace_id="ok", turn_id="before", agent="plan", text="do: work(1)")
            wait_replies(client, keys, 1, timeout_s=30)  # both up and listening
            for stream, field in (
                (keys.cancel, CANCEL_FIELD),
                (keys.turns, TURN_FIELD),
                (keys.wake, WAKE_FIELD),
                (keys.tools("default"), JOB_FIELD),
            ):
                for payload in hostile_payloads(b'{"trace_id":"h1","turn_id":"ht","call_id":"hc","name":"work"}'):
                    client.xadd(stream, {field: payload.replace(REPLIES_PREFIX, keys.replies.encode() + b":")})
                client.xadd(stream, {b"no-such-field": b"1"})
                # a field given twice (Redis keeps both pairs; a dict keeps one): refused, naming it
                ok = b'{"trace_id":"ok","turn_id":"twice","agent":"plan","text":"do: work(1)"}'
                client.execute_command("XADD", stream, "*", field, ok, field, ok.replace(b"work(1)", b"work(2)"))
                client.xadd(stream, {field + b"\xff": NESTED, b"\xfe": b"\x00"})
            time.sleep(3.0)
            assert loop.poll() is None, services.log("loop")[-3000:]
            assert worker.poll() is None, services.log("tools")[-3000:]
            publish_turn(client, keys, trace_id="ok", turn_id="after", agent="plan", text="do: work(1) record(z)")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "after" not in (
                got := {r.turn_id: r for r in wait_replies(client, keys, 1)}
            ):
                time.sleep(0.1)
            assert got["after"].status == "ended"
            assert loop.poll() is None and worker.poll() is None
            assert client.xlen(keys.errors) > 0  # reported, not swallowed
            for entry_id, fields in client.xrange(keys.errors):  # each says which entry of which stream
                assert fields.get(b"source") and fields.get(b"entry"), (entry_id, fields)
            assert not [k for k in client.scan_iter(f"{namespace}*") if b"\x00" in k or b"\xe2\x80\xae" in k]
            assert client.exists(keys.replies + ":") == 0
            doubled = [f for _, f in client.xrange(keys.errors) if b"given 2 times" in f[b"error"]]
            assert {f[b"source"] for f in doubled} >= {
                keys.cancel.encode(),
                keys.wake.encode(),
                keys.tools("default").encode(),
            }, doubled
            twice = [r for r in wait_replies(client, keys, 1) if r.turn_id == "twice"]
            assert [(r.status, r.code) for r in twice] == [("failed", "bad_turn")], twice  # never run, one reply
            assert "field 'turn' given 2 times" in twice[0].reason

            def pending() -> int:
                total = 0
                for stream, group in (
                    (keys.turns, AGENT_LOOP_GROUP),
                    (keys.wake, AGENT_LOOP_GROUP),
                    (keys.cancel, AGENT_LOOP_GROUP),
                    (keys.tools("default"), TOOL_WORKER_GROUP),
                ):
                    total += client.xpending(stream, group)["pending"]
                return total

            deadline = time.monotonic() + 40
            while pending() and time.monotonic() < deadline:
                time.sleep(0.2)
            stuck = {
                s: client.xpending_range(s, g, "-", "+", 10)
                for s, g in (
                    (keys.turns, AGENT_LOOP_GROUP),
                    (keys.wake, AGENT_LOOP_GROUP),
                    (keys.cancel, AGENT_LOOP_GROUP),
                    (keys.tools("default"), TOOL_WORKER_GROUP),
                )
            }
            assert pending() == 0, (stuck, services.log("loop")[-4000:])  # every hostile entry acknowledged
        finally:
            services.stop_all()


def test_a_burst_of_refused_turns_on_two_agent_loops_answers_each_turn_once(redis_url, namespace, tmp_path, client):
    """One conversation, a quick burst of refused turns (unknown field, unknown agent, over the
    size limit, malformed JSON, the same turn id twice, empty text) with good turns between them,
    two agent-loop processes: one reply per turn id (it was two for some refused turns)."""
    keys = Keys(namespace)
    with ScriptedModelServer(parallel_rule) as model:
        services = Services(
            redis_url=redis_url,
            namespace=namespace,
            model_url=model.base_url,
            log_dir=tmp_path,
            extra_env={"AGENTSTREAM_MAX_TURN_BYTES": "4096"},
        )
        try:
            services.start("loop1", "agent-loop")
            services.start("loop2", "agent-loop")
            services.start("tools", "tool-worker")
            publish_turn(client, keys, trace_id="warm", turn_id="w", agent="plan", text="do: work(1)")
            wait_replies(client, keys, 1, timeout_s=30)

            def turn(turn_id: str, **extra) -> bytes:
                body = {"trace_id": "b", "turn_id": turn_id, "agent": "plan", "text": "do: work(1)", **extra}
                return json.dumps(body).encode()

            entries, expected = [], set()
            for i in range(4):
                entries += [
                    turn(f"u{i}", colour="x"),
                    turn(f"a{i}", agent="nobody"),
                    turn(f"o{i}", text="x" * 5000),
                    b'{"trace_id": "b", "turn_id": "m%d", ' % i,
                    turn(f"d{i}", colour="y"),
                    turn(f"d{i}", colour="y"),
                    turn(f"e{i}", text=""),
                    turn(f"g{i}"),
                ]
                expected |= {f"{k}{i}" for k in "uaomdeg"}
            pipe = client.pipeline(transaction=False)
            for payload in entries:
                pipe.xadd(keys.turns, {TURN_FIELD: payload})
            pipe.execute()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = Counter(r.turn_id for r in wait_replies(client, keys, 1) if r.trace_id == "b")
                if set(got) >= expected:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # a late second copy would show now
            got = Counter(r.turn_id for r in wait_replies(client, keys, 1) if r.trace_id == "b")
            assert set(got) == expected, expected - set(got)
            assert {t: n for t, n in got.items() if n != 1} == {}, got
        finally:
            services.stop_all()
