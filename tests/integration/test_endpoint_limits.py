"""An agent without ``model_limits`` runs on its endpoint's window and characters per token, in
the agent loop, the compaction service and replay alike (so fingerprints still match)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentstream import App
from agentstream.delegation import offered_agent
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint
from agentstream.steps.replay import rebuild_calls
from agentstream.steps.summarising import sent_request
from agentstream.wire.events import Compaction, ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnFailed, TurnInput
from agentstream_services.compaction.compactor import Compactor
from tests.integration.test_compaction_service import FakeModel, conversation
from tests.support import apps
from tests.support.compaction_apps import chatty
from tests.support.inprocess import InProcess, events_of, publish, wait_reply
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.integration


def _endpoint(window: int, chars_per_token: float = 3.0) -> ModelEndpoint:
    return ModelEndpoint(
        id="default",
        provider="openai",
        base_url="http://127.0.0.1:9/v1",
        model="m",
        window_tokens=window,
        chars_per_token=chars_per_token,
        stream=False,
    )


def test_an_agent_without_limits_takes_its_endpoints_window_and_chars_per_token():
    calc = apps.app.agent("calc")
    assert calc is not None and calc.model_limits is None
    turn = TurnInput(turn_id="t", agent="calc", text="hi")
    offered = offered_agent(calc, turn, {"default": _endpoint(8192, 3.5)})
    assert offered.model_limits is not None
    assert (offered.model_limits.window.count, offered.model_limits.characters_per_token) == (8192, 3.5)
    assert offered_agent(calc, turn, {"default": _endpoint(8192, 3.5)}) is offered  # the same copy: caches keep working
    explicit = dataclasses.replace(calc, model_limits=_endpoint(1000).limits)
    assert offered_agent(explicit, turn, {"default": _endpoint(8192)}).model_limits == _endpoint(1000).limits


def _tool_trace(turns: int, result_chars: int) -> list:
    events: list = []
    for index in range(turns):
        t = f"t{index}"
        events += [
            TurnInput(turn_id=t, agent="calc", text=f"what is {index} + {index}?"),
            ModelOutput(
                turn_id=t,
                step=0,
                tool_calls=(ToolCall(id=f"c{index}", name="calculator", arguments='{"expression": "1+1"}'),),
            ),
            ToolOutput(turn_id=t, call_id=f"c{index}", name="calculator", text="2 " * (result_chars // 2)),
            ModelOutput(turn_id=t, step=1, content="2"),
            TurnEnded(turn_id=t, answer="2"),
        ]
    return events


def test_replay_rebuilds_a_call_made_with_the_endpoints_window():
    # 8 turns of 3 000-character results: about 8 000 tokens, over an 8 192-token window with the output reserve, but
    # well under the default 32 000: the loop shrank old results, and replay must too.
    endpoint = _endpoint(8192)
    events = _tool_trace(8, 3_000)
    last = TurnInput(turn_id="last", agent="calc", text="and now?")
    events.append(last)
    agent = offered_agent(apps.app.agent("calc"), last, {"default": endpoint})
    request = sent_request(events, agent, turn_id="last", step=0)
    body = formats.request_body(request, endpoint)
    assert body != formats.request_body(sent_request(events, apps.app.agent("calc"), turn_id="last", step=0), endpoint)
    events.append(ModelOutput(turn_id="last", step=0, content="4", request_sha256=formats.fingerprint(body)))
    [*_, call] = rebuild_calls(events, apps.app.agent, endpoints={"default": endpoint})
    assert call.matches, "replay built the call with other limits than the agent loop"


async def test_the_compaction_service_compacts_on_the_endpoints_window(store):
    unlimited = dataclasses.replace(chatty, model_limits=None)  # chatty's 4 000 tokens now come from its endpoint
    model = FakeModel(lambda request: "SUMMARY[turn 1, turn 2, turn 3]")
    model.endpoint = _endpoint(4_000)
    compactor = Compactor(App(agents=[unlimited]), store, {"default": model})
    job = await conversation(store, "c", 4)
    outcome = await compactor.compact(job)
    assert isinstance(outcome, Compaction), "no compaction: the service took the default 32 000-token window"


@pytest.fixture
def model():
    with ScriptedModelServer() as server:
        yield server


async def test_a_turn_over_the_endpoints_window_fails_context_full_before_any_call(
    redis_url, namespace, redis, keys, store, model, monkeypatch
):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    options = {"window_tokens": 8192, "stream": False}
    services = InProcess(
        apps.app, redis_url, namespace, model.base_url, env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(options)}
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        # an ordinary turn still fits: the policy's 8 192-token output reserve is capped at what the call may write
        await publish(redis, keys, trace_id="small", turn_id="t0", agent="calc", text="what is 2 + 3?")
        assert (await wait_reply(redis, keys, "t0")).status == "ended"
        sent = len(model.requests)
        await publish(redis, keys, trace_id="big", turn_id="t1", agent="calc", text="x " * 30_000)
        reply = await wait_reply(redis, keys, "t1")
        assert reply.status == "failed" and reply.code == "context_full", reply
        failed = [e for e in await events_of(store, "big") if isinstance(e, TurnFailed)]
        assert failed and "8192" in failed[0].reason, failed
        assert len(model.requests) == sent, "the request was sent to a model whose window it cannot fit"
    finally:
        await services.stop_all()
