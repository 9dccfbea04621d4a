"""Rebuilding the exact request of every model call in a stored trace (pure).

For each ModelOutput in a trace, the request is rebuilt from the events before it with the
same agent and model, and its sha256 is compared with the fingerprint recorded at call time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentstream.app import Agent
from agentstream.context import build_request
from agentstream.delegation import offered_agent
from agentstream.events import Event, ModelOutput, TurnInput
from agentstream.models import openai_format


@dataclass(frozen=True)
class RebuiltCall:
    """One model call rebuilt: its turn, step, body, and whether the fingerprint matches."""

    turn_id: str
    step: int
    body: bytes
    recorded_sha256: str
    rebuilt_sha256: str

    @property
    def matches(self) -> bool:
        return self.recorded_sha256 == self.rebuilt_sha256


def rebuild_calls(events: Sequence[Event], agent_of: Callable[[str], Agent | None], *, model_name: str) -> list[RebuiltCall]:
    """Every model call of the trace, rebuilt from the events before it.

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        model_name: the provider model name the calls were sent with.

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
            agent = offered_agent(agent, turn)
            request = build_request(events[:index], agent, turn_id=event.turn_id, step=event.step)
            body = openai_format.request_body(request, model=model_name)
            out.append(
                RebuiltCall(
                    turn_id=event.turn_id,
                    step=event.step,
                    body=body,
                    recorded_sha256=event.request_sha256,
                    rebuilt_sha256=openai_format.fingerprint(body),
                )
            )
    return out
