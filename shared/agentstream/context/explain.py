"""Explain a model call: the exact request it was sent, and why each old result looked as it did.

For a stored trace and one model call (a turn and a step), :func:`explain` rebuilds the call's
request from the events before its model output (or, for a call not made yet, from the whole
trace), with the fingerprint recorded at call time when there is one, and lists each shortened
result with the shrink that gave it its form and the model call at which it did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentstream.context.builder import BuiltContext, Shrunk, build_context
from agentstream.context.request import ChatRequest
from agentstream.declarations.agents import Agent
from agentstream.wire.events import ModelOutput, TurnInput


@dataclass(frozen=True)
class Explanation:
    """What one model call saw, and why.

    Attributes:
        turn_id: the call's turn.
        step: the call's step within the turn.
        made: True when the trace holds the call's model output (False: the next call, not made yet).
        recorded_sha256: the request fingerprint recorded at call time ("" when none).
        built: the rebuilt context: request, size estimate, shortened results.
    """

    turn_id: str
    step: int
    made: bool
    recorded_sha256: str
    built: BuiltContext

    @property
    def request(self) -> ChatRequest:
        return self.built.request

    @property
    def shrunk(self) -> tuple[Shrunk, ...]:
        return self.built.shrunk


def explain(
    events: Sequence[Any],
    agent_of: Callable[[str], Agent | None],
    *,
    step: int,
    turn_id: str | None = None,
    offer: Callable[[Agent, TurnInput], Agent] | None = None,
) -> Explanation:
    """Explain model call ``step`` of turn ``turn_id`` (default: the trace's newest turn).

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        step: the call's step within its turn (0-based).
        turn_id: the call's turn; None takes the newest turn.
        offer: the agent as the call's turn is offered it (a child's model, withheld delegations,
            the endpoint's limits), as the agent loop and replay take it:
            :func:`agentstream.steps.explaining.explain_call` passes
            :func:`agentstream.delegation.offered_agent` with the configured endpoints. None: the
            agent as the app declares it.

    Raises:
        LookupError: the trace has no such turn, the turn's agent is not in the app, or the
            step is neither a recorded call nor the turn's next one.
    """
    inputs = [e for e in events if isinstance(e, TurnInput)]
    if not inputs:
        raise LookupError("the trace has no turn")
    if turn_id is None:
        turn_id = inputs[-1].turn_id
    turn = next((e for e in inputs if e.turn_id == turn_id), None)
    if turn is None:
        raise LookupError(f"the trace has no turn {turn_id!r} (turns: {', '.join(e.turn_id for e in inputs)})")
    agent = agent_of(turn.agent)
    if agent is None:
        raise LookupError(f"turn {turn_id!r} names agent {turn.agent!r}, which the app does not have")
    if offer is not None:
        agent = offer(agent, turn)
    steps = []
    for index, event in enumerate(events):
        if isinstance(event, ModelOutput) and event.turn_id == turn_id:
            steps.append(event.step)
            if event.step == step:
                built = build_context(events[:index], agent, turn_id=turn_id, step=step)
                return Explanation(turn_id, step, True, event.request_sha256, built)
    following = (max(steps) + 1) if steps else 0
    if step != following:
        raise LookupError(
            f"turn {turn_id!r} has model calls at steps {steps or 'none'}; step {step} is neither one of them "
            f"nor the next ({following})"
        )
    built = build_context(events, agent, turn_id=turn_id, step=step)
    return Explanation(turn_id, step, False, "", built)


def describe_shrunk(shrunk: Shrunk) -> str:
    """One line: ``r3 (call_1, search) compressed by Compress(where=turns[:-2], when=None) at call 4 (turn t2, step 0)``."""
    line = (
        f"{shrunk.handle} ({shrunk.call_id}, {shrunk.tool}) {shrunk.form.name.lower()} by {shrunk.by!r} "
        f"at call {shrunk.at} (turn {shrunk.at_turn}, step {shrunk.at_step})"
    )
    if shrunk.kept:
        shown = ", ".join(
            f"{number if number is not None else '?'} ({element_id}) {form.name.lower()}"
            for number, element_id, form in shrunk.kept
        )
        line += f"; a floor keeps source {shown}"
    return line
