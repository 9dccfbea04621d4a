"""Explaining one model call of a stored trace (pure): the exact request, and why each result
was shortened.

What ``agentstream trace explain`` prints and the HTTP gateway's ``/explain`` returns. A call
that was made is rebuilt as ``trace verify`` rebuilds it (:func:`agentstream.steps.replay.rebuild_calls`:
the body rendered for the endpoint it went to, compared with the recorded fingerprint); a call
not made yet (the next one) is built as the agent's endpoint would get it now.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentstream.context.builder import hidden_for, rolled_back
from agentstream.declarations.agents import Agent
from agentstream.models.endpoints import ModelEndpoint
from agentstream.steps.forking import fork_line
from agentstream.wire.events import Event, ForkedFrom, ModelOutput, TurnInput


@dataclass(frozen=True)
class CallExplanation:
    """One model call explained.

    Attributes:
        turn_id: the call's turn.
        step: the call's step within its turn (0-based).
        call: the call's position among the trace's model calls (0-based).
        made: whether the call was made (False: the next call, not made yet).
        body: the request body, as sent (JSON bytes).
        recorded_sha256: the fingerprint recorded when the call was sent ("" when not made).
        rebuilt_sha256: the fingerprint of ``body``.
        size_tokens: the estimated size of the request (prompt and output reserve), in tokens.
        window_tokens: the context window it was built for, in tokens.
        shrunk: one line per shortened result: its handle, call, tool, form, by which shrink,
            at which model call (:func:`agentstream.context.describe_shrunk`).
        endpoint: the endpoint whose settings rendered the body, if any.
        configured: whether that endpoint is configured (else a stand-in with default settings).
        forked_from: where the trace was forked from (:func:`agentstream.steps.forking.fork_line`),
            or None for a trace that is no fork.
        left_out: the rolled-back turns this call's context leaves out (busy policy ``rollback``).
    """

    turn_id: str
    step: int
    call: int
    made: bool
    body: bytes
    recorded_sha256: str
    rebuilt_sha256: str
    size_tokens: int | None
    window_tokens: int | None
    shrunk: list[str] = field(default_factory=list)
    endpoint: ModelEndpoint | None = None
    configured: bool = True
    forked_from: str | None = None
    left_out: tuple[str, ...] = ()

    @property
    def matches(self) -> bool | None:
        """Whether the rebuilt body's fingerprint is the recorded one (None when not made)."""
        return self.rebuilt_sha256 == self.recorded_sha256 if self.recorded_sha256 else None

    def as_json(self, trace_id: str) -> dict[str, Any]:
        """The explanation as a JSON object (what ``trace explain --json`` prints)."""
        return {
            "trace_id": trace_id,
            "turn_id": self.turn_id,
            "step": self.step,
            "call": self.call,
            "made": self.made,
            "recorded_sha256": self.recorded_sha256,
            "rebuilt_sha256": self.rebuilt_sha256,
            "size_tokens": self.size_tokens,
            "window_tokens": self.window_tokens,
            "body": json.loads(self.body),
            "shrunk": list(self.shrunk),
            "forked_from": self.forked_from,
            "left_out": list(self.left_out),
        }


def explain_call(
    events: Sequence[Event],
    agent_of: Callable[[str], Agent | None],
    *,
    step: int,
    turn_id: str | None = None,
    endpoints: Mapping[str, ModelEndpoint] | None = None,
    model_name: str | None = None,
) -> CallExplanation:
    """Explain model call ``step`` of turn ``turn_id`` (default: the newest turn) of a trace.

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        step: the call's step within its turn (0-based).
        turn_id: the turn; None means the newest turn of the trace.
        endpoints: the configured model endpoints by id (keys are not needed: nothing is sent).
        model_name: the model name of calls whose endpoint is not configured.

    Raises:
        LookupError: the trace has no such turn or call (the message says which).
        KeyError: a turn names an agent the app does not have.
        ContextError: the call's context cannot be built with the app as it is now.
    """
    from agentstream.context import describe_shrunk, explain
    from agentstream.delegation import offered_agent
    from agentstream.models import formats, openai_format
    from agentstream.steps.replay import rebuild_calls

    endpoints = endpoints or {}
    explanation = explain(
        events, agent_of, step=step, turn_id=turn_id, offer=lambda agent, turn: offered_agent(agent, turn, endpoints)
    )
    if explanation.made:
        rebuilt = next(
            c
            for c in rebuild_calls(events, agent_of, endpoints=endpoints, model_name=model_name)
            if (c.turn_id, c.step) == (explanation.turn_id, step)
        )
        body, endpoint, configured = rebuilt.body, rebuilt.endpoint, rebuilt.configured
    else:  # the next call: as the agent's endpoint would get it
        turn = next(e for e in events if isinstance(e, TurnInput) and e.turn_id == explanation.turn_id)
        agent = agent_of(turn.agent)
        if agent is None:
            raise KeyError(f"turn {turn.turn_id!r}: agent {turn.agent!r} is not in the app")
        agent = offered_agent(agent, turn, endpoints)
        endpoint = endpoints.get(agent.model) if agent.model is not None else None
        configured = endpoint is not None
        if endpoint is not None:
            body = formats.request_body(explanation.request, endpoint)
        else:
            body = openai_format.request_body(explanation.request, model=model_name or "gpt-4o-mini")
    built = explanation.built
    upto = next(
        (
            i
            for i, e in enumerate(events)
            if isinstance(e, ModelOutput) and e.turn_id == explanation.turn_id and e.step == step
        ),
        len(events),
    )
    first = events[0] if events else None
    return CallExplanation(
        turn_id=explanation.turn_id,
        step=step,
        call=built.call,
        made=explanation.made,
        body=body,
        recorded_sha256=explanation.recorded_sha256 or "",
        rebuilt_sha256=openai_format.fingerprint(body),
        size_tokens=built.size_tokens,
        window_tokens=built.window_tokens,
        shrunk=[describe_shrunk(s) for s in built.shrunk],
        endpoint=endpoint,
        configured=configured,
        forked_from=fork_line(first) if isinstance(first, ForkedFrom) else None,
        left_out=tuple(sorted(hidden_for(rolled_back(events[:upto]), explanation.turn_id))),
    )
