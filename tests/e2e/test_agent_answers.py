"""End to end: the agent's passes, prompts and answers (issue 13, sections 4–7), through the
services (agent loop, tool worker and delegation service as separate processes, a turn
published on Redis, a scripted model over HTTP whose request bodies are asserted)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentstream.models.endpoints import load_endpoints
from agentstream.ops.settings import Settings
from agentstream.steps.replay import rebuild_calls
from agentstream.wire.events import ModelOutput, ToolOutput, TurnEnded
from tests.support import answer_apps
from tests.support.procs import Services, publish_turn, trace_events, wait_replies

pytestmark = pytest.mark.e2e


MODELS_FILE = """
models:
  big:
    provider: openai
    base_url: {url}
    model: scripted-big
"""


@pytest.fixture
def models_file(tmp_path, scripted_model):
    path = tmp_path / "models.yaml"
    path.write_text(MODELS_FILE.format(url=scripted_model.base_url))
    return path


@pytest.fixture
def services(redis_url, namespace, scripted_model, tmp_path, models_file):
    scripted_model.rule = answer_apps.rule
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=scripted_model.base_url,
        app="tests.support.answer_apps:app",
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_MODELS_FILE": str(models_file)},
    )
    s.start("loop", "agent-loop")
    s.start("tools", "tool-worker")
    s.start("delegation", "delegation")
    yield s
    s.stop_all()


def test_each_answer_to_a_request_starts_the_passes_count_again(client, keys, services, scripted_model):
    # max_passes=1 and no rounds after the cap: without the reset, the manager's second call
    # would get no tools; each subagent's answer starts the count again, so it hands out three
    publish_turn(client, keys, trace_id="reset-1", turn_id="t1", agent="manager", text="Do three tasks")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert reply.status == "ended" and reply.answer == "Done after 3 answers.", reply
    events = trace_events(client, keys, "reset-1")
    results = [e for e in events if isinstance(e, ToolOutput)]
    assert [(r.name, r.error) for r in results] == [("ask_helper", None)] * 3
    assert [r.text for r in results] == [f"helped with task {n}" for n in (1, 2, 3)]
    manager_bodies = [
        json.loads(raw)
        for raw in scripted_model.requests
        if json.loads(raw)["messages"][0]["content"].startswith("MANAGER")
    ]
    assert [bool(b.get("tools")) for b in manager_bodies] == [True, True, True, True]
    assert sum(isinstance(e, ModelOutput) for e in events) == 4


def bodies_of(scripted_model, role):
    out = [json.loads(raw) for raw in scripted_model.requests]
    return [b for b in out if b["messages"][0]["content"].startswith(role)]


def rebuilt(client, keys, trace_id, scripted_model, models_file, monkeypatch):
    """Every model call of the trace rebuilt from the stored events with the app → the calls."""
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_model.base_url)
    monkeypatch.setenv("OPENAI_MODEL", "scripted-model")
    monkeypatch.setenv("AGENTSTREAM_MODELS_FILE", str(models_file))
    endpoints = load_endpoints(Settings())
    return rebuild_calls(trace_events(client, keys, trace_id), answer_apps.app.agent, endpoints=endpoints)


def test_a_prompt_file_layer_is_chosen_per_call_and_a_cited_answer_comes_back(
    client, keys, services, scripted_model, models_file, monkeypatch
):
    publish_turn(client, keys, trace_id="pf-1", turn_id="t1", agent="writer", text="How much leave do I get?")
    client.xadd(
        keys.turns,
        {
            "turn": json.dumps(
                {
                    "trace_id": "pf-1",
                    "turn_id": "t2",
                    "agent": "writer",
                    "text": "And again, on the big model?",
                    "model": "big",
                }
            )
        },
    )
    first, second = wait_replies(client, keys, 2, timeout_s=60)
    for reply in (first, second):
        assert reply.status == "ended" and reply.answer == "Staff get 25 days.", reply
        (cited,) = reply.citations  # the sources the answer's marks resolved to, in the reply
        assert (cited.id, cited.title, cited.url) == ("hb:leave#0", "Leave policy", "https://handbook.example/leave")
    bodies = bodies_of(scripted_model, "WRITER")
    default, big = (
        [b for b in bodies if b["model"] == "scripted-model"],
        [b for b in bodies if b["model"] == "scripted-big"],
    )
    assert default and big
    # the layer naming each call's endpoint, with the citation style's example filled in
    assert {b["messages"][0]["content"] for b in default} == {
        "WRITER. Default layer: be brief. Cite each source like [1]."
    }
    assert {b["messages"][0]["content"] for b in big} == {
        "WRITER. Answer plainly. Big layer: be thorough. Cite each source like [1]."
    }
    # the file's tool texts replace the tool's own description, per endpoint
    assert default[0]["tools"][0]["function"]["description"] == "Search the staff handbook (base text)."
    tool = big[0]["tools"][0]["function"]
    assert (
        tool["description"] == "Search the handbook (big layer)."
        and tool["parameters"]["properties"]["topic"]["description"] == "One word."
    )
    events = trace_events(client, keys, "pf-1")
    endings = [e for e in events if isinstance(e, TurnEnded)]
    assert [len(e.citations) for e in endings] == [1, 1] and endings[0].citations[0].id == "hb:leave#0"  # in the trace
    outputs = [e for e in events if isinstance(e, ModelOutput)]
    digests = {o.endpoint: o.prompt_digest for o in outputs}
    assert digests["default"] and digests["big"] and digests["default"] != digests["big"]  # what a rebuild compares
    calls = rebuilt(client, keys, "pf-1", scripted_model, models_file, monkeypatch)
    assert len(calls) == len(outputs) and all(
        c.matches and not c.prompt_changed for c in calls
    )  # rebuilt from the trace
    # the prompt file edited since: the rebuild differs, and says the prompt file is what changed
    edited = dataclasses.replace(
        answer_apps.app.agent("writer"),
        system_prompt=answer_apps.WRITER_PROMPTS.model_copy(
            update={"system": answer_apps.WRITER_PROMPTS.system.replace("Cite each", "Always cite each")}
        ),
    )
    again = rebuild_calls(trace_events(client, keys, "pf-1"), lambda name: edited, endpoints=load_endpoints(Settings()))
    assert all(not c.matches and c.prompt_changed for c in again)


def test_a_prompt_function_writes_each_turns_system_prompt(client, keys, services, scripted_model):
    publish_turn(client, keys, trace_id="fn-1", turn_id="t1", agent="scribe", text="Hello {citation} {context}")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended", reply
    (body,) = bodies_of(scripted_model, "SCRIBE")
    assert (
        body["messages"][0]["content"]
        == "SCRIBE. The turn says 'Hello {citation} {context}'; cite like [1]; {braces} stay."
    )


def test_a_text_prompt_fills_the_turns_context_and_the_citation_in_one_pass(client, keys, services, scripted_model):
    turn = {
        "trace_id": "ctx-1",
        "turn_id": "t1",
        "agent": "briefer",
        "input": {"text": "Hi", "context": "  The user {citation} is a pupil.  "},
    }
    client.xadd(keys.turns, {"turn": json.dumps(turn)})
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended", reply
    (body,) = bodies_of(scripted_model, "BRIEFER")
    # the turn's text is never read as a placeholder; other braces stay; the spaces around it go
    assert (
        body["messages"][0]["content"]
        == "BRIEFER. Context: The user {citation} is a pupil.. Cite like [1]; {other} braces stay."
    )


def test_a_tools_result_is_the_answer_and_the_model_is_not_called_again(
    client, keys, services, scripted_model, models_file, monkeypatch
):
    publish_turn(client, keys, trace_id="ans-1", turn_id="t1", agent="adder", text="What is 20 + 22?")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended" and reply.answer == "20 + 22 = 42", reply
    assert len(bodies_of(scripted_model, "ADDER")) == 1  # one call: it chose the tool; the tool answered
    assert bodies_of(scripted_model, "ADDER")[0]["messages"][0]["content"] == (
        "ADDER. Use the add tool; a {placeholder} of another name stays."
    )
    events = trace_events(client, keys, "ans-1")
    (result,) = [e for e in events if isinstance(e, ToolOutput)]
    (ended,) = [e for e in events if isinstance(e, TurnEnded)]
    assert ended.answer_call == result.call_id and ended.answer == result.text
    # the next turn's context shows that answer as the assistant's message after the result
    publish_turn(client, keys, trace_id="ans-1", turn_id="t2", agent="adder", text="And 1 + 2?")
    wait_replies(client, keys, 2)
    later = bodies_of(scripted_model, "ADDER")[1]["messages"]
    assert [m["role"] for m in later] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert later[4]["content"] == "20 + 22 = 42"
    assert all(c.matches for c in rebuilt(client, keys, "ans-1", scripted_model, models_file, monkeypatch))
