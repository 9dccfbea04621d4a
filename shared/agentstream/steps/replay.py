"""Rebuilding the exact request of every model call in a stored trace (pure).

For each ModelOutput in a trace, the request is rebuilt from the events before it with the
same agent and model endpoint, rendered by the endpoint's provider format
(:func:`agentstream.models.formats.candidate_bodies`), and its sha256 is compared with the
fingerprint recorded at call time.

The trace is read once: each agent's fold of it is fed the events added since its last call
(as the per-worker cache does), and the compactions' outcomes are indexed as they are read, so
rebuilding every call of a trace costs time in proportion to its length, not to its square.
The requests are those that :func:`agentstream.steps.summarising.sent_request` builds from each prefix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from agentstream.context import BuiltContext, build_context, settings_of
from agentstream.context._context_fold import ContextFold
from agentstream.context.builder import build_from_state, new_state, request_after_miss, stale_hidden
from agentstream.context.limits import WINDOW_MISS
from agentstream.context.render import EventFilter
from agentstream.context.request import ChatRequest
from agentstream.declarations.agents import Agent
from agentstream.delegation import offered_agent
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint
from agentstream.steps.summarising import Send, decide
from agentstream.wire.events import (
    Compaction,
    CompactionFailed,
    Event,
    ModelOutput,
    TurnInput,
)


@dataclass(frozen=True)
class RebuiltCall:
    """One model call rebuilt: its turn, step, body, and whether the fingerprint matches.

    ``endpoint`` is the endpoint whose settings rendered the body, ``configured`` whether it is
    a configured one (else a stand-in with default settings for the recorded provider).
    ``recorded_prompt_digest`` and ``rebuilt_prompt_digest`` are the digests of the prompt file
    texts the call read and that the rebuild read (``""`` without a prompt file): when they
    differ, the prompt file changed since the call (:attr:`prompt_changed`).
    """

    turn_id: str
    step: int
    body: bytes
    recorded_sha256: str
    rebuilt_sha256: str
    endpoint: ModelEndpoint | None = None
    configured: bool = True
    recorded_prompt_digest: str = ""
    rebuilt_prompt_digest: str = ""

    @property
    def matches(self) -> bool:
        return self.recorded_sha256 == self.rebuilt_sha256

    @property
    def prompt_changed(self) -> bool:
        """Whether the agent's prompt file texts for the call's endpoint differ from the ones it read."""
        return self.recorded_prompt_digest != self.rebuilt_prompt_digest


def _endpoint_of(
    output: ModelOutput, agent: Agent, endpoints: Mapping[str, ModelEndpoint], model_name: str | None
) -> ModelEndpoint:
    """The endpoint a recorded call went to: by the id it recorded, else the agent's; an
    endpoint no longer configured is stood in for by its recorded provider with default settings."""
    recorded = output.endpoint or agent.model or ""  # "": neither (no endpoint has that id)
    endpoint = endpoints.get(recorded) or endpoints.get(agent.model or "")
    if endpoint is None:
        endpoint = ModelEndpoint(
            id=recorded,
            provider=output.provider or "openai",
            base_url="",
            model=model_name or output.model,
            stream=False,
        )
    return endpoint


def _candidates(
    request: ChatRequest, endpoint: ModelEndpoint, output: ModelOutput, *, configured: bool
) -> Iterator[bytes]:
    """The bodies the call may have sent, most likely first (each endpoint variant's, made when reached)."""
    variants = [endpoint]
    if output.model and output.model != endpoint.model:  # the endpoint's model changed since
        variants.append(dataclasses.replace(endpoint, model=output.model))
    if not configured:  # unknown settings: the call may have been streamed or not
        variants += [dataclasses.replace(v, stream=not v.stream) for v in variants]
    for variant in variants:
        yield from formats.candidate_bodies(request, variant)


def _matching(bodies: Iterable[bytes], recorded_sha256: str) -> tuple[bytes, str]:
    """The first body whose fingerprint is the recorded one, else the first body; with its fingerprint."""
    first: tuple[bytes, str] | None = None
    for body in bodies:
        sha256 = formats.fingerprint(body)
        if sha256 == recorded_sha256:
            return body, sha256
        if first is None:
            first = (body, sha256)
    assert first is not None, "a request has at least one body"
    return first


class _Folds:
    """The trace folded once per agent, each fold fed the events added since its last call.

    Each call's context is the one :func:`agentstream.context.build_context` builds from the
    events before it (the per-worker cache's path, property-tested against it). An agent whose
    selection is a plain function (not :func:`agentstream.context.only`) reads the whole prefix
    at each call: its calls are built from the start.
    """

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.states: dict[str, tuple[Agent, ContextFold]] = {}

    def build(self, agent: Agent, upto: int, *, turn_id: str, step: int) -> BuiltContext:
        """The context of a call from the events before index ``upto``."""
        config, limits = settings_of(agent)
        if config.select is not None and not isinstance(config.select, EventFilter):
            return build_context(self.events[:upto], agent, turn_id=turn_id, step=step)
        held = self.states.get(agent.name)
        if held is None or held[0] is not agent:
            held = self.states[agent.name] = (agent, new_state((), agent, config, limits))
        state = held[1]
        state.feed(self.events[state.count : upto])
        if stale_hidden(state, turn_id):  # a rollback came: fold again without the turn it rolls back
            state = new_state(self.events[:upto], agent, config, limits, turn_id=turn_id)
            self.states[agent.name] = (agent, state)
        return build_from_state(state, turn_id=turn_id, step=step)


class _Outcomes:
    """The compactions' recorded outcomes read so far (the first of each), and whether a summary was made."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], Compaction | CompactionFailed] = {}
        self.compacted = False

    def read(self, event: Event) -> None:
        if isinstance(event, (Compaction, CompactionFailed)):
            self.first.setdefault((event.turn_id, event.kept_from_turn), event)
            self.compacted = self.compacted or isinstance(event, Compaction)


def rebuild_calls(
    events: Sequence[Event],
    agent_of: Callable[[str], Agent | None],
    *,
    endpoints: Mapping[str, ModelEndpoint] | None = None,
    model_name: str | None = None,
) -> list[RebuiltCall]:
    """Every model call of the trace, rebuilt from the events before it.

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        endpoints: the configured model endpoints by id (their provider, model and quirks
            decide the body; their window and characters per token are the limits of an agent
            without ``model_limits``, as in the agent loop); a call whose endpoint is not among them is rebuilt for its
            recorded provider and model with default settings.
        model_name: the model name for calls whose endpoint is not configured (default: the
            recorded one).

    Raises:
        KeyError: a turn names an agent the app does not have.
        ContextError: a call's context cannot be built with the app as it is now (see
            :func:`agentstream.steps.summarising.sent_request`).
    """
    turns: dict[str, TurnInput] = {}
    out: list[RebuiltCall] = []
    folds = _Folds(events)
    outcomes = _Outcomes()
    for index, event in enumerate(events):
        if isinstance(event, TurnInput):
            turns.setdefault(event.turn_id, event)
        elif isinstance(event, ModelOutput):
            turn = turns[event.turn_id]
            agent = agent_of(turn.agent)
            if agent is None:
                raise KeyError(f"turn {event.turn_id!r}: agent {turn.agent!r} is not in the app")
            agent = offered_agent(agent, turn, endpoints)  # its endpoint's limits, as the agent loop had them
            miss = event.attributes.get(WINDOW_MISS)
            if isinstance(miss, dict):  # sent again, smaller, after the server refused it as over its window
                figures = {k: miss.get(k) for k in ("prompt_tokens", "window_tokens", "over_by_tokens")}
                request = request_after_miss(events[:index], agent, turn_id=event.turn_id, step=event.step, **figures)
            else:
                built = folds.build(agent, index, turn_id=event.turn_id, step=event.step)
                plan = built.compaction  # sent_request(events[:index], ...), with the outcomes read so far
                outcome = outcomes.first.get((plan.turn_id, plan.kept_from_turn)) if plan is not None else None
                decision = decide(built, agent, outcome=outcome, compacted=outcomes.compacted)
                request = decision.request if isinstance(decision, Send) else built.request
            endpoint = _endpoint_of(event, agent, endpoints or {}, model_name)
            configured = endpoint.id in (endpoints or {}) and endpoints[endpoint.id] is endpoint  # type: ignore[index]
            body, sha256 = _matching(_candidates(request, endpoint, event, configured=configured), event.request_sha256)
            out.append(
                RebuiltCall(
                    turn_id=event.turn_id,
                    step=event.step,
                    body=body,
                    recorded_sha256=event.request_sha256,
                    rebuilt_sha256=sha256,
                    endpoint=endpoint,
                    configured=configured,
                    recorded_prompt_digest=event.prompt_digest,
                    rebuilt_prompt_digest=agent.prompt_digest,
                )
            )
        outcomes.read(event)
    return out


def endpoint_settings(endpoint: ModelEndpoint, *, configured: bool = True) -> str:
    """One line: the endpoint settings that decide a rebuilt body (for a mismatch's report)."""
    quirks = endpoint.quirks.model_dump(exclude_defaults=True)
    parts = [
        f"endpoint {endpoint.id!r}"
        + ("" if configured else " (not configured: the recorded provider with default settings)"),
        f"provider {endpoint.provider}",
        f"model {endpoint.model}",
        f"stream {endpoint.stream}",
        f"window {endpoint.window_tokens} tokens",
        f"{endpoint.chars_per_token} chars/token",
        f"quirks {json.dumps(quirks, sort_keys=True) if quirks else 'default'}",
    ]
    if endpoint.extra_body:
        parts.append(f"extra_body keys {sorted(endpoint.extra_body)}")
    return ", ".join(parts)
