"""A FastStream backend app (examples/faststream_backend.py) publishes a turn and consumes its
reply with its own broker, against the services as separate processes; and the AsyncAPI
document of the public channels, made with FastStream's AsyncAPI support, is valid AsyncAPI 3.0."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import Services
from tests.support.redis_server import single_node_only

FASTSTREAM_ONE_SERVER = single_node_only(
    "FastStream's RedisBroker (the example backend) connects to one Redis server: it has no Redis Cluster client"
)

REPO = Path(__file__).resolve().parents[2]
ASYNCAPI_SCHEMA = REPO / ".tools" / "asyncapi" / "schemas" / "3.0.0-without-$id.json"


def load_example(monkeypatch, redis_url: str, namespace: str):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    spec = importlib.util.spec_from_file_location("faststream_backend", REPO / "examples" / "faststream_backend.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "faststream_backend", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
@FASTSTREAM_ONE_SERVER
async def test_a_faststream_app_publishes_a_turn_and_consumes_its_reply(
    redis_url, namespace, scripted_model, tmp_path, monkeypatch
):
    example = load_example(monkeypatch, redis_url, namespace)
    services = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    try:
        services.start("loop", "agent-loop")
        services.start("tools", "tool-worker")
        async with example.broker:
            await example.broker.start()
            first, second = await asyncio.gather(
                example.ask("What is 2*2?", agent="calc", timeout_s=60),
                example.ask("What is 3*3?", agent="calc", timeout_s=60),
            )
    finally:
        services.stop_all()
    assert (first.status, second.status) == ("ended", "ended"), (first, second, services.log("loop")[-2000:])
    assert first.turn_id != second.turn_id and first.answer and second.answer


@pytest.mark.e2e
@FASTSTREAM_ONE_SERVER
async def test_the_faststream_app_sees_a_failed_reply(redis_url, namespace, scripted_model, tmp_path, monkeypatch):
    example = load_example(monkeypatch, redis_url, namespace)
    services = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    try:
        services.start("loop", "agent-loop")
        async with example.broker:
            await example.broker.start()
            reply = await example.ask("hello", agent="no-such-agent", timeout_s=60)
    finally:
        services.stop_all()
    assert reply.status == "failed" and reply.code and reply.reason


def test_schema_asyncapi_prints_a_valid_asyncapi_3_document_of_every_public_channel():
    import jsonschema

    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "schema", "asyncapi"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "AGENTSTREAM_NAMESPACE": "prod"},
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert ASYNCAPI_SCHEMA.is_file(), "run scripts/install-deploy-tools (it fetches the AsyncAPI schemas)"
    errors = list(jsonschema.Draft7Validator(json.loads(ASYNCAPI_SCHEMA.read_text())).iter_errors(document))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:5]]
    assert document["asyncapi"] == "3.0.0"
    channels = {c["address"]: c for c in document["channels"].values()}
    assert set(channels) == {
        "prod:turns",
        "prod:replies",
        "prod:cancel",
        "prod:approvals",
        "prod:errors",
        "prod:trace:{trace_id}",
        "prod:trace:{trace_id}:deltas",
        "prod:backends:{backend}:turns",  # a backend confined to its conversations (AGENTSTREAM_BACKENDS)
        "prod:backends:{backend}:cancel",
        "prod:backends:{backend}:approvals",
    }
    assert channels["prod:trace:{trace_id}"]["parameters"]["trace_id"]
    schemas = document["components"]["schemas"]
    turn_field = schemas["TurnEntry"]["properties"]["turn"]
    assert turn_field["contentMediaType"] == "application/json"
    assert turn_field["contentSchema"] == {"$ref": "#/components/schemas/TurnMessage"}
    assert {"trace_id", "turn_id", "agent", "text"} <= set(schemas["TurnMessage"]["properties"])
    assert "status" in schemas["Reply"]["properties"] and "trace_id" in schemas["CancelMessage"]["properties"]
    assert schemas["Event"]["discriminator"] == "type"
    approval_field = schemas["ApprovalEntry"]["properties"]["approval"]
    assert approval_field["contentSchema"] == {"$ref": "#/components/schemas/ApprovalMessage"}
    assert {"trace_id", "call_id", "approved", "by", "reason", "arguments"} <= set(
        schemas["ApprovalMessage"]["properties"]
    )
    assert {"ApprovalAwaited", "ApprovalDecided"} <= set(schemas)  # the trace's events
    # every $ref resolves inside the document
    text = json.dumps(document)
    import re

    for ref in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node = document
        for part in ref.split("/"):
            node = node[part.replace("~1", "/").replace("%7B", "{").replace("%7D", "}")]
