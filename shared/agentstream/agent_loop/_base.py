"""What the parts of the agent loop share: its constants, the outcome of a step, small helpers."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import TYPE_CHECKING, Any

from agentstream.agent_loop.children import Children
from agentstream.agent_loop.compactions import Compactions
from agentstream.agent_loop.mcp_offers import McpOffers
from agentstream.declarations.apps import App
from agentstream.models import ChatModel
from agentstream.ops import logs, tracing
from agentstream.runtime.fold_reader import FoldReader
from agentstream.runtime.store import Read, Taken, TraceStore
from agentstream.runtime.turn_order import EarlierTurns
from agentstream.steps.effects import jobs_marker, jobs_note
from agentstream.steps.timeline import reply_of_ending
from agentstream.steps.trace_fold import FoldCache, TraceFold
from agentstream.wire import checks as wire
from agentstream.wire.events import BUSY_POLICIES as _WIRE_BUSY_POLICIES
from agentstream.wire.events import (
    ModelOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import Keys

log = logging.getLogger("agentstream.agent_loop")


BUSY_POLICIES = _WIRE_BUSY_POLICIES


"""What a turn published on a busy conversation does: wait behind the running turn (default),
fail at once with code ``busy``, cancel the running turn and then run (``interrupt``), or cancel it
and leave its events out of later contexts (``rollback``). The process's setting is the default of
a turn whose message names none (:func:`agentstream.steps.machine.on_busy`)."""


DEAD_LETTER_CODE = FailureCode.DEAD_LETTER


REJECT_LEASE_WAIT_S = 2.0


"""How long a refused turn waits for its trace's lease to append its ``turn_failed`` (seconds; at
most the lease time). Refusals of one trace that arrive together each hold the lease for a single
append; past this wait the entry is deferred until the holder's lease would expire."""


DEADLINE_CODE = FailureCode.DEADLINE


"""The code of a turn ended by a deadline: its model call's (AGENTSTREAM_MODEL_DEADLINE_S) or its own
(AGENTSTREAM_TURN_DEADLINE_S)."""


class _Outcome(enum.Enum):
    """What the step loop does after one decision's effect."""

    AGAIN = "again"  # the fold is current: decide again
    REFRESH = "refresh"  # something was written by another task: read what came, then decide
    WAIT = "wait"  # the trace waits (tools, a summary, nothing to do): publish, release
    RELEASED = "released"  # published and released already (with the append of the step's output)
    DIRTY = "dirty"  # published, the lease kept: a hint came meanwhile; read what came, then decide


def _unconfirm(fold: TraceFold, marks: list[str]) -> None:
    """Undo what :meth:`AgentLoop._confirm` and the release noted in ``fold`` for ``marks`` whose
    writes failed: a turn's reply is owed again (checked in Redis before it goes out), a step's
    jobs unknown (checked in Redis before they are published)."""
    for mark in marks:
        kind, _, rest = mark.partition(":")
        if kind == "reply":
            fold.unconfirmed[rest] = None
        elif kind == "jobs":
            turn_id, _, step = rest.rpartition(":")
            fold.notes.pop(jobs_note(turn_id, int(step)), None)


_jobs_marker = jobs_marker  # the key-hash marker of a step's published jobs (agentstream.steps.effects)


_reply_of_ending = (
    reply_of_ending  # the reply of a turn's ending (agentstream.steps.timeline: the gateway makes the same)
)


def _log_ending(trace_id: str, ending: TurnEnded | TurnFailed, stop_reason: str | None) -> None:
    """One line per turn ending (logged as its reply goes out): a WARNING for a failed turn."""
    with logs.bind(trace_id=trace_id, turn_id=ending.turn_id):
        stop = f" (last stop reason {stop_reason})" if stop_reason else ""
        if isinstance(ending, TurnEnded):
            log.info("turn %s of trace %s ended%s", ending.turn_id, trace_id, stop)
        elif ending.code == FailureCode.CANCELLED:
            log.info("turn %s of trace %s was cancelled: %s", ending.turn_id, trace_id, ending.reason)
        else:
            log.warning(
                "turn %s of trace %s failed: %s: %s%s", ending.turn_id, trace_id, ending.code, ending.reason, stop
            )


