"""Rebuilding the exact request of every model call in a stored trace (pure).

For each ModelOutput in a trace, the request is rebuilt from the events before it with the
same agent and model endpoint, rendered by the endpoint's provider format
(:func:`agentstream.models.formats.candidate_bodies`), and its sha256 is compared with the
fingerprint recorded at call time.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agentstream.app import Agent
from agentstream.compacting import sent_request
from agentstream.delegation import offered_agent
from agentstream.events import Event, ModelOutput, TurnInput
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint


@dataclass(frozen=True)
class RebuiltCall:
    """One model call rebuilt: its turn, step, body, and whether the fingerprint matches.

    ``endpoint`` is the endpoint whose settings rendered the body, ``configured`` whether it is
    a configured one (else a stand-in with default settings for the recorded provider).
    """

    turn_id: str
    step: int
    body: bytes
    recorded_sha256: str
    rebuilt_sha256: str
    endpoint: ModelEndpoint | None = None
    configured: bool = True

    @property
    def matches(self) -> bool:
        return self.recorded_sha256 == self.rebuilt_sha256


def _endpoint_of(output: ModelOutput, agent: Agent, endpoints: Mapping[str, ModelEndpoint], model_name: str | None) -> ModelEndpoint:
    """The endpoint a recorded call went to: by the id it recorded, else the agent's; an
    endpoint no longer configured is stood in for by its recorded provider with default settings."""
    endpoint = endpoints.get(output.endpoint or agent.model) or endpoints.get(agent.model)
    if endpoint is None:
        endpoint = ModelEndpoint(
            id=output.endpoint or agent.model,
            provider=output.provider or "openai",
            base_url="",
            model=model_name or output.model,
            stream=False,
        )
    return endpoint


def _candidates(request, endpoint: ModelEndpoint, output: ModelOutput, *, configured: bool) -> list[bytes]:
    variants = [endpoint]
    if output.model and output.model != endpoint.model:  # the endpoint's model changed since
        variants.append(dataclasses.replace(endpoint, model=output.model))
    if not configured:  # unknown settings: the call may have been streamed or not
        variants += [dataclasses.replace(v, stream=not v.stream) for v in variants]
    bodies: list[bytes] = []
    for variant in variants:
        bodies += formats.candidate_bodies(request, variant)
    return bodies


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
    """
    turns: dict[str, TurnInput] = {}
    out: list[RebuiltCall] = []
    for index, event in enumerate(events):
        if isinstance(event, TurnInput):
            turns.setdefault(event.turn_id, event)
        elif isinstance(event, ModelOutput):
            turn = turns[event.turn_id]
            agent = agent_of(turn.agent)
            if agent is None:
                raise KeyError(f"turn {event.turn_id!r}: agent {turn.agent!r} is not in the app")
            agent = offered_agent(agent, turn, endpoints)  # its endpoint's limits, as the agent loop had them
            request = sent_request(events[:index], agent, turn_id=event.turn_id, step=event.step)
            endpoint = _endpoint_of(event, agent, endpoints or {}, model_name)
            configured = endpoint.id in (endpoints or {}) and endpoints[endpoint.id] is endpoint  # type: ignore[index]
            bodies = _candidates(request, endpoint, event, configured=configured)
            body = next((b for b in bodies if formats.fingerprint(b) == event.request_sha256), bodies[0])
            out.append(
                RebuiltCall(
                    turn_id=event.turn_id,
                    step=event.step,
                    body=body,
                    recorded_sha256=event.request_sha256,
                    rebuilt_sha256=formats.fingerprint(body),
                    endpoint=endpoint,
                    configured=configured,
                )
            )
    return out


def endpoint_settings(endpoint: ModelEndpoint, *, configured: bool = True) -> str:
    """One line: the endpoint settings that decide a rebuilt body (for a mismatch's report)."""
    quirks = endpoint.quirks.model_dump(exclude_defaults=True)
    parts = [
        f"endpoint {endpoint.id!r}" + ("" if configured else " (not configured: the recorded provider with default settings)"),
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
