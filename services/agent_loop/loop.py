"""The agent loop: turns in, the next step of a trace out.

A thin shell: it receives a hint (a turn or a wake-up), takes the trace's lease and reads what
was appended since it last looked, folds it (:class:`agentstream.steps.fold.TraceFold`), asks the
shared library what to do (:func:`agentstream.steps.decision.decide_view`), does it, and repeats until
the trace waits on something (tool results) or has no turn left. A step therefore costs what
was added to the trace, not what the trace holds. It holds the trace's lease (with a fencing
token) across the steps of one wake-up, so one trace takes one step at a time; it never holds
a worker while tools run: their results wake it.

Round trips: taking the lease and reading what is new is one script; an append reads back what
came since (one script), and a model output that ends the turn carries its ending in the same
append; the replies and tool jobs of a step go out in the round trip that releases the lease.

A hint for a trace whose lease another worker holds marks the trace dirty in the same step (the
holder looks again before it lets go); when the holder is another process, one hint per trace
is deferred until the lease would expire, so the hint survives a holder that dies. Cancels come
on the cancel stream (see :mod:`agentstream.runtime.cancel`); the busy-conversation policy (``queue``,
``reject``, ``interrupt``) decides what a turn published on a busy conversation does.
Dead-lettered hints end their turn with code ``dead_letter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time

import msgspec

from agentstream.context.builder import request_after_miss
from agentstream.context.limits import PLAUSIBLE_USAGE_RATIO, WINDOW_MISS, plausible_prompt_tokens, request_chars
from agentstream.context.request import ChatRequest
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.delegation import child_trace_refusal, parent_ids
from agentstream.errors import (
    ContextError,
    ContextWindowExceeded,
    Deferred,
    ModelDeadlineExceeded,
    ModelError,
    StaleLeaseError,
    TurnRejected,
)
from agentstream.models import ChatModel, endpoints_of
from agentstream.ops import logs, metrics, tracing
from agentstream.runtime import conversations, operations
from agentstream.runtime.cancel import CancelTarget, cancel_target, publish_cancel
from agentstream.runtime.consumer import current_delivery
from agentstream.runtime.deltas import DEFAULT_MAXLEN, DEFAULT_TTL_S, RedisDeltaSink
from agentstream.runtime.folding import FoldReader
from agentstream.runtime.operations import Entry
from agentstream.runtime.reports import report_error
from agentstream.runtime.salvage import readable_events
from agentstream.runtime.store import Read, Taken, TraceStore
from agentstream.runtime.watchdog import LOST_WORK_CODE, awaiting_key, record_jobs
from agentstream.steps.call_ids import scope_call_ids
from agentstream.steps.decision import (
    CallModel,
    CancelTurn,
    EndTurn,
    FailTurn,
    Idle,
    RecordResults,
    RunTools,
    active_turn,
    decide_view,
    final_stop_reason,
    unanswered_results,
)
from agentstream.steps.fold import FoldCache, TraceFold
from agentstream.steps.summarising import failure_code
from agentstream.steps.timeline import reply_of_ending
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.events import (
    CancelMessage,
    CancelRequested,
    ModelOutput,
    TaskInput,
    ToolJob,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import CANCEL_FIELD, REPLY_FIELD, TURN_FIELD, WAKE_FIELD, Keys
from agentstream_services.agent_loop.children import Children
from agentstream_services.agent_loop.compactions import Compactions
from agentstream_services.agent_loop.mcp_offers import McpOffers

log = logging.getLogger("agentstream.agent_loop")

BUSY_POLICIES = ("queue", "reject", "interrupt")
"""What a turn published on a busy conversation does: wait behind the running turn (default),
fail at once with code ``busy``, or cancel the running turn and then run."""

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


class AgentLoop:
    """Handles turns and wake-ups for every trace.

    Args:
        app: the user's app.
        store: the trace store.
        models: model clients by endpoint id (agents name them).
        delta_maxlen: entries kept on a trace's token-delta stream while a model answers.
        delta_ttl_s: seconds a trace's token-delta stream lives after its last write.
        lease_ttl_ms: the trace lease's time to live, renewed every third of it while held.
        busy_policy: what a turn published on a busy conversation does (:data:`BUSY_POLICIES`).
        trace_retention_s: delete a whole conversation this long after its last turn ended;
            None keeps traces forever (the runtime never trims a trace).
        fold_cache_bytes: the most stored event bytes of folded traces kept in memory
            (:class:`agentstream.steps.fold.FoldCache`).
        limits: the wire's limits and reply streams (:mod:`agentstream.wire.checks`).
        turn_deadline_s: the most a turn may take from its start, in seconds (checked at each
            step, bounding each model call); past it the turn fails with code ``deadline``.
            None: no deadline.
        mcp_wait_s: how long a turn waits for the first tool list of its agent's MCP servers,
            in seconds, before it fails (see :mod:`agentstream_services.agent_loop.mcp_offers`).
    """

    def __init__(
        self,
        app: App,
        store: TraceStore,
        models: dict[str, ChatModel],
        *,
        lease_ttl_ms: int = 30_000,
        busy_policy: str = "queue",
        trace_retention_s: float | None = None,
        delta_maxlen: int = DEFAULT_MAXLEN,
        delta_ttl_s: int = DEFAULT_TTL_S,
        fold_cache_bytes: int = 256 * 1024 * 1024,
        limits: wire.WireLimits = wire.DEFAULT_LIMITS,
        turn_deadline_s: float | None = None,
        mcp_wait_s: float = 30.0,
    ):
        if busy_policy not in BUSY_POLICIES:
            raise ValueError(f"busy_policy must be one of {BUSY_POLICIES}, got {busy_policy!r}")
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.models = models
        self.endpoints = endpoints_of(models)  # an agent without model_limits gets its endpoint's
        # what decide checks a turn's model against: None when every model is a double without an
        # endpoint (the testing kit), so a turn may name any model a double serves (self.models says)
        self.served = self.endpoints or None
        self.delta_maxlen = delta_maxlen
        self.delta_ttl_s = delta_ttl_s
        self.children = Children(app, store)
        self.compactions = Compactions(store)
        self.mcp = McpOffers(store, wait_s=mcp_wait_s)  # the MCP tools each call offers, recorded in the trace
        self.lease_ttl_ms = lease_ttl_ms
        self.folds = FoldCache(fold_cache_bytes)  # folded traces: a step reads and folds what was added
        self._admitting: dict[str, list] = {}  # trace id → [its admission lock, admissions using it]
        self._reader = FoldReader(store, self.folds)
        self.busy_policy = busy_policy
        self.trace_retention_s = trace_retention_s
        self._expire_ms = int(trace_retention_s * 1000) if trace_retention_s else None
        self._publishes_with_append = store.one_server  # a Redis Cluster: the step's publication goes after its append
        self._model_calls: dict[str, tuple[str, asyncio.Task]] = {}  # trace → (turn, model call)
        self._held: dict[str, int] = {}  # trace → the token of the lease this process holds on it
        self._deferred: dict[str, tuple[str, float]] = {}  # trace → (hint entry, until): one waits per trace
        self.empty_hints = 0  # wake-ups (and other hints) that named a trace holding nothing
        self.limits = limits
        self.turn_deadline_s = turn_deadline_s
        self._usage_doubted: set[str] = set()  # endpoints whose under-reported usage was logged

    # --- hints ------------------------------------------------------------------------------

    async def on_turn(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A published turn: validate it, append it once, and advance its trace.

        ``stream``: the partition of the turns stream the entry came from (what a report names;
        default ``<ns>:turns``)."""
        payload = fields.get(TURN_FIELD)
        where = stream or self.keys.turns
        try:
            doubled = wire.doubled_turn_refusal(
                fields, f"entry {entry_id} of {where}", keys=self.keys, limits=self.limits
            )
            if doubled is not None:  # a field given twice: which value counts is unknown, none is read
                payload = None
                raise doubled
            if payload is None:
                raise TurnRejected(
                    f"entry {entry_id} of {where} has no field 'turn' "
                    f"(fields: {sorted(k.decode(errors='replace') for k in fields)})"
                )
            # the wire's rules: size, depth, schema, ids, metadata, reply stream, agent
            turn = wire.validate_turn(
                payload, keys=self.keys, limits=self.limits, agents=(a.name for a in self.app.agents)
            )
            # the agent's rules: its input type, its settings for the turn, the tool states asked
            routing = self.app.turn_input(turn)
        except TurnRejected as exc:  # without a `turn` field, the entry's fields show what arrived
            await self._reject(
                entry_id, payload if payload is not None else codec.fields_json(fields), exc, stream=stream
            )
            return
        trace_id = turn.trace_id
        if "/" in trace_id and await self._refused_as_child(entry_id, where, payload, trace_id, turn.turn_id):
            log.warning("rejected turn entry %s: it names a child trace's id", entry_id)
            metrics.TURNS_REJECTED.inc()
            return
        with logs.bind(trace_id=trace_id):
            # turns of one trace enter it in the order this process started them (the order read):
            # concurrent admissions would race on separate connections (see _admission_order)
            async with self._admission_order(trace_id):
                if self.busy_policy != "queue":
                    ended, first, absorbed, differs = await self.store.turn_copy(trace_id, routing, entry_id)
                    if ended:
                        if differs:
                            await self._report_conflict(entry_id, where, turn, first, payload)
                        await self._reply_again(entry_id, turn, first, absorbed=absorbed)
                        return
                    # which entry brought the turn: its own re-delivery is not a re-publish (see _reply_again)
                    await operations.note_turn_entry(self.redis, self.keys, trace_id, turn.turn_id, entry_id)
                    if not await self._admit(turn, routing):
                        return
                self._take_back(trace_id, entry_id)
                fold = self.folds.get(trace_id)
                # one round trip: ended before? else append once, take the lease, read what is new
                admitted = await self.store.admit_turn(
                    trace_id,
                    routing,
                    entry_id,
                    take=True,
                    ttl_ms=self.lease_ttl_ms,
                    after=fold.last_id if fold is not None else None,
                    expire_ms=self._expire_ms,
                )
            if admitted.differs:  # same ids, another body: absorbed all the same, and reported
                await self._report_conflict(entry_id, where, turn, admitted.first_entry, payload)
            if admitted.ended:  # re-published (a backend lost the reply), re-delivered, or a copy seen while it ran
                await self._reply_again(entry_id, turn, admitted.first_entry, absorbed=admitted.absorbed)
                return
            if admitted.created:
                metrics.TURNS_STARTED.labels(agent=turn.agent).inc()
                await self._note_turn(trace_id, fold)  # the gateway's list of recent conversations
            assert admitted.taken is not None
            await self._advance_taken(trace_id, entry_id, admitted.taken, fold)

    async def _refused_as_child(
        self, entry_id: str, source: str, payload: bytes | None, trace_id: str, turn_id: str, why: str = ""
    ) -> bool:
        """Whether a published turn for ``trace_id`` (an id with ``/``) may not enter it
        (:func:`agentstream.delegation.child_trace_refusal`); then it is reported on the errors
        stream (after ``why``, another reason it was refused) and nothing is written to that trace.

        The trace's first event comes from this process's fold of it when it has one (a
        conversation whose own id holds ``/`` costs nothing more per turn); else one entry is
        read and, when there is none, whether each trace its id could descend from exists (one
        round trip)."""
        fold = self.folds.get(trace_id)
        first: object
        if fold is not None and fold.events:
            first = fold.events[0]
        else:
            read = await self.store.read(trace_id, count=1)
            first = read[0][1] if read else None
        ancestor = None if first is not None else await conversations.nearest_trace(self.store, parent_ids(trace_id))
        refusal = child_trace_refusal(trace_id, turn_id, first, ancestor=ancestor)
        if refusal is None:
            return False
        await self._report(
            f"entry {entry_id} of {source}: {why + '; and ' if why else ''}{refusal}",
            payload,
            source=source,
            entry=entry_id,
            trace_id=trace_id,
            turn_id=turn_id,
        )
        return True

    @contextlib.asynccontextmanager
    async def _admission_order(self, trace_id: str):
        """Admit one turn of ``trace_id`` at a time, first come first served (asyncio.Lock is FIFO).

        The consumer starts a stream's entries in the order it read them, but turns admitted at
        once go to Redis on separate pooled connections, whose new-connection handshakes finish
        in any order: turns a user sent back to back entered the trace reversed. Holding this
        across the admission (one round trip) keeps the order of one process; across several
        agent-loop processes, turns published at the same instant enter in the order Redis ran
        their admissions.
        """
        held = self._admitting.get(trace_id)
        if held is None:
            held = self._admitting[trace_id] = [asyncio.Lock(), 0]
        held[1] += 1  # the admissions holding or waiting for it: the last one removes it
        try:
            async with held[0]:
                yield
        finally:
            held[1] -= 1
            if held[1] == 0 and self._admitting.get(trace_id) is held:
                del self._admitting[trace_id]

    async def _note_turn(self, trace_id: str, fold: TraceFold | None) -> None:
        """Note the trace in the index of recent conversations, at most once every
        :data:`agentstream.runtime.conversations.NOTE_INTERVAL_S` per trace and process (the index is a
        courtesy listing, not the truth: its time is within that of the trace's newest turn)."""
        now = time.monotonic()
        noted = fold.notes.get("noted_at") if fold is not None else None
        if noted is not None and now - noted < conversations.NOTE_INTERVAL_S:
            return
        await conversations.note_turn(self.store, trace_id)
        if fold is not None:
            fold.notes["noted_at"] = now

    async def _report_conflict(self, entry_id: str, where: str, turn: TurnMessage, first_entry: str, payload) -> None:
        """Report on the errors stream an entry that repeats a turn's ids with another body: it is
        absorbed as a copy (the turn runs and is answered once, for the admitted body)."""
        error = (
            f"entry {entry_id} of {where} repeats turn {turn.turn_id!r} of trace {turn.trace_id!r} with a body that "
            f"differs from the admitted one (entry {first_entry or 'unknown'}): it was absorbed as a copy and not run; "
            "the turn's reply answers the admitted body. Publish a new question under a new turn_id"
        )
        log.warning("%s", error)
        await self._report(error, payload, source=where, entry=entry_id, trace_id=turn.trace_id, turn_id=turn.turn_id)

    async def _reply_again(
        self, entry_id: str, message: TurnMessage, first_entry: str, *, absorbed: bool = False
    ) -> None:
        """Publish the reply of a turn that already ended again: the same reply, to where the turn
        first asked for it (its stored ``reply_to``; for a turn rejected before it entered the
        trace, this message's). Replies are at-least-once: a backend dedupes by turn id.

        The re-delivery of the entry that brought the turn (its worker died after the turn ended),
        and an entry ``absorbed`` as a copy of the turn while it ran (one published before the
        turn's ending was written, deferred while the lease was held), only make sure the reply
        went out once, as the turn's own ending does.
        """
        fold = await self._current_fold(message.trace_id)
        ending = fold.ending(message.turn_id)
        if ending is None:  # the key hash says ended but the events do not: nothing to repeat
            return
        original = fold.turn_input(message.turn_id)
        turn = original or TurnInput(
            turn_id=message.turn_id,
            agent=message.agent,
            text=message.text or "",
            metadata=message.metadata,
            reply_to=message.reply_to,
        )
        if first_entry == entry_id or absorbed:
            await self._ensure_reply_unheld(message.trace_id, turn, ending, fold)
            return
        if isinstance(original, TaskInput):
            log.info(
                "turn %s of trace %s is a delegated task that ended; its parent has its result",
                message.turn_id,
                message.trace_id,
            )
            return
        reply = _reply_of_ending(message.trace_id, turn, ending, fold.final_stop_reason(ending.turn_id))
        stream = self._reply_stream(turn)
        log.info(
            "turn %s of trace %s ended before; publishing its reply again to %s",
            message.turn_id,
            message.trace_id,
            stream,
        )
        await operations.send_reply(
            self.redis, self.keys, message.trace_id, ending.turn_id, stream, reply
        )  # marked only once written

    async def _admit(self, turn, routing: TurnInput) -> bool:
        """Apply the reject or interrupt policy to a new turn → whether it enters the trace."""
        if await self.store.has_key(turn.trace_id, f"turn:{turn.turn_id}"):
            return True  # entered before (a re-delivery)
        fold = await self._current_fold(turn.trace_id)
        ending = fold.ending(turn.turn_id)
        if ending is not None:  # rejected before (a re-delivery)
            await self._ensure_reply_unheld(turn.trace_id, routing, ending, fold)
            return False
        running = fold.active_turn()
        if running is None:
            return True
        if self.busy_policy == "reject":
            failed = TurnFailed(
                turn_id=turn.turn_id,
                code=FailureCode.BUSY,
                reason=f"conversation {turn.trace_id!r} is busy with turn {running.turn_id!r}; this turn was rejected "
                "(busy policy 'reject'): publish it again once that turn has ended",
            )
            # the reply first, marked sent, then the ending: the running turn holds the lease (so
            # this does not wait for it) and its step loop publishes the replies its fold owes, so
            # an ending appended before its reply was marked could be answered twice. A crash in
            # between leaves the entry pending: its re-delivery appends the ending, the reply
            # already marked.
            await self._ensure_reply(turn.trace_id, routing, failed)
            await self.store.append(turn.trace_id, failed)
            metrics.TURNS_FAILED.labels(agent=turn.agent, code=FailureCode.BUSY).inc()
            return False
        message = CancelMessage(
            trace_id=turn.trace_id,
            turn_id=running.turn_id,
            by="interrupt",
            reason=f"interrupted by turn {turn.turn_id}",
        )
        await self.store.append(
            turn.trace_id, CancelRequested(turn_id=running.turn_id, by=message.by, reason=message.reason)
        )
        await publish_cancel(self.redis, self.keys, message)  # every process: abort the running step now
        self._abort_local(turn.trace_id, running.turn_id)
        return True

    async def on_wake(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A wake-up: something was appended to a trace; advance it (``stream``: the partition of
        the wake-up stream it came from, for a report; default ``<ns>:wake``)."""
        try:
            wake = codec.decode_wake(codec.entry_field(fields, WAKE_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed wake-up %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, WAKE_FIELD)
            await self._report(
                f"malformed wake-up {entry_id}: {exc}", shown, source=stream or self.keys.wake, entry=entry_id
            )
            return
        await self.advance(wake.trace_id, entry_id=entry_id)

    async def on_cancel(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A cancel request (the agent loop's group on the cancel stream): record it, then advance."""
        try:
            message = codec.decode_cancel(codec.entry_field(fields, CANCEL_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed cancel %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, CANCEL_FIELD)
            await self._report(f"malformed cancel {entry_id}: {exc}", shown, source=self.keys.cancel, entry=entry_id)
            return
        recorded, target = await self.request_cancel(message)
        if recorded is not None:
            self._abort_local(message.trace_id, recorded.turn_id)
            await self.advance(message.trace_id, entry_id=entry_id)
        elif target.ending is None and (message.turn_id or not target.any_turn):
            # a cancel that can never take effect (not a race with the turn's end): its sender is told
            if not target.any_turn:
                why = f"trace {message.trace_id!r} holds no turn (no such conversation, or deleted by retention)"
            else:
                why = (
                    f"trace {message.trace_id!r} holds no turn {message.turn_id!r} (not yet admitted, or "
                    f"another conversation's)"
                )
            error = f"cancel {entry_id} of {self.keys.cancel} cancelled nothing: {why}"
            log.warning("%s", error)
            await self._report(
                error,
                codec.entry_shown(fields, CANCEL_FIELD),
                source=self.keys.cancel,
                entry=entry_id,
                trace_id=message.trace_id,
                turn_id=message.turn_id,
            )

    async def request_cancel(self, message: CancelMessage) -> tuple[CancelRequested | None, CancelTarget]:
        """Write the cancel into the trace (once) → (the event, or None when no turn is left to
        cancel; the target, which says why not).

        A cancel names a turn of the trace that has not ended (or, without a turn id, the running
        one); one for a turn id the trace does not hold, or that ended, records nothing
        (:func:`agentstream.runtime.cancel.cancel_target`).
        """
        fold = await self._current_fold(message.trace_id)
        target = cancel_target(fold.events, message.turn_id)
        if target.turn_id is None:
            log.info("cancel for trace %s: %s; nothing recorded", message.trace_id, target.reason)
            return None, target
        event = CancelRequested(turn_id=target.turn_id, by=message.by, reason=message.reason)
        await self.store.append(message.trace_id, event)
        return event, target

    async def on_cancel_broadcast(self, message: CancelMessage) -> None:
        """A cancel heard by this process: abort its in-flight model call for the turn, if any."""
        held = self._model_calls.get(message.trace_id)
        if held is None:
            return
        turn_id, _task = held
        if message.turn_id and message.turn_id != turn_id:
            return
        # The truth first: the aborted step reads the trace again and must find the cancel.
        await self.store.append(
            message.trace_id, CancelRequested(turn_id=turn_id, by=message.by, reason=message.reason)
        )
        self._abort_local(message.trace_id, turn_id)

    def _abort_local(self, trace_id: str, turn_id: str) -> None:
        held = self._model_calls.get(trace_id)
        if held is not None and held[0] == turn_id and not held[1].done():
            log.info("aborting the in-flight model request of turn %s (trace %s): cancelled", turn_id, trace_id)
            held[1].cancel()

    async def _abortable(self, trace_id: str, turn_id: str, call) -> ModelOutput | None:
        """Run a model call that a cancel of the turn may abort → its output, or None when aborted."""
        task = asyncio.ensure_future(call)
        self._model_calls[trace_id] = (turn_id, task)
        try:
            await asyncio.wait({task})
        finally:
            self._model_calls.pop(trace_id, None)
            if not task.done():
                task.cancel()
        if task.cancelled():
            return None
        return task.result()

    # --- dead letters: the waiting turn ends with a reason ------------------------------------

    async def on_dead_turn(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A turn entry that kept failing: its turn fails with code ``dead_letter``."""
        try:
            turn = wire.validate_turn(fields.get(TURN_FIELD) or b"", keys=self.keys, limits=self.limits)
        except Exception:  # any bytes: nothing to fail, the dead-letter stream keeps the entry
            return
        routing = TurnInput(
            turn_id=turn.turn_id, agent=turn.agent, text=turn.text or "", metadata=turn.metadata, reply_to=turn.reply_to
        )
        await self._dead_end(
            turn.trace_id, routing, f"turn entry {entry_id} of {self.keys.turns_for(turn.trace_id)}", error
        )

    async def on_dead_wake(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A wake-up that kept failing: the trace's running turn fails with code ``dead_letter``."""
        try:
            wake = codec.decode_wake(fields.get(WAKE_FIELD) or b"")
        except Exception:  # any bytes: nothing to fail, the dead-letter stream keeps the entry
            return
        events = await readable_events(self.store, wake.trace_id)  # the trace may be what failed
        running = active_turn(events)
        if running is not None:
            await self._dead_end(
                wake.trace_id, running, f"wake-up {entry_id} of {self.keys.wake_for(wake.trace_id)}", error, events
            )

    async def _dead_end(self, trace_id: str, turn: TurnInput, what: str, error: str, events=None) -> None:
        """End ``turn`` with code ``dead_letter``; its calls still without a result get an error
        result first (in the same atomic append), so none is left dangling."""
        reason = (
            f"the {what} failed on every delivery and was moved to its dead-letter stream "
            f"(last error: {error}); the turn was given up"
        )
        await self._give_up(trace_id, turn, DEAD_LETTER_CODE, reason, events)

    async def publish_owed_replies(self, trace_id: str) -> bool:
        """Publish the replies the trace owes (the watchdog's look at a trace whose reply the
        replies stream refused, :mod:`agentstream.runtime.watchdog`) → True when it owes none now,
        False when its lease is held (its holder publishes them; looked at again next round).

        Raises:
            redis.exceptions.ResponseError: the replies stream still refuses them (reported).
        """
        fold = await self._current_fold(trace_id)
        if not fold.unconfirmed:
            return True
        try:
            async with self._lease(trace_id) as _token:
                fold = await self._current_fold(trace_id)
                await self._publish_replies(trace_id, fold)
        except Deferred:
            return False
        return not fold.unconfirmed

    async def end_lost_work(self, trace_id: str, turn_id: str, vanished) -> None:
        """End a running turn whose awaited tool work vanished (the watchdog,
        :mod:`~agentstream.runtime.watchdog`), with code ``lost_work``."""
        events = await readable_events(self.store, trace_id)
        turn = active_turn(events)
        if turn is None or turn.turn_id != turn_id:
            return
        lost = "; ".join(f"call {v.call_id}: {v.what}" for v in vanished)
        reason = f"the turn waited on tool work that vanished without a result ({lost}); the turn was given up"
        await self._give_up(trace_id, turn, LOST_WORK_CODE, reason, events)

    async def _give_up(self, trace_id: str, turn: TurnInput, code: str, reason: str, events=None) -> None:
        """End ``turn`` with ``code`` and ``reason`` under the trace's lease; its calls still
        without a result get an error result first (in the same atomic append)."""
        if events is None:
            events = await readable_events(self.store, trace_id)
        failed = TurnFailed(turn_id=turn.turn_id, code=code, reason=reason)
        unanswered = unanswered_results(
            events,
            turn,
            code,
            "Error: the turn was given up before this call returned a result; it may have partly run.",
        )
        async with self._lease(
            trace_id, wait_s=self.lease_ttl_ms / 1000.0 * 1.5
        ) as token:  # only the holder ends a turn
            *_, appended = await self.store.append_many(trace_id, [*unanswered, failed], fence=token)
            # the reply too, before the lease goes back: a step loop that takes the lease next
            # folds this ending as owing a reply and must find it marked sent (see _reject)
            await self._ensure_reply(trace_id, turn, failed, events=events)
        if appended.created:
            metrics.TURNS_FAILED.labels(agent=turn.agent, code=code).inc()
        # a turn queued behind this one goes on
        await operations.wake_trace(self.redis, self.keys, trace_id, code)

    async def _reject(
        self, entry_id: str, payload: bytes | None, exc: TurnRejected, *, stream: str | None = None
    ) -> None:
        """A turn that breaks a rule of the wire: with its ids, it fails ``bad_turn`` in its trace and
        gets a failed reply (to its ``reply_to`` when that passed the check, with its metadata);
        without them, or when its turn id is an accepted turn's, it goes to the errors stream."""
        log.warning("rejected turn entry %s: %s", entry_id, exc.reason)
        metrics.TURNS_REJECTED.inc()
        if (
            exc.trace_id
            and exc.turn_id
            and "/" in exc.trace_id
            and await self._refused_as_child(
                entry_id,
                stream or self.keys.turns_for(exc.trace_id),
                payload,
                exc.trace_id,
                exc.turn_id,
                why=exc.reason,
            )
        ):  # its failure would be written into a child trace, or begin one in a child's name
            return
        if exc.trace_id and exc.turn_id:
            # after the admissions of the trace this process started before it (a valid turn read
            # just before a malformed copy of it enters first; the copy then finds it and is ignored)
            async with self._admission_order(exc.trace_id):
                await self._reject_turn(entry_id, payload, exc, stream=stream)
            return
        source = stream or (self.keys.turns_for(exc.trace_id) if exc.trace_id else self.keys.turns)
        await self._report(exc.reason, payload, source=source, entry=entry_id)

    async def _reject_turn(
        self, entry_id: str, payload: bytes | None, exc: TurnRejected, *, stream: str | None
    ) -> None:
        """:meth:`_reject` of a message that names its trace and turn (under the trace's admission order)."""
        assert exc.trace_id is not None and exc.turn_id is not None  # what makes it one (see _reject)
        if await self.store.has_key(exc.trace_id, f"turn:{exc.turn_id}"):
            # a malformed copy of a turn the trace holds: reported; the real turn goes on
            log.warning(
                "turn entry %s is a malformed copy of turn %s of trace %s, which the trace holds: "
                "ignored, the turn goes on",
                entry_id,
                exc.turn_id,
                exc.trace_id,
            )
            await self._report(
                f"malformed copy of turn {exc.turn_id!r} of trace {exc.trace_id!r} (which the trace "
                f"already holds; ignored): {exc.reason}",
                payload,
                source=stream or self.keys.turns_for(exc.trace_id),
                entry=entry_id,
            )
            return
        failed = TurnFailed(turn_id=exc.turn_id, code=exc.code, reason=exc.reason)
        # only the holder of the lease ends a turn; refusals of one trace arriving together
        # each hold it for one append, so wait for it briefly rather than defer by a lease time
        routing = TurnInput(turn_id=exc.turn_id, agent="", text="", metadata=exc.metadata, reply_to=exc.reply_to)
        async with self._lease(exc.trace_id, wait_s=min(REJECT_LEASE_WAIT_S, self.lease_ttl_ms / 1000.0)) as token:
            await self.store.append(exc.trace_id, failed, fence=token)
            # The reply goes out and is marked sent while the lease is held: the step loop of
            # any agent loop that takes the lease next folds this ending as owing a reply and
            # publishes what is not marked, so a reply published after the lease went back was
            # published twice whenever a step of the trace ran in between (its replies are
            # published and marked only under the lease). Two refusals of one turn id are one
            # reply for the same reason.
            await self._ensure_reply(exc.trace_id, routing, failed)

    async def _report(self, error: str, payload: bytes | None, **extra: str) -> None:
        """One entry on the errors stream: a bounded excerpt of the payload, the stream capped."""
        await report_error(self.redis, self.keys, error, payload, self.limits, **extra)

    # --- folds: what this process knows of a trace ----------------------------------------------

    async def _current_fold(self, trace_id: str) -> TraceFold:
        """The trace's fold with everything appended so far (no lease needed: a trace only grows)."""
        return await self._reader.current(trace_id)

    async def _fold_with(self, trace_id: str, fold: TraceFold | None, read: Read) -> TraceFold:
        """Feed ``read`` (entries after ``fold``'s last id, or the whole trace without a fold)."""
        return await self._reader.fold_with(trace_id, fold, read)

    @contextlib.asynccontextmanager
    async def _lease(self, trace_id: str, *, wait_s: float = 0.0):
        """Hold the trace's lease for a write outside the step loop → its fencing token.

        Waits up to ``wait_s`` seconds for it; then raises :class:`Deferred` (the entry comes
        back when the lease would expire). The lease is given back afterwards; when a hint came
        meanwhile (it found the trace held, marked it dirty and left it to the holder, which does
        not run the step loop here), the trace is woken (a wake-up, reason ``held``), so the hint
        is not lost.
        """
        deadline = asyncio.get_running_loop().time() + wait_s
        while (token := await self.store.acquire_lease(trace_id, ttl_ms=self.lease_ttl_ms)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                left_ms = await operations.lease_left_ms(self.redis, self.keys, trace_id)
                raise Deferred(
                    min(max(left_ms, 0), self.lease_ttl_ms) / 1000.0 + 0.05,
                    f"trace {trace_id} is held by another worker",
                )
            await asyncio.sleep(0.05)
        try:
            yield token
        finally:
            await asyncio.shield(self._give_back(trace_id, token))

    async def _give_back(self, trace_id: str, token: int) -> None:
        """Release a lease held for a write outside the step loop; wake the trace when a hint
        came meanwhile (see :meth:`_lease`)."""
        if await self.store.release_lease(trace_id, token) == "dirty":  # the mark is cleared, the lease kept
            await self.store.release_lease(trace_id, token, keep_if_dirty=False)
            await operations.wake_trace(self.redis, self.keys, trace_id, "held")

    # --- the step loop ----------------------------------------------------------------------

    async def advance(self, trace_id: str, *, entry_id: str | None = None) -> None:
        """Take the trace's steps until it waits on tools or has no turn left.

        When another worker holds the trace, the trace is marked dirty (the holder looks again
        before it lets go) and this returns; a hint held by another process's lease waits, one
        per trace, until that lease would expire (``entry_id``: the hint's entry, see
        :class:`agentstream.errors.Deferred`), so it survives a holder that dies.
        """
        with logs.bind(trace_id=trace_id):
            self._take_back(trace_id, entry_id)
            fold = self.folds.get(trace_id)
            taken = await self.store.take(
                trace_id, ttl_ms=self.lease_ttl_ms, after=fold.last_id if fold is not None else None
            )
            await self._advance_taken(trace_id, entry_id, taken, fold)

    def _take_back(self, trace_id: str, entry_id: str | None) -> None:
        """The hint that waited for this trace is handled again: another one may wait next time."""
        waiting = self._deferred.get(trace_id)
        if waiting is not None and waiting[0] == entry_id:
            del self._deferred[trace_id]

    async def _advance_taken(self, trace_id: str, entry_id: str | None, taken: Taken, fold: TraceFold | None) -> None:
        while True:
            if taken.empty:
                self.folds.forget(trace_id)
                if entry_id is not None:  # a hint for a trace that is not there: deleted by retention, or a stray
                    self.empty_hints += 1
                    log.info(
                        "hint %s names trace %s, which holds nothing (deleted by retention, or never written); "
                        "nothing to do",
                        entry_id,
                        trace_id,
                    )
                return
            if taken.token is None:
                self._held_elsewhere(trace_id, entry_id, taken)
                return
            assert taken.read is not None
            if not await self._hold(trace_id, taken.token, taken.read, fold):
                return
            # The lease expired while held (this process stalled, or Redis was away): hints that
            # came meanwhile may have counted on this holder, so take the trace again; when
            # another worker has it now, this take marks it dirty and that holder goes on.
            log.warning("lost the lease of trace %s mid-step; taking it again", trace_id)
            fold = self.folds.get(trace_id)
            taken = await self.store.take(
                trace_id, ttl_ms=self.lease_ttl_ms, after=fold.last_id if fold is not None else None
            )

    async def _hold(self, trace_id: str, token: int, read: Read, fold: TraceFold | None) -> bool:
        """Take the trace's steps under the lease ``token`` → True when the lease was lost."""
        self._held[trace_id] = token
        renewer = asyncio.create_task(self._renew(trace_id, token))
        try:
            fold = await self._fold_with(trace_id, fold, read)
            return await self._steps(trace_id, token, fold)
        except StaleLeaseError:
            return True
        except BaseException:
            # shielded: a stopping worker gives the trace back even if it is cancelled again
            await asyncio.shield(self.store.release_lease(trace_id, token, keep_if_dirty=False))
            raise
        finally:
            if self._held.get(trace_id) == token:
                del self._held[trace_id]
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    def _held_elsewhere(self, trace_id: str, entry_id: str | None, taken: Taken) -> None:
        """The lease is held (the trace is marked dirty already): wait for a holder in another
        process with one hint per trace; a holder in this process needs no help."""
        if str(self._held.get(trace_id)) == taken.holder or entry_id is None:
            return
        now = asyncio.get_running_loop().time()
        waiting = self._deferred.get(trace_id)
        if waiting is not None and waiting[0] != entry_id and waiting[1] > now:
            return  # another hint of this trace already waits for the holder
        delay_s = min(taken.left_ms, self.lease_ttl_ms) / 1000.0 + 0.05
        self._deferred[trace_id] = (entry_id, now + delay_s + self.lease_ttl_ms / 1000.0)
        raise Deferred(delay_s, f"trace {trace_id} is held by another worker")

    async def _renew(self, trace_id: str, token: int) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_ms / 3000.0)
            if not await self.store.renew_lease(trace_id, token, ttl_ms=self.lease_ttl_ms):
                log.warning("could not renew the lease of trace %s", trace_id)
                return

    async def _steps(self, trace_id: str, token: int, fold: TraceFold) -> bool:
        """Decide from the fold and act until the trace waits; then publish and release → True
        when the lease turned out lost at the release."""
        jobs: list[tuple[str, int, list[tuple[str, str, bytes, bytes]]]] = []
        while True:
            decision = fold.decide(self.app.agent, self.served)
            turn = getattr(decision, "turn", None)
            # a child of the turn's trace context (OpenTelemetry); every line logged names the turn
            with _step_span(trace_id, decision), logs.bind(turn_id=turn.turn_id if turn is not None else None):
                outcome = await self._act(trace_id, token, fold, decision, jobs)
            if outcome is _Outcome.AGAIN:
                continue
            if outcome is _Outcome.REFRESH or outcome is _Outcome.DIRTY:
                fold = await self._current_fold(trace_id)
                continue
            if outcome is _Outcome.RELEASED:
                return False
            released = await self._release(trace_id, token, fold, jobs)
            jobs.clear()
            if released != "dirty":
                return released == "lost"
            fold = await self._current_fold(trace_id)  # a hint came meanwhile: look again

    async def _act(self, trace_id: str, token: int, fold: TraceFold, decision, jobs: list) -> _Outcome:  # noqa: C901 (an outlier from before the complexity limit; issue 32 splits it)
        """Carry out one decision → what the step loop does next."""
        match decision:
            case Idle():
                return _Outcome.WAIT
            case CallModel(turn=turn, agent=agent, step=step):
                if fold.unconfirmed:  # a turn starts: the turns before it have had their replies
                    await self._publish_replies(trace_id, fold)
                left_s = _turn_time_left_s(fold.turn_entry(turn.turn_id), turn.turn_id, self.turn_deadline_s)
                if left_s is not None and left_s <= 0:
                    return await self._end(
                        trace_id, token, fold, _past_turn_deadline(turn, self.turn_deadline_s, step), turn
                    )
                # what the MCP offer reads of the trace: the agent's latest offer and the turn's input entry
                offer = await self.mcp.before_call(
                    trace_id, token, turn, agent, step, fold.turn_entry(turn.turn_id), fold.offers_of(agent.name)
                )
                if isinstance(offer, TurnFailed):  # an MCP server never published its tools
                    return await self._end(trace_id, token, fold, offer, turn)
                if offer:  # the trace now records the MCP tools offered from this call on
                    return _Outcome.REFRESH
                try:
                    built = fold.build(agent, turn_id=turn.turn_id, step=step)
                    request = await self.compactions.request_for(trace_id, built, fold.events, agent)
                except ContextError as exc:  # does not fit the window, the summary failed, or bad context settings
                    failed = TurnFailed(turn_id=turn.turn_id, code=failure_code(exc), reason=str(exc))
                    return await self._end(trace_id, token, fold, failed, turn)
                if request is None:  # a summary is written first; its outcome wakes the trace
                    return _Outcome.WAIT
                model = self.models.get(agent.model) if agent.model is not None else None
                if model is None or agent.model is None:
                    failed = TurnFailed(
                        turn_id=turn.turn_id,
                        code=FailureCode.CONFIG,
                        reason=f"agent {agent.name!r} names model {agent.model!r}, which is not configured",
                    )
                    return await self._end(trace_id, token, fold, failed, turn)
                miss: dict[str, int | None] | None = None
                try:
                    try:
                        output = await self._call_model(trace_id, turn, agent, step, model, request, left_s)
                    except ContextWindowExceeded as exc:  # the server's window is smaller than the estimate said
                        miss = {
                            "prompt_tokens": exc.prompt_tokens,
                            "window_tokens": exc.window_tokens,
                            "over_by_tokens": exc.over_by_tokens,
                        }
                        log.warning(
                            "trace %s turn %s step %d: the model's server refused the request as over its window (%s); "
                            "sending it once more, smaller",
                            trace_id,
                            turn.turn_id,
                            step,
                            exc,
                        )
                        endpoint = self.endpoints.get(agent.model)
                        if endpoint is not None and exc.window_tokens and exc.window_tokens < endpoint.window_tokens:
                            log.warning(
                                "model endpoint %r is configured with window_tokens %d, but its server states a "
                                "window of %d tokens: set window_tokens to it, or every call that fits the first "
                                "and not the second is refused once before it goes out smaller",
                                endpoint.id,
                                endpoint.window_tokens,
                                exc.window_tokens,
                            )
                        try:
                            request = request_after_miss(fold.events, agent, turn_id=turn.turn_id, step=step, **miss)
                            output = await self._call_model(trace_id, turn, agent, step, model, request, left_s)
                        except (ContextError, ContextWindowExceeded) as again:
                            failed = TurnFailed(
                                turn_id=turn.turn_id,
                                code=FailureCode.CONTEXT_FULL,
                                reason=f"model call {step}: the model's server refused the request as over its "
                                f"context window ({exc}), and {again}",
                            )
                            return await self._end(trace_id, token, fold, failed, turn)
                    if output is None:  # aborted by a cancel: the next step ends the turn
                        return _Outcome.REFRESH
                    if miss is not None:  # what a rebuild of this call needs to send the same request
                        output = msgspec.structs.replace(output, attributes={**output.attributes, WINDOW_MISS: miss})
                except TimeoutError:  # the turn's deadline (a model call's own is a ModelError)
                    if left_s is None:
                        raise
                    return await self._end(
                        trace_id, token, fold, _past_turn_deadline(turn, self.turn_deadline_s, step), turn
                    )
                except ModelError as exc:
                    code = DEADLINE_CODE if isinstance(exc, ModelDeadlineExceeded) else FailureCode.MODEL_ERROR
                    failed = TurnFailed(turn_id=turn.turn_id, code=code, reason=f"model call {step} failed: {exc}")
                    return await self._end(trace_id, token, fold, failed, turn)
                unstorable = self.store.codec.unstorable(output)
                if unstorable is not None:  # the turn's failure, not a handler failure that calls the model again
                    failed = TurnFailed(
                        turn_id=turn.turn_id,
                        code=FailureCode.MODEL_ERROR,
                        reason=f"model call {step} returned an output that cannot be stored: {unstorable}",
                    )
                    return await self._end(trace_id, token, fold, failed, turn)
                metrics.record_usage(agent.model, output)
                self._check_usage(agent, request, output)
                if agent.prompt_digest:  # which prompt file texts the call read: what a rebuild compares
                    output = msgspec.structs.replace(output, prompt_digest=agent.prompt_digest)
                return await self._record_output(trace_id, token, fold, turn, output)
            case RecordResults(results=results):
                await self._append(trace_id, token, fold, self._storable(results))
                return _Outcome.AGAIN
            case RunTools(turn=turn, agent=agent, step=step, calls=calls):
                published = fold.notes.get(("jobs", turn.turn_id, step))
                if published is None:  # not known here: another worker may have published them
                    published = await self.store.has_key(trace_id, _jobs_marker(turn.turn_id, step))
                if not published:  # built here, inside the step's span: each job carries it
                    jobs.append((turn.turn_id, step, self._jobs(trace_id, fold, turn, agent, calls)))
                return _Outcome.WAIT
            case EndTurn(turn=turn, answer=answer, citations=citations, answer_call=answer_call):
                ended = TurnEnded(turn_id=turn.turn_id, answer=answer, citations=citations, answer_call=answer_call)
                return await self._end(trace_id, token, fold, ended, turn)
            case FailTurn(turn=turn, code=code, reason=reason):
                return await self._end(
                    trace_id, token, fold, TurnFailed(turn_id=turn.turn_id, code=code, reason=reason), turn
                )
            case CancelTurn(turn=turn, results=results, code=code, reason=reason):
                failed = TurnFailed(turn_id=turn.turn_id, code=code, reason=reason)
                return await self._end(trace_id, token, fold, failed, turn, before=results)
        raise AssertionError(f"unhandled decision {decision!r}")

    async def _call_model(
        self,
        trace_id: str,
        turn: TurnInput,
        agent: Agent,
        step: int,
        model: ChatModel,
        request: ChatRequest,
        left_s: float | None,
    ) -> ModelOutput | None:
        """One model call in its span, bounded by the turn's deadline; None when a cancel aborted it.

        Raises:
            TimeoutError: the turn's deadline passed.
            ModelError: the call failed (ContextWindowExceeded among them).
        """
        attributes = tracing.model_call_attributes(model, turn_id=turn.turn_id, step=step)
        with (
            metrics.MODEL_CALL_SECONDS.labels(model=agent.model).time(),
            tracing.span("agentstream.model_call", kind="client", attributes=attributes) as span,
        ):
            call = model.complete(request, turn_id=turn.turn_id, step=step, deltas=self._deltas(trace_id))
            if left_s is not None:  # the turn's deadline bounds the call too
                call = asyncio.wait_for(call, left_s)
            output = await self._abortable(trace_id, turn.turn_id, call)
            tracing.record_model_output(span, output)
        return output

    def _storable(self, results) -> list:
        """The results a decision records (an unknown tool's, a reopen's: built from what the model
        wrote), each that the trace cannot store (a lone surrogate echoed from its arguments)
        replaced by an error result saying so: it would fail the append on every delivery, and
        the model would be called again each time."""
        out = []
        for result in results:
            problem = self.store.codec.unstorable(result)
            if problem is not None and isinstance(result, ToolOutput):
                log.warning(
                    "call %s (%s): its result cannot be stored (%s); recorded as an error result",
                    result.call_id,
                    result.name,
                    problem,
                )
                result = ToolOutput(
                    turn_id=result.turn_id,
                    call_id=result.call_id,
                    name=result.name,
                    error="invalid_result",
                    text=f"Error: the result of this call of {result.name!r} could not be stored ({problem}); "
                    "check the call's arguments and call it again",
                )
            out.append(result)
        return out

    async def _append(
        self, trace_id: str, token: int, fold: TraceFold, events: list, *, then: list | tuple = ()
    ) -> list:
        """Append under the lease and fold what came since the fold's last entry (one round trip)."""
        appended, read = await self.store.append_and_read(
            trace_id, events, then=then, fence=token, after=fold.last_id, expire_ms=self._expire_ms
        )
        assert read is not None
        await self._fold_with(trace_id, fold, read)
        return appended

    async def _record_output(
        self, trace_id: str, token: int, fold: TraceFold, turn: TurnInput, output: ModelOutput
    ) -> _Outcome:
        """Append a model output; when it ends the turn (an answer, or a failure), the ending goes
        in the same append, provided nothing else came into the trace meanwhile."""
        output = scope_call_ids(output, used=fold.call_ids)  # a call id names one call of the trace
        then: list = []
        view = fold.view()  # as folded up to fold.last_id: the conditional part holds only if nothing came since
        nxt = decide_view(view.with_output(output), self.app.agent, self.served) if view.turn == turn else None
        if isinstance(nxt, EndTurn):
            then = [
                TurnEnded(turn_id=turn.turn_id, answer=nxt.answer, citations=nxt.citations, answer_call=nxt.answer_call)
            ]
        elif isinstance(nxt, FailTurn):
            then = [TurnFailed(turn_id=turn.turn_id, code=nxt.code, reason=nxt.reason)]
        elif isinstance(nxt, RecordResults):
            then = self._storable(nxt.results)
        if self._publishes_with_append and not fold.unconfirmed:
            if isinstance(nxt, RunTools) and nxt.calls:
                return await self._append_with_jobs(trace_id, token, fold, turn, output, nxt)
            # after the ending the trace waits, unless another turn is queued behind this one
            if isinstance(nxt, EndTurn) and not isinstance(turn, TaskInput) and not fold.others_unended(turn.turn_id):
                return await self._append_with_reply(trace_id, token, fold, turn, output, then[0])
        appended = await self._append(trace_id, token, fold, [output], then=then)
        if appended[0] is not None and appended[0].created and output.tool_calls:
            fold.notes[("jobs", turn.turn_id, output.step)] = False  # a new output: nobody published its jobs
        if then and isinstance(then[-1], (TurnEnded, TurnFailed)) and appended[-1] is not None:
            self._ended(fold, turn, then[-1], appended[-1].created)
        return _Outcome.AGAIN

    async def _append_with_jobs(
        self, trace_id: str, token: int, fold: TraceFold, turn: TurnInput, output: ModelOutput, nxt: RunTools
    ) -> _Outcome:
        """Append a model output with tool calls, publish their jobs and give the lease back in
        one script, when nothing came into the trace since the fold's last entry (one Redis
        server: :meth:`TraceStore.append_publish_release`). The step after the append would
        decide ``nxt`` (run these calls) and then wait: its publication and release go with the
        append. Otherwise (the output was there already, another entry came first, a job stream
        refused the XADD) the step loop goes on as after any append."""
        with _step_span(trace_id, nxt):  # each job carries its step's span, as when the step loop builds it
            jobs = self._jobs(trace_id, fold, turn, nxt.agent, nxt.calls)
        noted = ("jobs", turn.turn_id, nxt.step)
        # noted before Redis runs the release, for a task of this process that takes the lease next (see _release)
        fold.notes[noted] = True
        try:
            appended, outcome = await self._append_publishing(
                trace_id, token, fold, [output], [], jobs, [_jobs_marker(turn.turn_id, nxt.step)]
            )
        except BaseException:
            fold.notes.pop(noted, None)  # unknown: asked of Redis before the jobs are published
            raise
        if outcome is None:  # not published: the step loop decides again from what it read
            if appended[0] is not None and appended[0].created:
                fold.notes[noted] = False  # a new output: nobody published its jobs
            else:
                fold.notes.pop(noted, None)
            return _Outcome.AGAIN
        return _Outcome.RELEASED if outcome == "released" else _Outcome.DIRTY

    async def _append_with_reply(
        self, trace_id: str, token: int, fold: TraceFold, turn: TurnInput, output: ModelOutput, ending: TurnEnded
    ) -> _Outcome:
        """Append a model output that answers a root turn with the turn's ending, publish the
        reply and give the lease back in one script (one Redis server), when nothing came into the
        trace since the fold's last entry: the reply is the one :meth:`_release` would publish
        next (the output is the turn's last, so its stop reason is the reply's). The caller
        checked that no other turn waits behind this one (the next step would start it, not
        release). Otherwise the step loop goes on as after any append, and publishes the reply
        it owes."""
        stop_reason = output.stop_reason if not output.stopped_normally else None
        reply = _reply_of_ending(trace_id, turn, ending, stop_reason)
        entries = [("", self._reply_stream(turn), REPLY_FIELD, codec.encode(reply))]
        marker = f"reply:{ending.turn_id}"
        appended, outcome = await self._append_publishing(trace_id, token, fold, [output], [ending], entries, [marker])
        if appended[-1] is not None:
            self._ended(fold, turn, ending, appended[-1].created)  # the reply is owed until confirmed
        if outcome is None:
            return _Outcome.AGAIN
        _log_ending(trace_id, ending, reply.stop_reason)
        self._confirm(fold, [marker])
        return _Outcome.RELEASED if outcome == "released" else _Outcome.DIRTY

    async def _append_publishing(
        self, trace_id: str, token: int, fold: TraceFold, events: list, then: list, entries: list, marks: list[str]
    ) -> tuple[list, str | None]:
        """:meth:`TraceStore.append_publish_release` under the lease ``token``, the read folded →
        (appended, ``"released"``, ``"dirty"`` or None when nothing was published).

        The work entry being handled (a turn, a wake-up, a cancel) is acknowledged in the same
        script when the lease is released: every handler's step loop is its last work, and a
        release ends it (:func:`agentstream.runtime.consumer.current_delivery`)."""
        delivery = current_delivery()
        ack = delivery.ack_args() if delivery is not None and not delivery.acknowledged else None
        appended, read, outcome, _ids, acknowledged = await self.store.append_publish_release(
            trace_id,
            events,
            then=then,
            fence=token,
            after=fold.last_id,
            entries=entries,
            marks=marks,
            awaiting_key=awaiting_key(self.keys, self.keys.partition(trace_id)),
            expire_ms=self._expire_ms,
            ack=ack,
        )
        if acknowledged:
            assert delivery is not None  # acknowledged only with its ack arguments
            delivery.acknowledged = True
        await self._fold_with(trace_id, fold, read)
        return appended, outcome

    async def _end(
        self, trace_id: str, token: int, fold: TraceFold, ending: TurnEnded | TurnFailed, turn: TurnInput, *, before=()
    ) -> _Outcome:
        """Append ``before`` (results) and the turn's ending in one atomic append; the reply goes
        out with the next release (or before the next model call)."""
        appended = await self._append(trace_id, token, fold, [*before, ending])
        self._ended(fold, turn, ending, appended[-1].created)
        return _Outcome.AGAIN

    def _ended(self, fold: TraceFold, turn: TurnInput, ending: TurnEnded | TurnFailed, created: bool) -> None:
        if not created:
            return
        fold.notes[("ended", ending.turn_id)] = True  # its reply is not out: no need to ask Redis
        fold.notes[("context", ending.turn_id)] = tracing.inject()  # the reply goes out in the ending step's context
        if isinstance(ending, TurnEnded):
            metrics.TURNS_ENDED.labels(agent=turn.agent).inc()
        elif ending.code == FailureCode.CANCELLED:
            metrics.TURNS_CANCELLED.labels(agent=turn.agent).inc()
        else:
            metrics.TURNS_FAILED.labels(agent=turn.agent, code=ending.code).inc()

    def _check_usage(self, agent, request, output: ModelOutput) -> None:
        """Log, once per endpoint and process, a reported prompt token count implausibly below the
        character estimate (the context library does not let it correct the estimate:
        :func:`agentstream.context.limits.plausible_prompt_tokens`)."""
        reported = output.usage.prompt_tokens
        if reported is None or agent.model in self._usage_doubted:
            return
        endpoint = self.endpoints.get(agent.model)
        limits = agent.model_limits or (endpoint.limits if endpoint is not None else None)
        if limits is None:
            return
        chars = request_chars(request)
        if plausible_prompt_tokens(reported, chars, limits):
            return
        self._usage_doubted.add(agent.model)
        log.warning(
            "model endpoint %r reported %d prompt tokens for a request estimated at %d tokens (%d characters at %.1f a token): "
            "below %d%% of the estimate, so its counts are not used to correct the estimate (logged once per endpoint)",
            agent.model,
            reported,
            limits.tokens_of_chars(chars),
            chars,
            limits.characters_per_token,
            int(PLAUSIBLE_USAGE_RATIO * 100),
        )

    def _deltas(self, trace_id: str) -> RedisDeltaSink:
        """Where a model call of the trace publishes its reply's pieces (see agentstream.runtime.deltas)."""
        return RedisDeltaSink(self.redis, self.keys, trace_id, maxlen=self.delta_maxlen, ttl_s=self.delta_ttl_s)

    # --- publishing: replies and tool jobs, with the release --------------------------------

    async def _missing_replies(
        self, trace_id: str, fold: TraceFold
    ) -> list[tuple[TurnInput | None, TurnEnded | TurnFailed]]:
        """The endings folded whose reply did not go out (level-triggered: a worker that died
        between a turn's ending and its reply left it unsent). Endings this process wrote need
        no look-up; the others are checked with one HMGET of their reply markers."""
        own: list[str] = []
        others: list[str] = []
        for turn_id in fold.unconfirmed:
            (own if fold.notes.get(("ended", turn_id)) else others).append(turn_id)
        if others:
            sent = await operations.replies_sent(self.redis, self.keys, trace_id, others)
            for turn_id, marker in zip(others, sent, strict=True):
                if not marker:
                    own.append(turn_id)
                else:
                    fold.unconfirmed.pop(turn_id, None)
        out = []
        for turn_id in own:
            ending = fold.ending(turn_id)
            assert ending is not None
            out.append((fold.turn_input(turn_id), ending))
        return out

    async def _owed_replies(self, trace_id: str, fold: TraceFold, entries: list[Entry]) -> list[str]:
        """Add the missing replies to ``entries`` (with what their turns' ends tell other traces)
        → their markers (to be set once the XADDs ran)."""
        marks = []
        for turn, ending in await self._missing_replies(trace_id, fold):
            stop_reason = fold.final_stop_reason(ending.turn_id)
            reply = _reply_of_ending(trace_id, turn, ending, stop_reason)
            _log_ending(trace_id, ending, reply.stop_reason)
            stream = self._reply_stream(turn)
            with tracing.within(fold.notes.get(("context", ending.turn_id), {})):
                child = await self.children.turn_ended(entries, trace_id, turn, ending, events=fold.events)
            if not child:  # a child answers its parent instead
                entries.append((stream, {REPLY_FIELD: codec.encode(reply)}))
            marks.append(f"reply:{ending.turn_id}")
        return marks

    def _confirm(self, fold: TraceFold, marks: list[str]) -> None:
        for mark in marks:
            kind, _, rest = mark.partition(":")
            if kind == "reply":
                fold.unconfirmed.pop(rest, None)
                fold.notes.pop(("ended", rest), None)
                fold.notes.pop(("context", rest), None)

    async def _publish_replies(self, trace_id: str, fold: TraceFold) -> None:
        """Publish the missing replies now (a new turn's model call is about to start)."""
        entries: list[Entry] = []
        marks = await self._owed_replies(trace_id, fold, entries)
        if not marks:
            return
        await operations.publish_replies(self.redis, self.keys, trace_id, entries, marks)
        self._confirm(fold, marks)

    async def _release(self, trace_id: str, token: int, fold: TraceFold, jobs: list) -> str:
        """Publish what waits (missing replies, tool jobs) and give the lease back, in one round
        trip: the replies and jobs first, then the markers that say they went out, then the
        release (kept when a hint came meanwhile: ``"dirty"``)."""
        entries: list[Entry] = []
        marks = await self._owed_replies(trace_id, fold, entries) if fold.unconfirmed else []
        first = len(entries)  # the replies' entries come first; then the jobs
        for turn_id, step, step_jobs in jobs:  # their marker in the key hash: a step's jobs go out once
            entries.extend((stream, {field: payload}) for _call_id, stream, field, payload in step_jobs)
            marks.append(_jobs_marker(turn_id, step))
        # The fold is this process's, shared with the next task here that takes the lease; once
        # Redis has run the release, such a task (a cancel's or a wake-up's hint) may take the
        # lease before this one has the answer (on a cluster the pipeline also waits on the other
        # nodes), and must find what went out already noted, or it publishes it again: noted
        # first, and undone when the release failed.
        self._confirm(fold, marks)
        for turn_id, step, _step_jobs in jobs:
            fold.notes[("jobs", turn_id, step)] = True
        try:
            outcome, entry_ids = await self.store.publish_and_release(trace_id, token, entries, marks=marks)
        except BaseException:
            _unconfirm(fold, marks)
            raise
        ids = iter(entry_ids[first:])
        for turn_id, _step, step_jobs in jobs:
            # where each job went, for the watchdog of waiting turns
            sent = [(call_id, stream, next(ids)) for call_id, stream, _, _ in step_jobs]
            await record_jobs(self.redis, self.keys, trace_id, turn_id, sent)
        return outcome

    def _jobs(
        self, trace_id: str, fold: TraceFold, turn: TurnInput, agent, calls
    ) -> list[tuple[str, str, bytes, bytes]]:
        """The tool jobs of a step's calls: ``[(call id, stream, field, payload)]``."""
        offers = fold.offers_of(agent.name)  # an MCP tool's queue: as the agent's calls last offered it
        out = []
        for call in calls:
            tool = agent.tool(call.name)
            queue = tool.queue if tool is not None else (self.mcp.queue_of(agent, offers, call.name) or "default")
            job = ToolJob(
                trace_id=trace_id,
                turn_id=turn.turn_id,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                trace_context=tracing.inject(),  # the tool call's span is a child of this step's
            )
            stream, field = self.children.job_stream(
                tool, queue, trace_id
            )  # a delegation goes to the delegation service
            out.append((call.id, stream, field, codec.encode(job)))
        return out

    async def _ensure_reply(
        self,
        trace_id: str,
        turn: TurnInput | None,
        ending: TurnEnded | TurnFailed,
        fold: TraceFold | None = None,
        *,
        events=None,
    ) -> None:
        """Publish the turn's reply once: a marker in the trace's key hash records that it went out.

        The reply carries the stop reason of the turn's last model output when it was not a
        normal stop (from ``fold``, or ``events``: the trace; read here when neither is given).
        """
        marker = f"reply:{ending.turn_id}"
        if await self.store.has_key(trace_id, marker):
            return
        if events is not None:
            stop_reason = final_stop_reason(events, ending.turn_id)
            known = events  # what the ending tells other traces: no read
        else:
            if fold is None:
                fold = await self._current_fold(trace_id)
            stop_reason = fold.final_stop_reason(ending.turn_id)
            known = fold.events
        reply = _reply_of_ending(trace_id, turn, ending, stop_reason)
        _log_ending(trace_id, ending, reply.stop_reason)
        stream = self._reply_stream(turn)
        entries: list[Entry] = []
        if not await self.children.turn_ended(
            entries, trace_id, turn, ending, events=known
        ):  # a child answers its parent instead
            entries.append((stream, {REPLY_FIELD: codec.encode(reply)}))
        # raises if any write failed (WRONGTYPE on reply_to...): not marked, retried
        await operations.publish_turn_end(self.redis, self.keys, trace_id, ending.turn_id, entries)
        if fold is not None:
            self._confirm(fold, [marker])

    async def _ensure_reply_unheld(
        self, trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, fold: TraceFold
    ) -> None:
        """:meth:`_ensure_reply` for a handler that does not hold the trace's lease.

        The step loop publishes the replies its own endings owe without asking Redis first (it
        wrote them; nobody else publishes under its lease), so a reply published here outside the
        lease, between an ending and the holder's release, went out twice. The marker is read
        first (the common case: sent long ago); when it is missing the reply goes out under the
        lease, or, when the lease is held (its holder publishes the reply), this raises
        :class:`~agentstream.errors.Deferred` and the entry comes back once that lease would
        have expired.
        """
        if await self.store.has_key(trace_id, f"reply:{ending.turn_id}"):
            return
        async with self._lease(trace_id):
            await self._ensure_reply(trace_id, turn, ending, fold)

    def _reply_stream(self, turn: TurnInput | None) -> str:
        """Where a turn's reply goes: its ``reply_to`` when the wire's rules allow it (checked again
        here, for turns stored before a rule changed), else the default replies stream."""
        wanted = turn.reply_to if turn is not None else None
        if wanted and wire.reply_stream_refusal(wanted, self.keys, self.limits) is None:
            return wanted
        return self.keys.replies


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
            fold.notes.pop(("jobs", turn_id, int(step)), None)


def _turn_time_left_s(entries, turn_id: str, deadline_s: float | None) -> float | None:
    """Seconds left of a turn's deadline, from the time in its input's entry id → None without one."""
    if deadline_s is None:
        return None
    for entry_id, event in entries:
        if isinstance(event, TurnInput) and event.turn_id == turn_id:
            try:
                started_ms = int(entry_id.split("-", 1)[0])
            except ValueError:
                return None
            return started_ms / 1000.0 + deadline_s - time.time()
    return None


def _past_turn_deadline(turn: TurnInput, deadline_s: float | None, step: int) -> TurnFailed:
    return TurnFailed(
        turn_id=turn.turn_id,
        code=DEADLINE_CODE,
        reason=f"the turn ran past its deadline of {deadline_s:g} s (AGENTSTREAM_TURN_DEADLINE_S) at model call {step}; "
        "it was given up",
    )


def _jobs_marker(turn_id: str, step: int) -> str:
    """The key-hash marker that says the tool jobs of a step were published."""
    return f"jobs:{turn_id}:{step}"


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
    attributes = {
        "agentstream.decision": type(decision).__name__,
        "agentstream.trace_id": trace_id,
        "agentstream.turn_id": turn.turn_id,
        "agentstream.agent": turn.agent,
        "agentstream.step": getattr(decision, "step", None),
    }
    return tracing.span("agentstream.step", parent=turn.metadata, attributes=attributes)
