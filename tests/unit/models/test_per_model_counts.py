"""Token counts and their corrections are per model: a count one model recorded never sizes a
call to another (turns can switch models, and each model has its own tokenizer)."""

from __future__ import annotations

import dataclasses

from agentstream.context import ModelLimits, Tokens, build_context
from agentstream.delegation import offered_agent
from agentstream.models.endpoints import ModelEndpoint
from agentstream.wire.events import TurnInput
from tests.unit.context.factory import Trace, make_agent

ENDPOINTS = {
    "big": ModelEndpoint(id="big", provider="openai", base_url="http://x/v1", model="big-model", window_tokens=20_000),
    "small": ModelEndpoint(
        id="small", provider="openai", base_url="http://x/v1", model="small-model", window_tokens=20_000
    ),
}


def trace_counted_by_big() -> tuple[Trace, str]:
    """A turn answered by ``big-model`` that recorded a prompt count far above the estimate."""
    trace = Trace()
    turn = trace.user("hello " * 200)
    trace.answer(turn, "hi", prompt_tokens=15_000, model="big-model")
    trace.end(turn)
    return trace, turn


def test_an_endpoints_limits_name_its_model():
    assert ENDPOINTS["small"].limits.model == "small-model"


def test_a_count_recorded_by_one_model_does_not_size_a_call_to_another():
    trace, _ = trace_counted_by_big()
    nxt = trace.user("and now?", model="small")
    sizes = {}
    for model in ("big", "small"):
        event = TurnInput(turn_id=nxt, agent="a", text="and now?", model=model)
        events = [*trace.events[:-1], event]
        agent = offered_agent(make_agent(model=model), event, ENDPOINTS)
        sizes[model] = build_context(events, agent, turn_id=nxt, step=0).size_tokens
    assert sizes["big"] > 15_000  # big-model's own count corrects big-model's estimate
    assert sizes["small"] < 2_000  # small-model's estimate is its own


def test_an_agents_own_limits_get_the_model_they_run_on():
    limits = ModelLimits(window=Tokens(20_000))
    trace, _ = trace_counted_by_big()
    nxt = trace.user("and now?", model="small")
    own = dataclasses.replace(make_agent(), model="big", model_limits=limits)
    agent = offered_agent(own, trace.events[-1], ENDPOINTS)
    assert agent.model_limits == ModelLimits(window=Tokens(20_000), model="small-model")
    unnamed = dataclasses.replace(agent, model_limits=limits)  # limits of no model trust every count
    assert build_context(trace.events, unnamed, turn_id=nxt, step=0).size_tokens > 15_000
    assert build_context(trace.events, agent, turn_id=nxt, step=0).size_tokens < 15_000


def test_the_agent_offered_for_a_turn_is_kept_per_endpoint():
    """Asked again for the same agent, turn and endpoint (every decision of a step asks), the same
    agent comes back; another endpoint under the same id (reconfigured) gives its own limits."""
    agent = make_agent(model="big")
    turn = TurnInput(turn_id="t1", agent="a", text="hi")
    first = offered_agent(agent, turn, ENDPOINTS)
    assert offered_agent(agent, turn, ENDPOINTS) is first
    assert offered_agent(agent, turn, dict(ENDPOINTS)) is first  # another mapping, the same endpoint
    wider = {"big": dataclasses.replace(ENDPOINTS["big"], window_tokens=50_000)}
    assert offered_agent(agent, turn, wider).model_limits.window == Tokens(50_000)
    assert first.model_limits.window == Tokens(20_000)
