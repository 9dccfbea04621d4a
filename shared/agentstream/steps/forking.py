"""A fork of a conversation: which of its events a new trace starts with (pure; issue 36).

A fork is a new conversation whose history is the source's up to a point, so a person can try
again from there. Its trace starts with a :class:`~agentstream.wire.events.ForkedFrom` naming the
source (trace, last entry copied, turn, model call), then the source's events up to that point,
copied as stored: the fork is self-contained (no read of the source is ever needed to rebuild
it) and each copied model call rebuilds from the fork byte for byte, as it did from the source.
:func:`fork_plan` decides what is copied; :mod:`agentstream.runtime.forks` writes it in one
atomic, idempotent step.

The fork points (a turn ``T`` of the source):

- the whole turn (``T`` must have ended): the turns up to and including ``T``;
- before model call ``step`` of ``T``: the turns before ``T``, and ``T`` up to that call; the
  fork's ``T`` is open, and its agent loop calls the model again (with the app as it is now);
- with ``T``'s input replaced (``text``): the turns before ``T``; then ``T`` is published to the
  fork as a new turn with the same id, agent, metadata, reply stream and model, and ``text``.

A turn's events are those with its ``turn_id``; events of later turns (a turn queued while ``T``
ran), and results that came after the point, are not copied. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentstream.errors import ForkRefused
from agentstream.wire.events import (
    CancelRequested,
    Event,
    ForkedFrom,
    ModelOutput,
    TaskInput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)

_SHOWN_TURNS = 10  # turn ids a refusal lists


@dataclass(frozen=True)
class ForkPlan:
    """What a fork's trace starts with.

    Attributes:
        forked_from: its first event.
        events: the source's events copied after it, in the source's order.
        open_turn: the turn the fork holds open (a fork before a model call): its agent loop
            goes on with it on a wake-up; None when every copied turn has ended.
        turn: the turn to publish to the fork (an input replaced), or None.
    """

    forked_from: ForkedFrom
    events: tuple[Event, ...]
    open_turn: str | None = None
    turn: TurnMessage | None = None


def fork_plan(
    entries: Sequence[tuple[str, Event]],
    source_trace_id: str,
    *,
    fork_id: str,
    turn_id: str,
    step: int | None = None,
    text: str | None = None,
    by: str = "",
) -> ForkPlan:
    """The events a fork of ``source_trace_id`` at ``turn_id`` starts with.

    Args:
        entries: the source trace's ``(entry id, event)`` pairs, oldest first (all of them).
        source_trace_id: the source trace's id.
        fork_id: the fork's trace id (its idempotency key).
        turn_id: the source turn to fork at.
        step: fork before this model call of the turn (0-based), or None.
        text: the turn's input replaced by this text, or None.
        by: who forks (recorded).

    Raises:
        ForkRefused: ``not_found``: the source holds no events, no such turn, or no such model
            call; ``conflict``: the turn (or a turn before it) has not ended; ``invalid``: the
            source is a delegated task's trace, ``step`` and ``text`` are both given, or the fork id
            is the source's own id.
    """
    if fork_id == source_trace_id:
        raise ForkRefused(f"a fork needs a trace id of its own; {fork_id!r} is the source's", kind="invalid")
    if step is not None and text is not None:
        raise ForkRefused(
            "fork before a model call (step) or with the turn's input replaced (text), not both", kind="invalid"
        )
    if not entries:
        raise ForkRefused(f"no trace {source_trace_id!r} (no such conversation, or deleted)", kind="not_found")
    events = [(entry_id, event) for entry_id, event in entries if not isinstance(event, ForkedFrom)]
    inputs = [e for _, e in events if isinstance(e, TurnInput)]
    if any(isinstance(e, TaskInput) for e in inputs):
        raise ForkRefused(
            f"trace {source_trace_id!r} is a delegated task's; fork the conversation at the top of its tree",
            kind="invalid",
        )
    order = [e.turn_id for e in inputs]
    if turn_id not in order:
        shown = ", ".join(order[-_SHOWN_TURNS:]) or "none"
        raise ForkRefused(
            f"trace {source_trace_id!r} holds no turn {turn_id!r} (its latest turns: {shown})", kind="not_found"
        )
    at = order.index(turn_id)
    kept = set(order[: at if text is not None else at + 1])
    endings = {e.turn_id: i for i, (_, e) in enumerate(events) if isinstance(e, TurnEnded | TurnFailed)}
    for earlier in order[:at]:
        if earlier not in endings:
            raise ForkRefused(
                f"turn {earlier!r} of trace {source_trace_id!r}, before {turn_id!r}, has not ended; fork once it has",
                kind="conflict",
            )
    open_turn: str | None = None
    if step is not None:
        call = next(
            (
                i
                for i, (_, e) in enumerate(events)
                if isinstance(e, ModelOutput) and e.turn_id == turn_id and e.step == step
            ),
            None,
        )
        if call is None:
            steps = [e.step for _, e in events if isinstance(e, ModelOutput) and e.turn_id == turn_id]
            raise ForkRefused(
                f"turn {turn_id!r} of trace {source_trace_id!r} has no model call {step} (its calls: "
                f"{', '.join(map(str, steps)) or 'none'})",
                kind="not_found",
            )
        upto = call  # exclusive: the fork makes this call again
        open_turn = turn_id
    elif text is None:
        if turn_id not in endings:
            raise ForkRefused(
                f"turn {turn_id!r} of trace {source_trace_id!r} has not ended; fork it once it has, before one of "
                "its model calls (step), or with its input replaced (text)",
                kind="conflict",
            )
        upto = endings[turn_id] + 1
    else:
        upto = max((endings[t] for t in kept), default=-1) + 1
    copied = tuple(
        event
        for _, event in events[:upto]
        if getattr(event, "turn_id", None) in kept
        and not (open_turn is not None and isinstance(event, CancelRequested) and event.turn_id == open_turn)
    )
    last = next((entry_id for entry_id, e in reversed(events[:upto]) if getattr(e, "turn_id", None) in kept), "")
    turn: TurnMessage | None = None
    if text is not None:
        source = inputs[at]
        turn = TurnMessage(
            trace_id=fork_id,
            turn_id=source.turn_id,
            agent=source.agent,
            text=text,
            metadata=dict(source.metadata),
            reply_to=source.reply_to,
            model=source.model,
        )
    forked_from = ForkedFrom(
        source_trace_id=source_trace_id,
        source_entry_id=last,
        turn_id=turn_id,
        step=step,
        replaced=text is not None,
        copied=len(copied),
        fork_id=fork_id,
        by=by,
    )
    return ForkPlan(forked_from, copied, open_turn, turn)


def fork_line(forked: ForkedFrom) -> str:
    """One line that says where a fork came from (``trace show``, ``trace explain``)."""
    if forked.step is not None:
        point = f"before model call {forked.step} of turn {forked.turn_id}"
    elif forked.replaced:
        point = f"before turn {forked.turn_id}, whose input it replaced"
    else:
        point = f"after turn {forked.turn_id}"
    by = f" by {forked.by}" if forked.by else ""
    upto = f" (its entries up to {forked.source_entry_id})" if forked.source_entry_id else ""
    return f"forked from trace {forked.source_trace_id}{upto}, {point}{by}; {forked.copied} events copied"
