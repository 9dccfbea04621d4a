"""End to end: typed turn inputs, tool declarations with per-turn states, repeats and per-turn
settings (issue 13, sections 1-3), through the services: a turn published on Redis, answered by
the agent loop and a tool worker (separate processes) with a scripted model over HTTP whose
request bodies are asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agentstream.wire.events import ToolOutput, TurnInput
from tests.support import docs
from tests.support.procs import ROOT, Services, trace_events, wait_replies
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e


def _current_turn(body):
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return "", []
    return messages[users[-1]]["content"], messages[users[-1] + 1 :]


def rule(body):
    """``REPEAT`` in the message: call one tool three times with the same arguments (spaced
    differently), then answer with the results. Otherwise answer with the tools offered, in order."""
    user, after = _current_turn(body)
    names = [t["function"]["name"] for t in body.get("tools", [])]
    if body["messages"][0]["content"].startswith("You answer weather questions.") and names and not after:
        return {
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "w1",
                        "type": "function",
                        "function": {"name": names[0], "arguments": json.dumps({"city": "Oslo"})},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    if "REPEAT" in user and names:
        calls = sum(1 for m in after if m["role"] == "assistant")
        if calls < 3:
            tool = "fresh" if "FRESH" in user else "lookup"
            arguments = ['{"q": "same"}', '{"q":"same"}', '{ "q" : "same" }'][calls]
            return {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": f"r{calls}", "type": "function", "function": {"name": tool, "arguments": arguments}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        results = [m["content"] for m in after if m["role"] == "tool"]
        return {"message": {"role": "assistant", "content": "Results: " + " | ".join(results)}, "finish_reason": "stop"}
    if after and after[-1]["role"] == "tool":
        return {"message": {"role": "assistant", "content": f"Done: {after[-1]['content']}"}, "finish_reason": "stop"}
    return {"message": {"role": "assistant", "content": "tools=" + ",".join(names)}, "finish_reason": "stop"}


@pytest.fixture
def model():
    with ScriptedModelServer(rule) as server:
        yield server


MODELS_FILE = """
models:
  big:
    provider: openai
    base_url: {url}
    model: scripted-big
"""


def _services(redis_url, namespace, model, tmp_path, app, extra_env=None):
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_FILE.format(url=model.base_url))
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=model.base_url,
        app=app,
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_MODELS_FILE": str(models), **(extra_env or {})},
    )
    s.start("loop", "agent-loop")
    s.start("tools", "tool-worker")
    return s


@pytest.fixture
def services(redis_url, namespace, model, tmp_path):
    s = _services(redis_url, namespace, model, tmp_path, "tests.support.agent_apps:typed_app")
    yield s
    s.stop_all()


def publish(client, keys, **turn):
    client.xadd(keys.turns, {"turn": json.dumps(turn)})


def bodies(model):
    return [json.loads(raw) for raw in model.requests]


def verified(services, trace_id, calls):
    """``agentstream trace verify``: every model call rebuilt from the stored trace alone (the
    context library, pure) has the fingerprint of the body that was sent."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "trace", "verify", trace_id, "--app", services.app],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{calls}/{calls} model calls rebuilt from the stored trace match" in proc.stderr, proc.stderr


