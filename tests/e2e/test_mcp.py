"""End to end: tools from a real MCP server (the SDK's own server API), run by tool workers.

The agent loop and the tool worker run as separate OS processes on a real Redis; the model is
the scripted OpenAI-compatible server; the MCP server is tests/support/mcp_servers.py, started
by the tool worker over stdio, or by the test over streamable HTTP with a bearer token.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentstream.wire import codec
from agentstream.wire.events import CancelMessage, Document, Image, ModelOutput, ToolOutput, ToolsOffered
from agentstream.wire.keys import CANCEL_FIELD, REPLY_FIELD
from tests.support.mcp_apps import mcp_rule
from tests.support.procs import ROOT, Services, publish_turn, trace_events, wait_replies
from tests.support.procs import request_bodies as bodies
from tests.support.procs import wait_until as wait_for
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e

APP = "tests.support.mcp_apps:app"


@pytest.fixture
def model():
    with ScriptedModelServer(mcp_rule) as server:
        yield server


@pytest.fixture
def mcp_dir(tmp_path) -> Path:
    folder = tmp_path / "mcp"
    folder.mkdir()
    return folder


@pytest.fixture
def services(redis_url, namespace, model, tmp_path, mcp_dir):
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=model.base_url,
        app=APP,
        log_dir=tmp_path,
        extra_env={"MCP_TEST_DIR": str(mcp_dir), "AGENTSTREAM_MIN_IDLE_MS": "2000"},
    )
    yield s
    s.stop_all()


def verify(services, trace_id: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "trace", "verify", trace_id, "--app", APP],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stderr


def start_local(services, name: str = "tools-1"):
    services.start("loop-1", "agent-loop")
    services.start(name, "tool-worker", "--queue", "mcp-local")


def test_stdio_tools_are_offered_with_their_schemas_called_and_answered(client, keys, services, model):
    start_local(services)
    publish_turn(client, keys, trace_id="m1", turn_id="t1", agent="local", text='call add {"a": 2, "b": 3.5}')
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended", reply
    assert reply.answer == "Result: 5.5"
    first = bodies(model)[0]
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    # the server's names, descriptions and schemas; the prompt file's texts over add's
    assert sorted(tools) == ["add", "fail", "grow", "nested", "picture", "slow"]  # `either` (anyOf at the top) refused
    assert tools["add"]["description"] == "Add two numbers exactly (from the prompt file)."
    assert tools["add"]["parameters"]["properties"]["a"]["description"] == "The first number."
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert tools["slow"]["description"] == "Sleep for a while."
    nested = json.dumps(tools["nested"]["parameters"])
    assert "$ref" not in nested and "$defs" not in nested  # inlined for the endpoints
    assert tools["nested"]["parameters"]["properties"]["point"]["properties"]["x"] == {"title": "X", "type": "number"}
    events = trace_events(client, keys, "m1")
    assert [type(e).__name__ for e in events] == [
        "TurnInput",
        "ToolsOffered",
        "ModelOutput",
        "ToolOutput",
        "ModelOutput",
        "TurnEnded",
    ]
    offered = events[1]
    assert isinstance(offered, ToolsOffered) and [t.server for t in offered.tools] == ["local"] * 6
    assert "anyOf" in client.get(keys.mcp_catalog("local")).decode()  # the refusal is published with the catalog
    assert "Authorization" not in client.get(keys.mcp_catalog("local")).decode()
    assert (Path(services.env["MCP_TEST_DIR"]) / "calls").read_text().splitlines() == ['add {"a": 2.0, "b": 3.5}']
    assert "2/2 model calls rebuilt from the stored trace match" in verify(services, "m1")


def test_images_and_resources_become_elements_and_an_error_result_reaches_the_model(client, keys, services, model):
    start_local(services)
    texts = ['call picture {"subject": "a cat"}', 'call fail {"reason": "it is monday"}', 'call add {"a": "two"}']
    for n, text in enumerate(texts, 1):  # one after the other, so the call ids follow the turns
        publish_turn(client, keys, trace_id="m2", turn_id=f"t{n}", agent="local", text=text)
        wait_replies(client, keys, n, timeout_s=60)
    replies = {r.turn_id: r for r in wait_replies(client, keys, 3)}
    results = {e.call_id: e for e in trace_events(client, keys, "m2") if isinstance(e, ToolOutput)}
    picture, failed, invalid = results["call_1_picture"], results["call_2_fail"], results["call_3_add"]
    assert picture.text == "a picture of a cat" and picture.error is None
    kinds = [type(e) for e in picture.elements]
    assert kinds == [Image, Document]
    assert picture.elements[0].media_type == "image/png" and picture.elements[0].data
    assert picture.elements[1].id == "memo://caption" and picture.elements[1].text == "Caption: a cat at dawn"
    assert failed.error == "tool_error" and "it failed because it is monday" in failed.text
    assert "it failed because it is monday" in replies["t2"].answer  # the model saw the error result
    assert invalid.error == "invalid_arguments" and "'b' is a required property" in invalid.text
    assert "add" not in (Path(services.env["MCP_TEST_DIR"]) / "calls").read_text()  # never reached the server
    assert '<document id="2" mime_type="text/plain">Caption: a cat at dawn</document>' in replies["t1"].answer
    # the caption (a citable document) is in the request the model received after the call
    after_picture = bodies(model)[1]
    assert "Caption: a cat at dawn" in json.dumps(after_picture["messages"])
    # and the image itself, in the user message that follows the results
    image_url = f"data:image/png;base64,{picture.elements[0].data}"
    assert {"type": "image_url", "image_url": {"url": image_url}} in after_picture["messages"][-1]["content"]
    assert "6/6 model calls rebuilt from the stored trace match" in verify(services, "m2")


def test_a_cancelled_turn_cancels_the_mcp_request(client, keys, services, mcp_dir):
    start_local(services)
    publish_turn(
        client, keys, trace_id="m3", turn_id="t1", agent="local", text='call slow {"seconds": 30, "tag": "c1"}'
    )
    wait_for(lambda: (mcp_dir / "slow-started-c1").exists(), 60, "slow call")
    client.xadd(keys.cancel, {CANCEL_FIELD: codec.encode(CancelMessage(trace_id="m3", reason="user left"))})
    (reply,) = wait_replies(client, keys, 1, timeout_s=30)
    assert reply.status == "failed" and reply.code == "cancelled"
    wait_for(lambda: (mcp_dir / "slow-cancelled-c1").exists(), 15, "the server seeing the cancel")
    results = [e for e in trace_events(client, keys, "m3") if isinstance(e, ToolOutput)]
    assert results[0].error == "cancelled"


def test_a_server_killed_mid_call_gives_an_error_result_and_is_started_again(client, keys, services, mcp_dir):
    start_local(services)
    publish_turn(
        client, keys, trace_id="m4", turn_id="t1", agent="local", text='call slow {"seconds": 30, "tag": "k1"}'
    )
    wait_for(lambda: (mcp_dir / "slow-started-k1").exists(), 60, "slow call")
    first_pid = int((mcp_dir / "slow-started-k1").read_text())
    started = time.monotonic()
    os.kill(first_pid, signal.SIGKILL)
    (reply,) = wait_replies(client, keys, 1, timeout_s=30)
    assert time.monotonic() - started < 10  # an error result at once, not the call's 60 s timeout
    assert reply.status == "ended" and "stopped while the call ran" in reply.answer
    result = next(e for e in trace_events(client, keys, "m4") if isinstance(e, ToolOutput))
    assert result.error == "server_stopped"
    publish_turn(client, keys, trace_id="m4", turn_id="t2", agent="local", text='call add {"a": 1, "b": 1}')
    replies = wait_replies(client, keys, 2, timeout_s=60)
    assert replies[1].answer == "Result: 2"
    assert int((mcp_dir / "pid").read_text()) != first_pid  # a new server process


def test_a_list_changed_while_running_is_offered_and_recorded(client, keys, services, model):
    start_local(services)
    publish_turn(client, keys, trace_id="m5", turn_id="t1", agent="local", text="call grow {}")
    wait_replies(client, keys, 1, timeout_s=60)
    wait_for(lambda: b'"extra"' in (client.get(keys.mcp_catalog("local")) or b""), 20, "the new catalog")
    publish_turn(client, keys, trace_id="m5", turn_id="t2", agent="local", text='call extra {"word": "hi"}')
    replies = wait_replies(client, keys, 2, timeout_s=60)
    assert replies[1].answer == "Result: extra hi", replies[1]
    names = [sorted(t["function"]["name"] for t in b["tools"]) for b in bodies(model)]
    assert "extra" not in names[0] and "extra" in names[2]
    offers = [e for e in trace_events(client, keys, "m5") if isinstance(e, ToolsOffered)]
    assert len(offers) == 2 and "extra" in [t.name for t in offers[1].tools]
    assert "4/4 model calls rebuilt from the stored trace match" in verify(services, "m5")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_with_a_header_from_the_environment(client, keys, services, model, mcp_dir):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_servers", "http", "--port", str(port), "--token", "s3cret"],
        cwd=ROOT,
        env={**os.environ, "MCP_TEST_DIR": str(mcp_dir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        services.start("loop-1", "agent-loop")
        services.start(
            "tools-http",
            "tool-worker",
            "--queue",
            "mcp-remote",
            env={"AGENTSTREAM_MCP_REMOTE_URL": f"http://127.0.0.1:{port}/mcp", "REMOTE_MCP_AUTH": "Bearer s3cret"},
        )
        publish_turn(client, keys, trace_id="m6", turn_id="t1", agent="remote", text='call add {"a": 20, "b": 22}')
        (reply,) = wait_replies(client, keys, 1, timeout_s=60)
        assert reply.answer == "Result: 42"
        tools = sorted(t["function"]["name"] for t in bodies(model)[0]["tools"])
        assert tools == ["add", "picture", "slow"]  # the allow-list
        catalog = client.get(keys.mcp_catalog("remote")).decode()
        assert "s3cret" not in catalog and "s3cret" not in json.dumps(bodies(model))
        assert "s3cret" not in services.log("tools-http")
        verify(services, "m6")
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_server_nobody_serves_fails_the_turn_with_a_reason(client, keys, services):
    services.env["AGENTSTREAM_MCP_WAIT_S"] = "1"
    services.start("loop-1", "agent-loop")
    publish_turn(client, keys, trace_id="m7", turn_id="t1", agent="remote", text='call add {"a": 1, "b": 2}')
    (reply,) = wait_replies(client, keys, 1, timeout_s=30)
    assert reply.status == "failed" and reply.code == "tools_unavailable"
    assert "mcp-remote" in reply.reason and "agentstream serve tool-worker --queue mcp-remote" in reply.reason
    assert not [e for e in trace_events(client, keys, "m7") if isinstance(e, ModelOutput)]


def reply_of(client, keys, turn_id: str):
    """The (first) reply to turn ``turn_id`` (replies are at-least-once: a turn may get two)."""

    def found():
        replies = [codec.decode_reply(fields[REPLY_FIELD]) for _, fields in client.xrange(keys.replies)]
        return next((r for r in replies if r.turn_id == turn_id), None)

    return wait_for(found, timeout_s=60, what=f"a reply to {turn_id}")


def test_an_mcp_servers_tools_are_declared_with_states_and_locks_like_local_ones(
    client, keys, services, model, mcp_dir
):
    start_local(services)
    ask = 'call add {"a": 2, "b": 3.5}'
    turn = {"trace_id": "d1", "agent": "declaring"}
    client.xadd(keys.turns, {"turn": json.dumps({**turn, "turn_id": "t1", "input": {"text": ask}})})
    first = reply_of(client, keys, "t1")
    # add is declared off: not offered, and the call the model makes anyway is not run
    assert first.status == "ended" and "there is no tool named 'add'" in first.answer, first
    assert "add" not in [t["function"]["name"] for t in bodies(model)[0]["tools"]]
    assert not (mcp_dir / "calls").exists()
    client.xadd(
        keys.turns,
        {"turn": json.dumps({**turn, "turn_id": "t2", "input": {"text": ask, "tools": {"add": "required"}}})},
    )
    second = reply_of(client, keys, "t2")
    assert second.status == "ended" and second.answer == "Result: 5.5", second  # asked for: offered, run by the server
    asked = [b for b in bodies(model) if "add" in [t["function"]["name"] for t in b.get("tools", [])]]
    assert asked and "Use the add tool for this message." in json.dumps(asked[0]["messages"][-1])
    assert (mcp_dir / "calls").read_text().splitlines() == ['add {"a": 2.0, "b": 3.5}']
    client.xadd(
        keys.turns, {"turn": json.dumps({**turn, "turn_id": "t3", "input": {"text": ask, "tools": {"grow": "off"}}})}
    )
    client.xadd(
        keys.turns,
        {"turn": json.dumps({**turn, "turn_id": "t4", "input": {"text": ask, "tools": {"absent": "required"}}})},
    )
    third, fourth = reply_of(client, keys, "t3"), reply_of(client, keys, "t4")
    assert third.status == "failed" and third.code == "bad_turn" and "locks it at 'auto'" in third.reason, third
    assert (
        fourth.status == "failed"
        and fourth.code == "bad_turn"
        and "requires tool 'absent', which no MCP server" in fourth.reason
    ), fourth
    assert "model calls rebuilt from the stored trace match" in verify(services, "d1")


def test_a_malicious_server_does_not_stall_the_workers_other_queue(client, keys, services, model, tmp_path):
    """Issue 33, items 1 and 8: one tool worker serves a good server's queue and a malicious
    server's (a schema bomb in its listing, stderr floods with forged records, garbage, a huge and
    an endless message, death mid-call). The good queue's turns are answered meanwhile, each
    hostile call gets its result or its error at once (a message that ends the malicious server's
    session fails that server's calls in flight, no other), and the worker's log holds the
    server's lines only as its own escaped records."""
    from tests.support.mcp_hostile import FORGED

    services.start("loop-1", "agent-loop")
    # the server's stderr lines are INFO records; `serve` logs at WARNING by default
    services.start("tools-1", "tool-worker", "--queue", "mcp-local", "--queue", "mcp-hostile", "--log-level", "info")
    survivable = ['call flood_stderr {"lines": 20000}', "call garbage {}"]
    for n, text in enumerate(survivable):
        publish_turn(client, keys, trace_id=f"bad-{n}", turn_id="t1", agent="hostile", text=text)
    wait_replies(client, keys, len(survivable), timeout_s=120)
    killers = ['call huge {"mb": 40}', "call endless {}", "call die {}"]
    for n, text in enumerate(killers, len(survivable)):
        publish_turn(client, keys, trace_id=f"bad-{n}", turn_id="t1", agent="hostile", text=text)
    for n in range(3):
        publish_turn(
            client, keys, trace_id=f"good-{n}", turn_id="t1", agent="local", text=f'call add {{"a": {n}, "b": 1}}'
        )
    replies = {r.trace_id: r for r in wait_replies(client, keys, len(survivable) + len(killers) + 3, timeout_s=120)}
    for n in range(3):
        assert replies[f"good-{n}"].status == "ended" and replies[f"good-{n}"].answer.startswith(f"Result: {n + 1}")
    results = {
        f"bad-{n}": next(e for e in trace_events(client, keys, f"bad-{n}") if isinstance(e, ToolOutput))
        for n in range(len(survivable) + len(killers))
    }
    assert results["bad-0"].text == "flooded" and results["bad-1"].text == "after garbage"
    for n in (2, 3, 4):  # each failed its own call, at once (not by its 60 s timeout)
        assert results[f"bad-{n}"].error == "server_stopped", results[f"bad-{n}"].text
    catalog = client.get(keys.mcp_catalog("hostile")).decode()
    assert '"bomb"' in catalog and "inputSchema" in catalog  # refused with its reason
    log = services.log("tools-1")
    assert "MCP server 'hostile' stderr: " in log
    assert not any(line.startswith(FORGED) for line in log.splitlines())  # never a line of its own