def _step_span(trace_id: str, decision):
    """The OpenTelemetry span of one step on a turn, a child of the context in the turn's
    metadata (``traceparent``); none for an idle trace (see :mod:`agentstream.ops.tracing`)."""
    turn = getattr(decision, "turn", None)
    if turn is None:
        return contextlib.nullcontext()
    attributes = lambda: {  # noqa: E731  # built only when a tracer records
        "agentstream.decision": type(decision).__name__,
        "agentstream.trace_id": trace_id,
        "agentstream.turn_id": turn.turn_id,
        "agentstream.agent": turn.agent,
        "agentstream.step": getattr(decision, "step", None),
    }
    return tracing.span("agentstream.step", parent=turn.metadata, attributes=attributes)


class LoopState:
    """What every part of :class:`~agentstream.agent_loop.loop.AgentLoop` shares (set by its
    ``__init__``): the parts are mixins of one object, split by role."""

    app: App
    store: TraceStore
    redis: Any
    keys: Keys
    models: dict[str, ChatModel]
    endpoints: dict[str, Any]
    served: dict[str, Any] | None
    delta_maxlen: int
    delta_ttl_s: int
    children: Children
    compactions: Compactions
    mcp: McpOffers
    lease_ttl_ms: int
    folds: FoldCache
    busy_policy: str
    max_queued_turns: int
    trace_retention_s: float | None
    limits: wire.WireLimits
    turn_deadline_s: float | None
    empty_hints: int
    wake_owner: str
    _admitting: dict[str, list]
    _earlier: EarlierTurns
    _settled: dict[str, dict[str, None]]
    _reader: FoldReader
    _expire_ms: int | None
    _publishes_with_append: bool
    _model_calls: dict[str, tuple[str, asyncio.Task]]
    _held: dict[str, int]
    _deferred: dict[str, tuple[str, float]]
    _usage_doubted: set[str]

    if TYPE_CHECKING:  # the methods one part calls on another (each defined in its part)

        def _abort_local(self, trace_id: str, turn_id: str) -> None: ...

        async def _abortable(self, trace_id: str, turn_id: str, call) -> ModelOutput | None: ...

        async def _act(self, trace_id: str, token: int, fold: TraceFold, decision, jobs: list) -> _Outcome: ...

        async def _advance_taken(
            self, trace_id: str, entry_id: str | None, taken: Taken, fold: TraceFold | None
        ) -> None: ...

        def _confirm(self, fold: TraceFold, marks: list[str]) -> None: ...

        async def _current_fold(self, trace_id: str) -> TraceFold: ...

        async def _ensure_reply(
            self,
            trace_id: str,
            turn: TurnInput | None,
            ending: TurnEnded | TurnFailed,
            fold: TraceFold | None = None,
            *,
            events=None,
        ) -> None: ...

        async def _ensure_reply_unheld(
            self, trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, fold: TraceFold
        ) -> None: ...

        async def _fold_with(self, trace_id: str, fold: TraceFold | None, read: Read) -> TraceFold: ...

        def _jobs(
            self, trace_id: str, fold: TraceFold, turn: TurnInput, agent, calls
        ) -> list[tuple[str, str, bytes, bytes]]: ...

        def _lease(self, trace_id: str, *, wait_s: float = 0.0) -> contextlib.AbstractAsyncContextManager[int]: ...

        async def _publish_replies(self, trace_id: str, fold: TraceFold) -> None: ...

        async def _release(self, trace_id: str, token: int, fold: TraceFold, jobs: list) -> str: ...

        def _reply_stream(self, turn: TurnInput | None) -> str: ...

        async def _report(self, error: str, payload: bytes | None, **extra: str) -> None: ...

        def _take_back(self, trace_id: str, entry_id: str | None) -> None: ...

        async def advance(self, trace_id: str, *, entry_id: str | None = None) -> None: ...