def test_a_chat_turn_asks_tool_states_and_a_required_tool_gets_its_instruction(client, keys, services, model):
    payload = {"text": "Hi", "tools": {"note": "auto", "lookup": "required"}}
    publish(client, keys, trace_id="s-1", turn_id="t1", agent="chat", input=payload)
    (first,) = wait_replies(client, keys, 1)
    publish(client, keys, trace_id="s-1", turn_id="t2", agent="chat", text="Hello")  # a string is the input's text
    second = wait_replies(client, keys, 2)[1]
    # offered: declared, supplied and not off, in declaration order (note is off by default)
    assert first.answer == "tools=note,lookup,clock,fresh", first
    assert second.answer == "tools=lookup,clock,fresh", second
    one, two = bodies(model)
    assert one["messages"][-1] == {"role": "user", "content": "Hi\n\nUse the lookup tool for this message."}
    assert two["messages"][1]["content"] == "Hi\n\nUse the lookup tool for this message."  # the earlier turn as it was
    assert two["messages"][-1] == {"role": "user", "content": "Hello"}
    turns = [e for e in trace_events(client, keys, "s-1") if isinstance(e, TurnInput)]
    assert turns[0].input == payload and turns[0].text == "Hi"  # the raw payload, kept
    assert turns[0].tools == {"note": "auto", "lookup": "required", "clock": "auto", "fresh": "auto", "absent": "auto"}
    assert turns[0].instructions == ("Use the lookup tool for this message.",)
    assert turns[1].input is None and turns[1].tools["note"] == "off"
    verified(services, "s-1", 2)


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        ({"text": "x", "tools": {"clock": "off"}}, "locks it at 'auto'"),
        ({"text": "x", "tools": {"nope": "auto"}}, "'nope', which its agent does not declare"),
        ({"text": "x", "tools": {"absent": "required"}}, "'absent', which this app does not supply"),
        ({"text": "x", "tools": {"lookup": "sometimes"}}, "`$.input.tools.lookup`"),
        ({"text": "x", "tols": {"lookup": "off"}}, "unknown field `$.input.tols`"),
    ],
)
def test_a_turn_asking_what_its_agent_does_not_allow_is_refused(client, keys, services, model, asked, why):
    publish(client, keys, trace_id="r-1", turn_id="t1", agent="chat", input=asked)
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "failed" and reply.code == "bad_turn", reply
    assert why in reply.reason, reply.reason
    assert model.requests == []  # no model call was made


def test_by_default_a_repeated_call_gets_the_earlier_result_again_without_running(client, keys, services, model):
    publish(client, keys, trace_id="p-1", turn_id="t1", agent="chat", text="REPEAT please")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.answer == "Results: found same | found same | found same", reply
    results = [e for e in trace_events(client, keys, "p-1") if isinstance(e, ToolOutput)]
    assert [r.repeat_of for r in results] == [None, results[0].call_id, results[0].call_id]
    assert client.xlen(keys.tools_for("default", "p-1")) == 1  # only the first call ran
    verified(services, "p-1", 4)
    # a tool whose own repeats are on runs each time, whatever the agent's setting
    publish(client, keys, trace_id="p-2", turn_id="t1", agent="chat", text="REPEAT FRESH please")
    wait_replies(client, keys, 2)
    fresh = [e for e in trace_events(client, keys, "p-2") if isinstance(e, ToolOutput)]
    assert [r.repeat_of for r in fresh] == [None, None, None]
    assert client.xlen(keys.tools_for("default", "p-2")) == 4


def test_per_turn_settings_and_their_refusal(client, keys, services, model):
    publish(client, keys, trace_id="g-1", turn_id="t1", agent="gated", text="tell me the forbidden thing")
    (refused,) = wait_replies(client, keys, 1)
    assert refused.status == "failed" and refused.code == "forbidden", refused
    assert "that topic is not served here" in refused.reason  # the function's reason, with the app's resources
    assert model.requests == []
    publish(client, keys, trace_id="g-2", turn_id="t1", agent="gated", text="Hello", model="big")
    publish(client, keys, trace_id="g-3", turn_id="t1", agent="gated", text="Hello")
    wait_replies(client, keys, 3)
    prompts = {b["model"]: b["messages"][0]["content"] for b in bodies(model)}
    assert prompts == {
        "scripted-big": "You are the big model's agent.",
        "scripted-model": "You are the small model's agent.",
    }
    verified(services, "g-2", 1)


