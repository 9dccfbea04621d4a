"""Compaction at run time: before each model call, send, summarise first, or end the turn.

The context library says when a summary is due and what it replaces
(:mod:`agentstream.context.compaction`); this module is what the services do with that, as
pure functions of the built context and the trace:

1. (agent loop) :func:`next_call` looks at a model call's built context. Under the compaction
   threshold, it is sent. Over it (after every shrink), or when it does not fit at all, and a
   summary would replace turns no summary replaced yet, a summary is written first: the loop
   publishes a :class:`CompactionJob` instead of calling the model, and waits.
2. (compaction) The service asks a model (configurable; a cheaper one will do) for the summary
   of the turns the agent's ``Compact`` setting selects, with its instructions and citing text,
   in calls budgeted to fit the window (old results shortened first, long histories in
   chunks, an earlier summary folded in), and appends a Compaction event: the summary, and the
   turn where the kept part starts (always a turn's input, never after the newest user
   message, field case C04). Or it appends a :class:`~agentstream.wire.events.CompactionFailed`.
3. (agent loop) Woken, it builds the call again: the summary is in the system message in place
   of what it replaced. A context that still does not fit ends the turn (``context_full``).
   An empty summary, or one that would replace nothing, ends the turn (``compaction_error``).
   A summary call that failed (the model erred or refused) does not: the call goes out with
   the oldest history trimmed whole instead, and the system prompt says that earlier messages
   were left out (field case C24); the CompactionFailed event in the trace says why.

Each compaction is named by its running turn and the first turn it keeps; the trace records
one outcome per name (the Compaction or the CompactionFailed, appended under one idempotency
key, :func:`outcome_key`), so a job delivered twice writes one summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from agentstream.context import BuiltContext, ChatRequest, CompactionPlan, build_context, require_fit, trimmed_request
from agentstream.declarations.agents import Agent
from agentstream.errors import CompactionError, ContextError, ContextFullError, PromptError
from agentstream.wire.events import Compaction, CompactionFailed, Event
from agentstream.wire.failures import FailureCode

SUMMARY_FAILED = FailureCode.SUMMARY_FAILED
"""CompactionFailed code: the summary call failed; the turn goes on with plain trimming."""

COMPACTION_ERROR = FailureCode.COMPACTION_ERROR
"""CompactionFailed and TurnFailed code: the summary was empty or would replace nothing."""

CONTEXT_FULL = FailureCode.CONTEXT_FULL
"""TurnFailed code: the context does not fit the model's window, even after a summary."""

PROMPT_ERROR = FailureCode.PROMPT
"""The TurnFailed code of a turn whose system prompt could not be written (:class:`PromptError`)."""


