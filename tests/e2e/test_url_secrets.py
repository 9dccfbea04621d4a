"""Credentials inside a model URL never leak (issue 11, item 5): with a password planted in
OPENAI_BASE_URL, or in a models file's base_url, a failing turn's reason, every Redis key of the
namespace, every log line of the service processes and their metrics pages hold no trace of it."""

from __future__ import annotations

import time

import httpx
import pytest
import redis as redis_sync

from tests.support.procs import Services, publish_turn, wait_replies
from tests.support.redis_server import free_port, sync_client
from tests.support.scripted_model import ScriptedModelServer, calculator_rule

pytestmark = pytest.mark.e2e

SECRET = "PLANTED-s3cr3t-9f2c"


def every_value(client: redis_sync.Redis, namespace: str) -> bytes:
    """Every key name and value under the namespace, as one blob."""
    out = []
    for key in client.scan_iter(f"{namespace}*"):
        out.append(key)
        kind = client.type(key)
        if kind == b"stream":
            for entry_id, fields in client.xrange(key):
                out += [entry_id, *fields.keys(), *fields.values()]
        elif kind == b"hash":
            for k, v in client.hgetall(key).items():
                out += [k, v]
        elif kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
    return b"\n".join(out)


def failing_then_working(body):
    text = body["messages"][-1].get("content") or ""
    if "fail" in str(text):
        return {"status": 500, "body": {"error": {"message": "upstream exploded", "type": "server_error"}}}
    return calculator_rule(body)


@pytest.mark.parametrize("where", ["OPENAI_BASE_URL", "models file"])
def test_a_password_in_a_model_url_is_masked_everywhere(redis_url, namespace, keys, tmp_path, where):
    client = sync_client(redis_url)
    port = free_port()
    with ScriptedModelServer(failing_then_working) as model:
        url = model.base_url.replace("http://", f"http://agent:{SECRET}@")
        env = {
            "AGENTSTREAM_MODEL_RETRIES": "0",
            "AGENTSTREAM_METRICS_PORT": str(port),
            "AGENTSTREAM_METRICS_INTERVAL_S": "0.2",
            "AGENTSTREAM_LOG_LEVEL": "DEBUG",
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
        }
        if where == "models file":
            models = tmp_path / "models.yaml"
            models.write_text(
                f"models:\n  default:\n    provider: openai\n    base_url: {url}\n    model: scripted-model\n    stream: false\n"
            )
            env["AGENTSTREAM_MODELS_FILE"] = str(models)
            url = model.base_url
        services = Services(redis_url=redis_url, namespace=namespace, model_url=url, log_dir=tmp_path, extra_env=env)
        try:
            services.start("loop-1", "agent-loop", "--log-level", "debug")
            services.start(
                "tools-1", "tool-worker", "--log-level", "debug", env={"AGENTSTREAM_METRICS_PORT": str(free_port())}
            )
            publish_turn(client, keys, trace_id="s1", turn_id="t1", agent="calc", text="please fail")
            publish_turn(client, keys, trace_id="s2", turn_id="t2", agent="calc", text="What is 2 + 2?")
            replies = {r.turn_id: r for r in wait_replies(client, keys, 2, timeout_s=60)}
            metrics = ""
            deadline = time.monotonic() + 20
            while "agentstream_turns_failed_total" not in metrics and time.monotonic() < deadline:
                try:
                    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                except httpx.TransportError:
                    time.sleep(0.2)
        finally:
            services.stop_all()
    try:
        assert replies["t1"].status == "failed" and "127.0.0.1" in replies["t1"].reason, replies["t1"]
        assert "***@127.0.0.1" in replies["t1"].reason, replies["t1"].reason  # the URL is shown, masked
        assert replies["t2"].status == "ended", replies["t2"]
        stored = every_value(client, namespace)
        assert stored and SECRET.encode() not in stored
        assert "agentstream_turns_failed_total" in metrics and SECRET not in metrics
        logs = services.log("loop-1") + services.log("tools-1")
        assert "HTTP" in logs or "model" in logs
        leaking = [line for line in logs.splitlines() if SECRET in line]
        assert not leaking, leaking[:3]
    finally:
        client.close()