def test_a_typed_input_is_rendered_by_its_hook_and_an_unparsable_one_as_recorded(client, keys, services, model):
    chat = {"text": "Hi", "tools": {"lookup": "off"}}
    turns = [
        ("chat", chat),
        ("tickets", {"text": "Printer broken", "ticket": 7}),
        ("tickets", {"text": "hidden", "ticket": 8}),
    ]
    for n, (agent, payload) in enumerate(turns, 1):  # one after the other: the trace holds them in this order
        publish(client, keys, trace_id="k-1", turn_id=f"t{n}", agent=agent, input=payload)
        wait_replies(client, keys, n)
    last = bodies(model)[-1]
    users = [m["content"] for m in last["messages"] if m["role"] == "user"]
    # the chat turn does not parse as a Ticket: shown as recorded (its payload as JSON); the
    # app's hook renders a ticket; the hook's None keeps the third input from the model
    assert users == [json.dumps(chat, sort_keys=True), "Ticket #7: Printer broken"]
    assert [e.input for e in trace_events(client, keys, "k-1") if isinstance(e, TurnInput)][2] == {
        "text": "hidden",
        "ticket": 8,
    }
    verified(services, "k-1", 3)


def _readme_section():
    section = docs.section(
        docs.page("tutorials/tools-and-mcp.md"), "## Typed inputs, tool states and per-turn settings"
    )
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    line = re.search(r"^redis-cli XADD agentstream:turns '\*' turn '(.*)'$", section, re.M).group(1)
    return code, line


def test_the_readme_chat_turn_published_from_redis_cli(client, keys, redis_url, namespace, model, tmp_path):
    code, payload = _readme_section()
    (tmp_path / "readme_weather.py").write_text(code)
    s = _services(
        redis_url,
        namespace,
        model,
        tmp_path,
        "readme_weather:app",
        extra_env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    try:
        client.xadd(keys.turns, {"turn": payload})  # exactly the README's payload
        (reply,) = wait_replies(client, keys, 1)
    finally:
        s.stop_all()
    assert reply.status == "ended" and reply.answer == "18C, cloudy in Oslo", reply  # the tool's result is the answer
    first = bodies(model)[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather"]  # get_forecast is off
    assert first["messages"][-1]["content"] == "Weather in Oslo?\n\nUse the get_weather tool for this message."


def test_schema_turn_gives_one_schema_per_agent_with_its_input():
    from typer.testing import CliRunner

    from agentstream.cli.commands import cli

    result = CliRunner().invoke(cli, ["schema", "turn", "--app", "tests.support.agent_apps:typed_app"])
    assert result.exit_code == 0, result.output
    schemas = json.loads(result.output)
    assert set(schemas) == {"chat", "gated", "tickets", "plain"}
    tickets = schemas["tickets"]
    body = tickets["$defs"]["TurnMessage"]
    assert body["properties"]["agent"] == {"const": "tickets"}
    assert body["properties"]["input"]["required"] == ["text", "ticket"]
    assert "text" in body["properties"]  # its type has a text: a plain message may come as `text`
    chat_input = schemas["chat"]["$defs"]["TurnMessage"]["properties"]["input"]
    assert "tools" in json.dumps(chat_input) and chat_input.get("additionalProperties") is False


def test_after_the_app_changes_its_input_type_an_earlier_input_is_shown_as_recorded(client, keys, services, model):
    first = {"text": "Hi", "tools": {"note": "auto"}}
    publish(client, keys, trace_id="v-1", turn_id="t1", agent="chat", input=first)
    wait_replies(client, keys, 1)
    services.stop("loop")
    services.app = "tests.support.agent_apps:changed_app"  # the chat agent now takes tickets
    services.start("loop2", "agent-loop")
    publish(client, keys, trace_id="v-1", turn_id="t2", agent="chat", input={"text": "Printer broken", "ticket": 7})
    (_, reply) = wait_replies(client, keys, 2)
    assert reply.status == "ended", reply
    users = [m["content"] for m in bodies(model)[-1]["messages"] if m["role"] == "user"]
    assert users == [json.dumps(first, sort_keys=True), "Ticket #7: Printer broken"]  # the old one as recorded
    turns = [e for e in trace_events(client, keys, "v-1") if isinstance(e, TurnInput)]
    assert turns[0].input == first  # the stored turn keeps its raw payload