class CompactionJob(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A hint on the compactions stream: this trace's next model call needs a summary first.

    Attributes:
        trace_id: the trace.
        turn_id: the running turn.
        step: the model call (step of the turn) that waits for the summary.
        kept_from_turn: the first turn the summary keeps, as the loop planned it.
        trace_context: the OpenTelemetry context of the step that asked (W3C ``traceparent``,
            ``tracestate``; empty without tracing), see :mod:`agentstream.ops.tracing`.
        wake_to: the agent-loop consumer that asked, which holds the trace's fold: the wake-up
            after the summary goes to its own stream while it is alive
            (:mod:`agentstream.steps.wake_routes`); empty: the shared one.
    """

    trace_id: str
    turn_id: str
    step: int
    kept_from_turn: str
    trace_context: dict[str, str] = {}
    wake_to: str = ""


_job_decoder = msgspec.json.Decoder(CompactionJob)


def decode_job(payload: bytes) -> CompactionJob:
    """The JSON of a compaction job → :class:`CompactionJob` (raises ``msgspec.DecodeError``)."""
    return _job_decoder.decode(payload)


def outcome_key(turn_id: str, kept_from_turn: str) -> str:
    """The idempotency key of a compaction's outcome (its Compaction or CompactionFailed)."""
    return f"compaction:{turn_id}:{kept_from_turn}"


def job_marker(turn_id: str, kept_from_turn: str) -> str:
    """The marker (in the trace's key hash) that the job of a compaction was published."""
    return f"compaction-job:{turn_id}:{kept_from_turn}"


def outcome_of(events: Sequence[Event], turn_id: str, kept_from_turn: str) -> Compaction | CompactionFailed | None:
    """The recorded outcome of the compaction that keeps from ``kept_from_turn`` in ``turn_id``."""
    for event in events:
        if (
            isinstance(event, (Compaction, CompactionFailed))
            and event.turn_id == turn_id
            and event.kept_from_turn == kept_from_turn
        ):
            return event
    return None


@dataclass(frozen=True)
class Send:
    """Call the model with ``request``; ``trimmed`` when a failed summary left plain trimming."""

    request: ChatRequest
    trimmed: bool = False


@dataclass(frozen=True)
class Summarise:
    """Write the summary that ``plan`` describes before calling the model."""

    plan: CompactionPlan


Next = Send | Summarise


def next_call(built: BuiltContext, events: Sequence[Event], agent: Agent, *, trace_id: str | None = None) -> Next:
    """What to do with a built model call: send it, or have a summary written first.

    Args:
        built: the call's context, as the context library built it from ``events``.
        events: the trace the call was built from.
        agent: the agent (with the limits and context settings the call was built with).
        trace_id: named in error messages.

    Returns:
        :class:`Summarise` when a compaction is due and has no outcome yet; else :class:`Send`.

    Raises:
        CompactionError: the due compaction's summary was empty or would replace nothing.
        ContextFullError: the context does not fit, and no summary can make room (every turn
            the setting selects is summarised already, or the agent does not compact).
    """
    plan = built.compaction
    outcome = outcome_of(events, plan.turn_id, plan.kept_from_turn) if plan is not None else None
    compacted = plan is None and not built.fits and any(isinstance(e, Compaction) for e in events)
    return decide(built, agent, outcome=outcome, compacted=compacted, trace_id=trace_id)


def decide(
    built: BuiltContext,
    agent: Agent,
    *,
    outcome: Compaction | CompactionFailed | None,
    compacted: bool,
    trace_id: str | None = None,
) -> Next:
    """:func:`next_call` from what the trace recorded, for a caller that keeps track of it (replay).

    Args:
        built: the call's context.
        agent: the agent it was built with.
        outcome: the recorded outcome of the compaction that ``built`` plans (:func:`outcome_of`
            over the events it was built from), or None.
        compacted: whether those events hold a Compaction (read only when no compaction is
            planned and the context does not fit).
        trace_id: named in error messages.

    Raises:
        CompactionError, ContextFullError: see :func:`next_call`.
    """
    plan = built.compaction
    if plan is None:
        if not built.fits and compacted:
            where = f"trace {trace_id!r}, " if trace_id else ""
            raise ContextFullError(
                f"{where}turn {built.turn_id!r} step {built.step}: the context still needs about {built.size_tokens} "
                f"tokens (prompt and output reserve) after the summary, over the model's window of {built.window_tokens} "
                "tokens, and every turn the compaction setting selects is summarised already; shorten the tool "
                "results, summarise more turns (Compact.where) or use a model with a larger window. Nothing was sent."
            )
        return Send(require_fit(built, trace_id=trace_id))
    if outcome is None:
        return Summarise(plan)
    if isinstance(outcome, CompactionFailed) and outcome.code == COMPACTION_ERROR:
        raise CompactionError(outcome.reason)
    if built.fits:  # the summary failed, but the call fits without it
        return Send(built.request)
    return Send(trimmed_request(built, agent), trimmed=True)


def sent_request(events: Sequence[Event], agent: Agent, *, turn_id: str, step: int) -> ChatRequest:
    """The request the agent loop sent for model call ``step`` of ``turn_id`` (to rebuild a stored call).

    It is :func:`next_call`'s request for the context built from ``events`` (the events before
    the call's output): with the summary in effect, or trimmed after a failed summary.

    Raises:
        ContextError: see :func:`next_call` and :func:`agentstream.context.build_context`.
    """
    built = build_context(events, agent, turn_id=turn_id, step=step)
    decision = next_call(built, events, agent)
    return decision.request if isinstance(decision, Send) else built.request


def failure_code(exc: ContextError) -> str:
    """The TurnFailed code of a context error that ends a turn."""
    if isinstance(exc, CompactionError):
        return COMPACTION_ERROR
    if isinstance(exc, ContextFullError):
        return CONTEXT_FULL
    if isinstance(exc, PromptError):
        return PROMPT_ERROR
    return FailureCode.CONTEXT
