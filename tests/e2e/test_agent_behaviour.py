"""End to end: the agent as the seed describes it (issue 13), through the services: a turn
published on Redis, answered by the agent loop and a tool worker (separate processes) with a
scripted model over HTTP whose request bodies are asserted."""

from __future__ import annotations

import json

import pytest

from agentstream.steps.decision import PASSES_CAP_CODE
from agentstream.wire.events import ModelOutput, ToolOutput, TurnFailed
from tests.support.procs import Services, publish_turn, trace_events, wait_replies
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e


def always_calls_tools(body):
    """Call ``lookup`` whenever tools are offered; answer only when they are not."""
    if body.get("tools"):
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return {
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"q": f"w{n}"})},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    results = sum(1 for m in body["messages"] if m["role"] == "tool")
    return {"message": {"role": "assistant", "content": f"Answer after {results} results."}, "finish_reason": "stop"}


@pytest.fixture
def model():
    with ScriptedModelServer(always_calls_tools) as server:
        yield server


MODELS_FILE = """
models:
  big:
    provider: openai
    base_url: {url}
    model: scripted-big
  small:
    provider: openai
    base_url: {url}
    model: scripted-small
"""


@pytest.fixture
def services(redis_url, namespace, model, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_FILE.format(url=model.base_url))
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=model.base_url,
        app="tests.support.agent_apps:app",
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_MODELS_FILE": str(models)},
    )
    s.start("loop", "agent-loop")
    s.start("tools", "tool-worker")
    yield s
    s.stop_all()


def test_the_passes_cap_as_the_seed_counts_it(client, keys, services, model):
    publish_turn(client, keys, trace_id="cap-1", turn_id="t1", agent="looper", text="Look everything up")
    (reply,) = wait_replies(client, keys, 1)
    # max_passes=2: two calls with tools run; one more keeps the tools (its call gets the directive);
    # the fourth is made without tools, so the model can only answer
    assert reply.status == "ended" and reply.answer == "Answer after 3 results.", reply
    bodies = [json.loads(raw) for raw in model.requests]
    assert [bool(b.get("tools")) for b in bodies] == [True, True, True, False]
    assert bodies[2]["tool_choice"] == "auto"
    events = trace_events(client, keys, "cap-1")
    results = [e for e in events if isinstance(e, ToolOutput)]
    assert [(r.text, r.error) for r in results[:2]] == [("found w0", None), ("found w1", None)]  # run by the worker
    assert results[2].error == PASSES_CAP_CODE and "Do not call any more tools" in results[2].text  # never ran
    assert client.xlen(keys.tools_for("default", "cap-1")) == 2  # only two jobs were ever published
    assert sum(isinstance(e, ModelOutput) for e in events) == 4


def test_a_turn_runs_wholly_on_the_model_it_names(client, keys, services, model):
    turn = {"trace_id": "m-1", "turn_id": "t1", "agent": "chooser", "text": "Look it up", "model": "big"}
    client.xadd(keys.turns, {"turn": json.dumps(turn)})
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended", reply
    bodies = [json.loads(raw) for raw in model.requests]
    assert len(bodies) >= 2 and {b["model"] for b in bodies} == {"scripted-big"}  # every call of the turn
    publish_turn(client, keys, trace_id="m-1", turn_id="t2", agent="chooser", text="And again")
    wait_replies(client, keys, 2)
    later = [json.loads(raw)["model"] for raw in model.requests[len(bodies) :]]
    assert later and set(later) == {"scripted-model"}  # a turn that names none runs on the agent's own


@pytest.mark.parametrize(("named", "why"), [("small", "does not allow"), ("nowhere", "does not allow")])
def test_a_turn_naming_a_model_its_agent_does_not_allow_is_refused(client, keys, services, model, named, why):
    turn = {"trace_id": "m-2", "turn_id": "t1", "agent": "chooser", "text": "Look it up", "model": named}
    client.xadd(keys.turns, {"turn": json.dumps(turn)})
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "failed" and reply.code == "bad_turn", reply
    assert "`model`" in reply.reason and named in reply.reason and why in reply.reason and "big" in reply.reason
    assert model.requests == []  # no model call was made
    # refused before it entered the trace: only its ending is stored, not its text
    assert [type(e) for e in trace_events(client, keys, "m-2")] == [TurnFailed]


def test_an_agent_without_a_default_model_runs_only_turns_that_name_one_it_allows(client, keys, services, model):
    for n, named in enumerate([None, "default", "nowhere"], 1):  # none, one it does not allow, an unknown one
        turn = {"trace_id": f"p-{n}", "turn_id": "t1", "agent": "picky", "text": "Look it up"}
        client.xadd(keys.turns, {"turn": json.dumps(turn if named is None else {**turn, "model": named})})
    replies = {r.trace_id: r for r in wait_replies(client, keys, 3)}
    assert all(r.status == "failed" and r.code == "bad_turn" for r in replies.values()), replies
    assert (
        "names no model in its field `model`" in replies["p-1"].reason and "no default model" in replies["p-1"].reason
    )
    assert "big, small" in replies["p-1"].reason  # what to name instead
    for n, named in [(2, "default"), (3, "nowhere")]:
        assert (
            f"model {named!r}" in replies[f"p-{n}"].reason
            and "does not allow (allowed: big, small)" in replies[f"p-{n}"].reason
        )
    assert model.requests == []  # no model call was made
    assert [type(e) for e in trace_events(client, keys, "p-1")] == [TurnFailed]  # nothing of it stored but its ending
    publish_turn(client, keys, trace_id="p-4", turn_id="t1", agent="picky", text="Look it up", model="small")
    (reply,) = [r for r in wait_replies(client, keys, 4) if r.trace_id == "p-4"]
    assert reply.status == "ended", reply
    assert {json.loads(raw)["model"] for raw in model.requests} == {"scripted-small"}  # the whole turn on it


def test_an_unknown_field_on_the_turn_message_is_refused_naming_it(client, keys, services, model):
    turn = {"trace_id": "u-1", "turn_id": "t1", "agent": "looper", "text": "Hi", "metdata": {"user": "u7"}}
    client.xadd(keys.turns, {"turn": json.dumps(turn)})
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "failed" and reply.code == "bad_turn" and "`metdata`" in reply.reason, reply
    assert model.requests == []
