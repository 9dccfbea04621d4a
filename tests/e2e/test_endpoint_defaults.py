"""End to end: what the model endpoint receives by default and with its settings (the request
body asserted on a scripted OpenAI-compatible server; services as separate processes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.procs import ROOT, Services, publish_turn, wait_replies
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e

TRIP = {"trip": {"origin": {"city": "Lyon"}, "destination": {"city": "Oslo", "country": "NO"}, "nights": 2}}


def trip_rule(body):
    """Book the trip on the first pass; then answer with the tool's result."""
    last = body["messages"][-1]
    if last["role"] == "user" and not any(m["role"] == "tool" for m in body["messages"]):
        return {
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_trip",
                        "type": "function",
                        "function": {"name": "book_trip", "arguments": json.dumps(TRIP)},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    result = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
    return {"message": {"role": "assistant", "content": f"Done: {result}"}, "finish_reason": "stop"}


@pytest.fixture
def model():
    with ScriptedModelServer(trip_rule) as server:
        yield server


def run_turn(client, keys, redis_url, namespace, model, tmp_path, options: dict | None = None) -> list[dict]:
    env = {"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(options)} if options else {}
    services = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=model.base_url,
        app="tests.support.schema_apps:app",
        extra_env=env,
        log_dir=tmp_path,
    )
    try:
        services.start("loop", "agent-loop")
        services.start("tools", "tool-worker")
        publish_turn(client, keys, trace_id="trip-1", turn_id="t1", agent="trips", text="Book Lyon to Oslo")
        (reply,) = wait_replies(client, keys, 1)
    finally:
        services.stop_all()
    assert reply.status == "ended" and "booked Lyon -> Oslo for 2 nights" in reply.answer, reply
    return [json.loads(raw) for raw in model.requests]


def assistant_with_calls(body: dict) -> dict:
    return next(m for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls"))


def refs_in(node) -> list[str]:
    if isinstance(node, dict):
        return [k for k in node if k in ("$ref", "$defs")] + [r for v in node.values() for r in refs_in(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs_in(v)]
    return []


def test_a_tool_only_assistant_message_is_replayed_with_null_content_by_default(
    client, keys, redis_url, namespace, model, tmp_path
):
    first, second = run_turn(client, keys, redis_url, namespace, model, tmp_path)
    message = assistant_with_calls(second)
    assert "content" in message and message["content"] is None  # the OpenAI API's documented form


def test_the_llama_cpp_quirk_replays_an_empty_string(client, keys, redis_url, namespace, model, tmp_path):
    _, second = run_turn(
        client, keys, redis_url, namespace, model, tmp_path, {"quirks": {"tool_call_content": "empty"}}
    )
    assert assistant_with_calls(second)["content"] == ""


def test_the_embedded_local_model_keeps_its_empty_string_quirk():
    from agentstream.cli.localmodel import LLAMA_CPP_QUIRKS
    from agentstream.models.endpoints import Quirks

    assert Quirks(**LLAMA_CPP_QUIRKS).tool_call_content == "empty"


def test_tool_schemas_are_sent_as_pydantic_writes_them_by_default(client, keys, redis_url, namespace, model, tmp_path):
    first, _ = run_turn(client, keys, redis_url, namespace, model, tmp_path)
    parameters = first["tools"][0]["function"]["parameters"]
    assert "$defs" in parameters and refs_in(parameters)


def test_an_endpoint_with_inline_tool_schemas_gets_no_ref_and_no_defs(
    client, keys, redis_url, namespace, model, tmp_path
):
    first, second = run_turn(client, keys, redis_url, namespace, model, tmp_path, {"inline_tool_schemas": True})
    for body in (first, second):
        parameters = body["tools"][0]["function"]["parameters"]
        assert refs_in(parameters) == [], parameters
        trip = parameters["properties"]["trip"]
        assert trip["properties"]["origin"]["properties"]["city"] == {"title": "City", "type": "string"}
        assert trip["properties"]["destination"]["properties"]["country"]["default"] == "FR"
        assert trip["required"] == ["origin", "destination"]


def test_a_recursive_tool_model_is_refused_at_startup_naming_the_tool(redis_url, namespace, model):
    env = {
        **Services(redis_url=redis_url, namespace=namespace, model_url=model.base_url).env,
        "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps({"inline_tool_schemas": True}),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentstream",
            "serve",
            "agent-loop",
            "--app",
            "tests.support.schema_apps:recursive_app",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert (
        "walk_tree" in proc.stderr and "recursive" in proc.stderr and "#/$defs/Node -> #/$defs/Node" in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr
