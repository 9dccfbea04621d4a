"""Fork a conversation: a new trace whose history is another's up to a point (issue 36).

:func:`fork_conversation` reads the source trace, lets :func:`agentstream.steps.forking.fork_plan`
decide what the fork starts with, and writes it into the new trace in one atomic step
(``lua/fork.lua``, on the new trace's keys alone: the source and the fork are in different hash
slots, so the source is read first and never written). It is idempotent by fork id (the new
trace's id): asked again for the same point, it answers the fork made before and writes nothing;
a fork id that names another trace, or a fork of another point, is refused. Then, for a fork
before a model call, a wake-up sets an agent loop going on the open turn; for a fork with the
turn's input replaced, the new turn is published to the fork's partition of the turns stream
(its admission is once per turn id, so publishing it again after a crash is harmless).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from agentstream.errors import ForkRefused, TurnRejected
from agentstream.runtime import conversations, operations
from agentstream.runtime.store import TraceStore, key_for
from agentstream.steps.forking import ForkPlan, fork_plan
from agentstream.steps.summarising import outcome_key
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.checks import WireLimits, quoted
from agentstream.wire.events import Compaction, CompactionFailed, Event, ForkedFrom


@dataclass(frozen=True)
class Forked:
    """A fork made (or found made before, ``created`` False).

    Attributes:
        trace_id: the fork's trace id.
        forked_from: its first event.
        created: False when the same fork had been made before (nothing was written now).
        turn_entry: the turns-stream entry of the turn published to the fork (an input
            replaced), or None.
    """

    trace_id: str
    forked_from: ForkedFrom
    created: bool
    turn_entry: str | None = None


def new_fork_id(source_trace_id: str) -> str:
    """A fresh fork id for a fork of ``source_trace_id``: ``<source>.fork-<12 hex>``."""
    return f"{source_trace_id}.fork-{uuid.uuid4().hex[:12]}"


def point_of(forked: ForkedFrom, text: str | None = None) -> str:
    """The fork's point as one string (what the fork's key hash keeps to tell the same fork asked
    again from another fork under the same id): the source, the turn, the step, and a digest of
    the replacing text."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16] if text is not None else ""
    step = "" if forked.step is None else str(forked.step)
    return "\n".join((forked.source_trace_id, forked.turn_id, step, digest))


def _copy_key(event: Event, index: int) -> str:
    """The idempotency key a copied event has in the fork's key hash (as if appended there)."""
    if isinstance(event, Compaction | CompactionFailed):
        return outcome_key(event.turn_id, event.kept_from_turn)
    try:
        return key_for(event)
    except TypeError:  # an app's own event type: no key of its own
        return f"copied:{index}"


async def fork_conversation(
    store: TraceStore,
    source_trace_id: str,
    *,
    turn_id: str,
    step: int | None = None,
    text: str | None = None,
    fork_id: str | None = None,
    by: str = "",
    expire_ms: int | None = None,
    limits: WireLimits | None = None,
) -> Forked:
    """Fork ``source_trace_id`` at ``turn_id`` (see :mod:`agentstream.steps.forking`) → the fork.

    Args:
        store: the trace store.
        source_trace_id: the conversation to fork.
        turn_id: the turn to fork at: after it (it must have ended), before its model call
            ``step``, or before it with its input replaced by ``text``.
        step: fork before this model call of the turn, or None.
        text: the turn's input replaced by this text (published to the fork), or None.
        fork_id: the fork's trace id (its idempotency key), or None for a new one
            (:func:`new_fork_id`).
        by: who forks, recorded in the fork's first event.
        expire_ms: the fork's trace and key hash expire this long after it is made, or None.
        limits: the wire's limits the replacing turn must keep (default: the defaults).

    Raises:
        ForkRefused: see :func:`agentstream.steps.forking.fork_plan`; also ``conflict`` when
            ``fork_id`` names a trace that exists, or a fork of another point; ``invalid`` for a
            fork id that cannot name a trace, or a replacing turn the wire refuses (its text
            over the size limit, say: the reason names the limit).
        SchemaVersionError, EventDecodeError: the source cannot be read.
    """
    fork_id = fork_id if fork_id is not None else new_fork_id(source_trace_id)
    limits = limits or WireLimits()
    problem = wire.id_refusal(fork_id, "a fork id", limits, names_trace=True)  # as a turn's trace id is refused
    if problem is None and "/" in fork_id:
        problem = "a fork id cannot name a trace: it holds '/', which names a delegated task's trace"
    if problem is not None:  # a fork no turn could reach is not made
        raise ForkRefused(f"{problem} (fork id {quoted(fork_id)})", kind="invalid")
    entries = await store.read(source_trace_id)
    plan = fork_plan(entries, source_trace_id, fork_id=fork_id, turn_id=turn_id, step=step, text=text, by=by)
    if plan.turn is not None:  # refused before anything is written, as the agent loop would refuse it
        try:
            wire.validate_turn(codec.encode(plan.turn), keys=store.keys, limits=limits)
        except TurnRejected as exc:
            kind = "too_large" if exc.limit else "invalid"
            raise ForkRefused(f"the turn that replaces {turn_id!r} is refused: {exc.reason}", kind=kind) from None
    created = await _write(store, fork_id, plan, point_of(plan.forked_from, text), expire_ms)
    if created is not None:  # the same fork, made before: what it started with stands
        return Forked(fork_id, created, False)
    turn_entry = None
    if plan.turn is not None:
        turn_entry = await conversations.publish_turn(store, plan.turn)
    elif plan.open_turn is not None:
        await operations.wake_trace(store.redis, store.keys, fork_id, f"fork:{source_trace_id}")
    await conversations.note_turn(store, fork_id)  # among the recent conversations
    return Forked(fork_id, plan.forked_from, True, turn_entry)


async def _write(
    store: TraceStore, fork_id: str, plan: ForkPlan, point: str, expire_ms: int | None
) -> ForkedFrom | None:
    """Write the fork's first event and history at once → None when written now, or the first
    event of the same fork made before.

    Raises:
        ForkRefused: ``conflict``: the trace exists and is no fork, or a fork of another point.
    """
    events: list[Event] = [plan.forked_from, *plan.events]
    keys = ["forked_from", *(_copy_key(e, i) for i, e in enumerate(plan.events))]
    status, *rest = await store.fork(fork_id, events, keys, point=point, open_turn=plan.open_turn, expire_ms=expire_ms)
    if status == "created":
        return None
    if status == "exists":
        raise ForkRefused(f"trace {fork_id!r} exists already; give the fork an id of its own", kind="conflict")
    stored_point, first_id = rest
    if stored_point != point:
        raise ForkRefused(
            f"trace {fork_id!r} is a fork of another point ({stored_point.replace(chr(10), ' ').strip()}); "
            "give this fork an id of its own",
            kind="conflict",
        )
    first = await store.read(fork_id, count=1)
    if first and isinstance(first[0][1], ForkedFrom):
        return first[0][1]
    return plan.forked_from  # pragma: no cover (a fork's first entry is its ForkedFrom, written with it)
