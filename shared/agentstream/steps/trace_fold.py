"""A trace folded event by event: what a worker keeps so that a step costs what was added.

The agent loop decides a trace's next step and builds its model calls from the trace. Reading
and decoding the whole trace at every step makes a step's cost grow with the conversation (and a
conversation's total cost quadratic in its length). A :class:`TraceFold` instead keeps, for one
trace, the entry id it has read up to, the decoded events, the inputs of the next decision (the
running turn and that turn's outputs, results and cancel: a :class:`~agentstream.steps.decision.TurnView`),
each turn's ending, and one context fold (:class:`~agentstream.context._context_fold.ContextFold`) per
agent that has answered in it. A step reads only the entries after :attr:`TraceFold.last_id` and
feeds them here; the decision and the request come out equal, byte for byte, to the ones made
from the whole trace (the property tests in ``tests/property/test_fold.py`` check it).

A trace is append-only, but it can be deleted (retention) and started again under the same id:
the first entry id then differs (:meth:`TraceFold.same_trace`), and the fold is dropped.

:class:`FoldCache` bounds the folds one process keeps by what they cost in memory, measured
(least recently used dropped first); a trace whose fold was dropped is folded again from its
first entry on its next step.

Pure: no Redis, no asyncio, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentstream.context import BuiltContext, ContextConfig, ContextPolicy, ModelLimits, reopen_result
from agentstream.context._context_fold import ContextFold
from agentstream.context.builder import build_from_state, new_state, settings_of, stale_hidden
from agentstream.context.elements import Numbering
from agentstream.context.render import EventFilter
from agentstream.declarations.agents import Agent
from agentstream.models.endpoints import ModelEndpoint
from agentstream.steps.decision import Decision, TurnView, decide_view
from agentstream.steps.sizing import deep_size_bytes
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    CancelRequested,
    Compaction,
    CompactionFailed,
    Event,
    ModelOutput,
    TaskInput,
    ToolCall,
    ToolOutput,
    ToolsOffered,
    TurnEnded,
    TurnFailed,
    TurnInput,
)

__all__ = ["AWAITS_APPROVAL", "FoldCache", "TraceFold", "TurnRecord", "entry_key"]

AWAITS_APPROVAL = "awaits_approval"
"""The note a fold keeps once it folded a call awaiting approval: the agent loop then takes the
trace out of the approvals-due set when it no longer waits on one (and drops the note)."""

# What a fold references and shares with the whole process (a dropped fold frees none of it).
_SHARED: tuple[type, ...] = (Agent, ModelEndpoint, ContextConfig, ContextPolicy, ModelLimits)


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"<ms>-<seq>"`` → ``(ms, seq)``, which orders ids as Redis does.

    Raises:
        ValueError: ``entry_id`` is not of that form.
    """
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class TurnRecord:
    """One turn's events as they were folded (the inputs of its decisions)."""

    turn: TurnInput | None = None
    cancel: CancelRequested | None = None
    outputs: list[ModelOutput] = field(default_factory=list)
    results: list[ToolOutput] = field(default_factory=list)
    ending: TurnEnded | TurnFailed | None = None
    awaited: dict[str, ApprovalAwaited] = field(default_factory=dict)
    decided: dict[str, ApprovalDecided] = field(default_factory=dict)


@dataclass
class _Context:
    agent: Agent
    settings: tuple[Any, Any]
    state: ContextFold


class TraceFold:
    """Everything one worker knows about one trace, folded from its entries in order.

    Args:
        trace_id: the trace.

    Attributes:
        events: the decoded events, oldest first.
        first_id: the id of the trace's first entry (None while empty).
        last_id: the id of the last entry folded (None while empty).
        nbytes: the stored bytes of the folded events (:class:`FoldCache` scales its measures by them).
        turns: the record of every turn id the trace names, by turn id.
        order: the turn ids of the trace's turn inputs, in trace order.
        unconfirmed: turn ids whose ending was folded and whose reply this worker has not yet
            seen marked as sent (the agent loop checks them with one read, then clears them).
        notes: the worker's own notes about the trace (for example which steps' tool jobs it
            published); dropped with the fold.
    """

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        self.events: list[Event] = []
        self.first_id: str | None = None
        self.last_id: str | None = None
        self._last_key: tuple[int, int] = (-1, -1)
        self.nbytes = 0
        self.turns: dict[str, TurnRecord] = {}
        self.order: list[str] = []
        self._active = 0  # every turn before order[_active] has ended
        self.has_compaction = False
        self.compactions: dict[tuple[str, str], Compaction | CompactionFailed] = {}
        self.unconfirmed: dict[str, None] = {}
        self.turn_entries: dict[str, str] = {}  # turn id → the entry id of its input
        self.offers: dict[str, ToolsOffered] = {}  # agent name → its latest MCP tool offer
        self.call_ids: set[str] = set()  # every tool call id a model output of the trace holds
        self.approval_turns: dict[str, str] = {}  # call id awaiting (or that awaited) approval → its turn id
        self.agents: set[str] = set()  # the agents the trace's turns name (timeline.trace_agents)
        self.root_trace_id: str | None = None  # the root a child trace's task names (timeline.root_of)
        self._numbering = Numbering()
        self._numbered = 0  # events added to _numbering
        self.notes: dict[Any, Any] = {}
        self._contexts: dict[str, _Context] = {}  # by agent name: one context per agent (a turn's settings replace it)

    def __len__(self) -> int:
        return len(self.events)

    # --- folding ------------------------------------------------------------------------------

    def same_trace(self, first_id: str | None) -> bool:
        """Whether a trace whose first entry is ``first_id`` is the one folded here (a trace
        deleted by retention and started again has another first entry)."""
        return self.first_id is None or first_id == self.first_id

    def feed(self, entries: Iterable[tuple[str, Event]], sizes: Iterable[int] | None = None) -> int:
        """Fold entries read from the trace → how many were new.

        Entries at or before :attr:`last_id` are skipped (two readers of one trace may read the
        same entries), so feeding is idempotent.

        Args:
            entries: ``(entry id, event)`` pairs in stream order.
            sizes: the stored size in bytes of each entry's event (for :attr:`nbytes`).
        """
        sizes_iter = iter(sizes) if sizes is not None else None
        fed = 0
        for entry_id, event in entries:
            size = next(sizes_iter, 0) if sizes_iter is not None else 0
            key = entry_key(entry_id)
            if key <= self._last_key:
                continue
            if self.first_id is None:
                self.first_id = entry_id
            self._last_key = key
            self.last_id = entry_id
            self.nbytes += size
            self.events.append(event)
            if isinstance(event, TurnInput) and event.turn_id not in self.turn_entries:
                self.turn_entries[event.turn_id] = entry_id
            self._fold(event)
            fed += 1
        return fed

    def _record(self, turn_id: str) -> TurnRecord:
        record = self.turns.get(turn_id)
        if record is None:
            record = self.turns[turn_id] = TurnRecord()
        return record

    def _fold(self, event: Event) -> None:
        match event:
            case TurnInput():  # a TaskInput too
                self._fold_turn(event)
            case ModelOutput(turn_id=turn_id):
                self._record(turn_id).outputs.append(event)
                for call in event.tool_calls:
                    self.call_ids.add(call.id)
            case ToolOutput(turn_id=turn_id):
                self._record(turn_id).results.append(event)
            case TurnEnded(turn_id=turn_id) | TurnFailed(turn_id=turn_id):
                record = self._record(turn_id)
                if record.ending is None:
                    record.ending = event
                    self.unconfirmed[turn_id] = None
            case CancelRequested(turn_id=turn_id):
                record = self._record(turn_id)
                if record.cancel is None:
                    record.cancel = event
            case Compaction(turn_id=turn_id, kept_from_turn=kept):
                self.has_compaction = True
                self.compactions.setdefault((turn_id, kept), event)
            case CompactionFailed(turn_id=turn_id, kept_from_turn=kept):
                self.compactions.setdefault((turn_id, kept), event)
            case ToolsOffered(agent=agent_name):
                self.offers[agent_name] = event
            case ApprovalAwaited() | ApprovalDecided():
                self._fold_approval(event)
        order = self.order
        while self._active < len(order) and self.turns[order[self._active]].ending is not None:
            self._active += 1

    def _fold_turn(self, event: TurnInput) -> None:
        self.agents.add(event.agent)
        if self.root_trace_id is None and isinstance(event, TaskInput) and event.root_trace_id:
            self.root_trace_id = event.root_trace_id
        record = self._record(event.turn_id)
        if record.turn is None:
            record.turn = event
            self.order.append(event.turn_id)

    def _fold_approval(self, event: ApprovalAwaited | ApprovalDecided) -> None:
        record = self._record(event.turn_id)
        if isinstance(event, ApprovalDecided):
            record.decided.setdefault(event.call_id, event)
            return
        record.awaited.setdefault(event.call_id, event)
        self.approval_turns.setdefault(event.call_id, event.turn_id)
        self.notes[AWAITS_APPROVAL] = True

    # --- what decisions read ------------------------------------------------------------------

    def active_turn(self) -> TurnInput | None:
        """The oldest turn without an ending (as :func:`agentstream.steps.decision.active_turn`)."""
        if self._active >= len(self.order):
            return None
        return self.turns[self.order[self._active]].turn

    def others_unended(self, turn_id: str) -> bool:
        """Whether a turn other than ``turn_id`` has no ending yet (one queued behind it): the
        decision after ``turn_id``'s ending acts on it instead of waiting."""
        return any(other != turn_id and self.turns[other].ending is None for other in self.order[self._active :])

    def job_problem(self, trace_id: str, turn_id: str, call_id: str, name: str, arguments: str) -> str:
        """Why a job for call ``call_id`` of turn ``turn_id`` (tool ``name``, ``arguments``)
        names no call that may run in this trace → a reason, or ``""`` when it does: what
        :func:`agentstream.runtime.call_runs.job_problem` says from the whole event list, from
        the fold's records (the turn's outputs only, not every event of the trace).
        """
        if not self.events:
            return f"trace {trace_id!r} does not exist"
        record = self.turns.get(turn_id)
        if record is None or record.turn is None:
            return f"trace {trace_id!r} has no turn {turn_id!r}"
        if record.ending is None:
            active = self.active_turn()
            if active is None or active.turn_id != turn_id:
                return (
                    f"turn {turn_id!r} of trace {trace_id!r} is not the running turn "
                    f"({active.turn_id if active else None!r} runs)"
                )
        for output in record.outputs:
            for call in output.tool_calls:
                if call.id == call_id:
                    if call.name != name:
                        return f"call {call_id!r} of turn {turn_id!r} is a call of tool {call.name!r}, not {name!r}"
                    decided = record.decided.get(call_id)
                    runs_with = (
                        decided.arguments if decided is not None and decided.arguments is not None else call.arguments
                    )
                    if runs_with != arguments:
                        return (
                            f"call {call_id!r} of turn {turn_id!r} was made with other arguments than the job's "
                            "(the trace records what a call runs; a job only says which call to run)"
                        )
                    return ""
        return f"turn {turn_id!r} of trace {trace_id!r} made no call {call_id!r}"

    def ending(self, turn_id: str) -> TurnEnded | TurnFailed | None:
        """The turn's ending, or None."""
        record = self.turns.get(turn_id)
        return record.ending if record is not None else None

    def turn_input(self, turn_id: str) -> TurnInput | None:
        """The turn's input, or None when the trace has none."""
        record = self.turns.get(turn_id)
        return record.turn if record is not None else None

    def final_stop_reason(self, turn_id: str) -> str | None:
        """As :func:`agentstream.steps.decision.final_stop_reason`."""
        record = self.turns.get(turn_id)
        last = record.outputs[-1] if record is not None and record.outputs else None
        return last.stop_reason if last is not None and not last.stopped_normally else None

    def turn_entry(self, turn_id: str) -> list[tuple[str, Event]]:
        """The turn's input with its entry id, as a one-entry list (empty when the trace has none)."""
        record = self.turns.get(turn_id)
        entry_id = self.turn_entries.get(turn_id)
        return [(entry_id, record.turn)] if record is not None and record.turn is not None and entry_id else []

    def offers_of(self, agent_name: str) -> list[ToolsOffered]:
        """The agent's latest MCP tool offer as a one-event list (what
        :func:`agentstream.steps.offers.latest_offer` finds in the whole trace), or empty."""
        offer = self.offers.get(agent_name)
        return [offer] if offer is not None else []

    def view(self, now_ms: int | None = None) -> TurnView:
        """The inputs of the next decision (equal to :func:`agentstream.steps.decision.turn_view` of
        :attr:`events`), at ``now_ms`` (Unix ms; None: nothing awaiting approval is ever due)."""
        turn = self.active_turn()
        if turn is None:
            return TurnView(None)
        record = self.turns[turn.turn_id]
        tid = turn.turn_id
        return TurnView(
            turn,
            record.cancel,
            tuple(record.outputs),
            tuple(record.results),
            reopen=lambda agent, call: self._reopen(agent, tid, call),
            offer_of=self.offers.get,
            numbering=self.numbering,
            awaited=record.awaited,
            decided=record.decided,
            now_ms=now_ms,
        )

    def numbering(self) -> Numbering:
        """The trace's element numbering (as :func:`agentstream.delegation.handoff.numbering_of` of
        :attr:`events`), numbering only the events added since it was last asked for."""
        events = self.events
        if self._numbered < len(events):
            numbering = self._numbering
            for event in events[self._numbered :]:
                numbering.add_event(event)
            self._numbered = len(events)
        return self._numbering

    def _reopen(self, agent: Agent, turn_id: str, call: ToolCall) -> ToolOutput | None:
        return reopen_result(self.events, agent, turn_id, call)  # only when a model calls the reopen tool

    def decide(
        self,
        agent_of: Callable[[str], Agent | None],
        endpoints: Mapping[str, ModelEndpoint] | None = None,
        *,
        now_ms: int | None = None,
    ) -> Decision:
        """The next step (equal to :func:`agentstream.steps.decision.decide` of :attr:`events`), at
        ``now_ms`` (Unix ms: a call awaiting approval past its due time is denied)."""
        return decide_view(self.view(now_ms), agent_of, endpoints)

    def approval_of(self, call_id: str) -> tuple[ApprovalAwaited | None, ApprovalDecided | None, bool]:
        """What the trace holds about a call awaiting approval: (its ApprovalAwaited, its first
        ApprovalDecided, whether its turn is still open); (None, None, False) for an unknown call."""
        turn_id = self.approval_turns.get(call_id)
        record = self.turns.get(turn_id) if turn_id is not None else None
        if record is None:
            return None, None, False
        return record.awaited.get(call_id), record.decided.get(call_id), record.ending is None

    def compaction_outcome(self, turn_id: str, kept_from_turn: str) -> Compaction | CompactionFailed | None:
        """As :func:`agentstream.steps.summarising.outcome_of` of :attr:`events`."""
        return self.compactions.get((turn_id, kept_from_turn))

    # --- contexts -----------------------------------------------------------------------------

    def build(self, agent: Agent, *, turn_id: str | None, step: int) -> BuiltContext:
        """The context of the next model call, as :func:`agentstream.context.build_context` of
        :attr:`events` gives it, folding only what the agent's context has not seen yet.

        A selection that is not :func:`agentstream.context.only` is applied to the whole trace
        at every call (it cannot be folded).

        Raises:
            UnrenderedEventError, ShortenError, ValueError: see
                :func:`agentstream.context.builder.build_context`.
        """
        return build_from_state(self.context_state(agent, turn_id), turn_id=turn_id, step=step)

    def context_state(self, agent: Agent, turn_id: str | None = None) -> ContextFold:
        """The agent's context fold for the calls of ``turn_id``
        (:func:`agentstream.context.builder.new_state` of :attr:`events`), fed only what it has not
        seen yet (folded again from the start when a rollback came since): what :meth:`build` lays
        a request out from.

        Raises:
            UnrenderedEventError, ShortenError, ValueError: see :meth:`build`.
        """
        settings = settings_of(agent)
        config, limits = settings
        if config.select is not None and not isinstance(config.select, EventFilter):
            return new_state(self.events, agent, config, limits, turn_id=turn_id)
        context = self._contexts.get(agent.name)
        if context is not None and (
            context.agent is not agent or context.settings[0] is not config or context.settings[1] != limits
        ):
            context = None
        if context is not None:
            state = context.state
            if state.count < len(self.events):
                try:
                    state.feed(self.events[state.count :])
                except BaseException:
                    self._contexts.pop(agent.name, None)
                    raise
            if stale_hidden(state, turn_id):  # a rollback came: fold again without the turn it rolls back
                context = None
        if context is None:
            context = _Context(agent, settings, new_state(self.events, agent, config, limits, turn_id=turn_id))
            self._contexts[agent.name] = context
        return context.state


class FoldCache:
    """Folded traces by trace id, bounded by what they cost in memory.

    A fold's cost is measured (:func:`agentstream.steps.sizing.deep_size_bytes` of the fold,
    without the agents and settings it shares with the process) when it is first kept and again
    each time its stored bytes or its events have grown fourfold since the last measure; in
    between, the last measure is scaled by the growth of its stored bytes. Measuring at geometric
    steps keeps a fold's measuring cost linear in its size: each event is walked 4/3 times on
    average (3 times at a growth of 1.5, which was a quarter of the agent loop's CPU on one long
    conversation), and the scaled count stays within a few percent of the memory the folds hold
    (``tests/unit/test_fold_memory.py`` checks it against tracemalloc). A fold measured at
    :attr:`MEASURED_UP_TO_BYTES` stored bytes or more is not walked again, only scaled: a walk
    holds the event loop (every conversation of the process waits), and the walk of a fold of
    thousands of events took a tenth of a second and more.

    Args:
        max_bytes: the most bytes of memory kept over all folds; the least recently used folds
            are dropped first. The fold just used is always kept, however large.

    Attributes:
        nbytes: the bytes of memory counted for the folds kept.
        hits: lookups that found a fold.
        misses: lookups that did not (the trace is folded from its first entry).
        evictions: folds dropped to stay under ``max_bytes``.

    Raises:
        ValueError: ``max_bytes`` is negative.
    """

    REMEASURE_GROWTH = 4.0  # a fold is measured again once it has grown fourfold
    MEASURED_UP_TO_BYTES = 1 << 20  # a fold measured at this many stored bytes or more is not walked again

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._folds: OrderedDict[str, TraceFold] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._measures: dict[str, tuple[int, int, int]] = {}  # trace id → (cost, stored bytes, events) when measured
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._folds)

    def __contains__(self, trace_id: str) -> bool:
        return trace_id in self._folds

    def get(self, trace_id: str) -> TraceFold | None:
        """The trace's fold (now the most recently used), or None."""
        fold = self._folds.get(trace_id)
        if fold is None:
            self.misses += 1
            return None
        self.hits += 1
        self._folds.move_to_end(trace_id)
        return fold

    def cost_of(self, fold: TraceFold) -> int:
        """The bytes of memory counted for ``fold`` (measured, or scaled from its last measure)."""
        measure = self._measures.get(fold.trace_id)
        growth = self.REMEASURE_GROWTH
        events = len(fold.events)
        if measure is not None and (
            measure[1] >= self.MEASURED_UP_TO_BYTES  # large: scaled from here on, never walked again
            or (fold.nbytes < measure[1] * growth and events < measure[2] * growth)
        ):
            cost, stored, _ = measure
            return cost if stored == 0 else max(cost, cost * fold.nbytes // stored)
        cost = deep_size_bytes(fold, _SHARED)
        self._measures[fold.trace_id] = (cost, fold.nbytes, max(events, 1))
        return cost

    def put(self, fold: TraceFold) -> None:
        """Keep (or account again for) a fold after it was fed, dropping the least recently used
        others while the total is over ``max_bytes``."""
        trace_id = fold.trace_id
        if self._folds.get(trace_id) is not fold:
            self.forget(trace_id)
            self._folds[trace_id] = fold
        self._folds.move_to_end(trace_id)
        cost = self.cost_of(fold)
        self.nbytes += cost - self._sizes.get(trace_id, 0)
        self._sizes[trace_id] = cost
        while self.nbytes > self.max_bytes and len(self._folds) > 1:
            oldest = next(iter(self._folds))
            self.forget(oldest)
            self.evictions += 1

    def forget(self, trace_id: str) -> None:
        """Drop a trace's fold (its next step folds it again from its first entry)."""
        self._measures.pop(trace_id, None)
        if self._folds.pop(trace_id, None) is not None:
            self.nbytes -= self._sizes.pop(trace_id, 0)


def fold_events(trace_id: str, entries: Sequence[tuple[str, Event]]) -> TraceFold:
    """A new fold of ``entries`` (for tests and tools)."""
    fold = TraceFold(trace_id)
    fold.feed(entries)
    return fold
