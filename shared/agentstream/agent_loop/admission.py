"""Turns in: a turn entry is read, checked, admitted into its trace once (in publish order), or refused
or rejected by the busy-conversation policy.

A part of :class:`agentstream.agent_loop.loop.AgentLoop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from agentstream.agent_loop._base import (
    REJECT_LEASE_WAIT_S,
    LoopState,
    _reply_of_ending,
    log,
)
from agentstream.delegation import child_trace_refusal, parent_ids
from agentstream.errors import (
    TurnRejected,
)
from agentstream.ops import logs, metrics
from agentstream.runtime import conversations, operations
from agentstream.runtime.cancel import publish_cancel
from agentstream.runtime.connection import LOST_REDIS_ERRORS, REDIS_ERROR
from agentstream.runtime.consumer import current_delivery
from agentstream.runtime.reports import report_error
from agentstream.runtime.store import Admitted
from agentstream.runtime.turn_order import MOST_PENDING
from agentstream.steps import turn_order
from agentstream.steps.machine import RejectTurn, on_busy, queue_full_refusal
from agentstream.steps.trace_fold import TraceFold
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.backends import TurnScope, turn_scope
from agentstream.wire.entries import doubled_fields
from agentstream.wire.events import (
    CancelMessage,
    Reply,
    TaskInput,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import TURN_FIELD

_REDIS_DOWN = (*LOST_REDIS_ERRORS, OSError)  # Redis, not the entry, failed (as the consumer says)

SETTLED_KEPT = 4096
"""Turn entries per stream whose admission a process remembers deciding (:meth:`Admission._settle`)."""


@dataclass(frozen=True)
class _Checked:
    """An earlier turn entry that passed the rules (:meth:`Admission._enter_earlier`)."""

    turn: TurnMessage
    routing: TurnInput
    payload: bytes | None

    @property
    def trace_id(self) -> str:
        return self.turn.trace_id

    @property
    def turn_id(self) -> str:
        return self.turn.turn_id


class Admission(LoopState):
    """Turns in."""

    async def on_turn(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A published turn: validate it, append it once, and advance its trace.

        ``stream``: the partition of the turns stream the entry came from (what a report names;
        default ``<ns>:turns``). Read by a consumer, the entry enters after the turns of its trace
        published before it on that stream that are not admitted yet, whatever process read them
        (:meth:`_enter_earlier`)."""
        payload = fields.get(TURN_FIELD)
        where = stream or self.keys.turns
        try:
            turn, routing, scope = self._checked(entry_id, fields, stream)
        except TurnRejected as exc:  # without a `turn` field, the entry's fields show what arrived
            shown = payload if payload is not None and not doubled_fields(fields) else codec.fields_json(fields)
            await self._reject(entry_id, shown, exc, stream=stream)
            return
        if routing is None:  # another backend's conversation or replies: nothing touched
            await self._refuse_foreign(entry_id, where, payload, turn.trace_id, turn.turn_id, turn.metadata, scope)
            return
        trace_id = turn.trace_id
        if "/" in trace_id and await self._refused_as_child(entry_id, where, payload, trace_id, turn.turn_id):
            log.warning("rejected turn entry %s: it names a child trace's id", entry_id)
            metrics.TURNS_REJECTED.inc()
            return
        with logs.bind(trace_id=trace_id):
            # turns of one trace enter it in the order this process started them (the order read):
            # concurrent admissions would race on separate connections (see _admission_order); the
            # earlier ones other processes read enter first (see _enter_earlier)
            async with self._admission_order(trace_id):
                await self._enter_earlier(entry_id, trace_id)
                entered = await self._enter(entry_id, where, turn, routing, payload, lead=True)
            if entered is None:
                return
            admitted, fold = entered
            if admitted.created:
                await self._started(turn, fold)
            if admitted.ended:  # re-published (a backend lost the reply), re-delivered, or a copy seen while it ran
                await self._reply_again(entry_id, turn, admitted.first_entry, absorbed=admitted.absorbed)
                return
            assert admitted.taken is not None
            await self._advance_taken(trace_id, entry_id, admitted.taken, fold)

    def _checked(
        self, entry_id: str, fields: Mapping[bytes, bytes], stream: str | None
    ) -> tuple[TurnMessage, TurnInput | None, TurnScope]:
        """The wire's rules (size, depth, schema, ids, metadata, reply stream, agent, each field
        once) and the agent's (its input type, its settings for the turn, the tool states asked)
        for a turn entry read from ``stream`` → ``(turn, its input, its scope)``; the input is
        None when the scope refuses the turn (another backend's conversation or replies).

        Raises:
            TurnRejected: the entry breaks one of those rules.
        """
        payload = fields.get(TURN_FIELD)
        where = stream or self.keys.turns
        doubled = wire.doubled_turn_refusal(fields, f"entry {entry_id} of {where}", keys=self.keys, limits=self.limits)
        if doubled is not None:  # a field given twice: which value counts is unknown, none is read
            raise doubled
        if payload is None:
            raise TurnRejected(
                f"entry {entry_id} of {where} has no field 'turn' "
                f"(fields: {sorted(k.decode(errors='replace') for k in fields)})"
            )
        turn = wire.validate_turn(payload, keys=self.keys, limits=self.limits, agents=(a.name for a in self.app.agents))
        scope = self._scope(stream, turn.trace_id, turn.reply_to)
        if scope.refusal is not None:
            return turn, None, scope
        if scope.reply_to != turn.reply_to:  # a backend's turn without reply_to: its own stream
            turn = msgspec.structs.replace(turn, reply_to=scope.reply_to)
        return turn, self.app.turn_input(turn), scope

    async def _enter(
        self,
        entry_id: str,
        where: str,
        turn: TurnMessage,
        routing: TurnInput,
        payload: bytes | None,
        *,
        lead: bool,
    ) -> tuple[Admitted, TraceFold | None] | None:
        """Admit turn entry ``entry_id`` (read from ``where``) into its trace once, under the trace's
        admission order: its busy policy, the queue's cap, the append. ``lead``: the entry this
        handler was given, whose admission takes the lease; else an earlier turn of the trace
        another process read (:meth:`_enter_earlier`), left to its own handler to answer when it
        ended before or was a copy.

        Returns:
            For ``lead``: ``(admitted, the trace's fold before it)`` when the turn is in the
            trace or ended before (``admitted.ended``), else None (refused, rejected by its busy
            policy, or answered). For an earlier turn: None.
        """
        trace_id = turn.trace_id
        if (turn.busy_policy or self.busy_policy) != "queue":
            ended, first, absorbed, differs = await self.store.turn_copy(trace_id, routing, entry_id)
            if ended:
                self._settle(where, entry_id)
                if lead:
                    if differs:
                        await self._report_conflict(entry_id, where, turn, first, payload)
                    await self._reply_again(entry_id, turn, first, absorbed=absorbed)
                return None
            # which entry brought the turn: its own re-delivery is not a re-publish (see _reply_again)
            await operations.note_turn_entry(self.redis, self.keys, trace_id, turn.turn_id, entry_id)
            entering = await self._admit(turn, routing)
            if entering is None:
                self._settle(where, entry_id)
                return None
            routing = entering
        if lead:
            self._take_back(trace_id, entry_id)
        fold = self.folds.get(trace_id)
        # one round trip: ended before? else append once, (for the lead) take the lease, read what is new
        admitted = await self.store.admit_turn(
            trace_id,
            routing,
            entry_id,
            take=lead,
            ttl_ms=self.lease_ttl_ms,
            after=fold.last_id if fold is not None else None,
            expire_ms=self._expire_ms,
            max_open=self.max_queued_turns,
        )
        self._settle(where, entry_id)
        if admitted.full is not None:  # the conversation's queue is full: refused, nothing appended
            await self._refuse_full(turn, routing, admitted.full)
            return None
        if admitted.differs:  # same ids, another body: absorbed all the same, and reported
            await self._report_conflict(entry_id, where, turn, admitted.first_entry, payload)
        if lead:
            return admitted, fold
        if admitted.created:  # (an ended one: its own handler answers it again)
            await self._started(turn, fold)
        return None

    async def _enter_earlier(self, entry_id: str, trace_id: str) -> None:
        """Admit, before entry ``entry_id``, the turns of ``trace_id`` published before it on the
        same stream that are not admitted yet (:mod:`agentstream.steps.turn_order`), whichever
        process read them: a conversation's turns enter in publish order with any number of
        agent loops. Called under the trace's admission order, by the handler of the entry (a
        direct call, outside a consumer, orders nothing).

        Cost: one round trip (the group's pending entries before it whose payload may name the
        trace), and one admission per earlier turn that this process has not settled itself.
        An earlier entry the rules refuse is left to its own handler (which refuses it)."""
        delivery = current_delivery()
        if delivery is None or delivery.entry_id != entry_id:
            return
        stream = delivery.stream
        try:
            pending = await self._earlier.read(
                stream, delivery.group, entry_id, turn_order.trace_marks(trace_id), field=TURN_FIELD
            )
        except _REDIS_DOWN:
            raise  # the handler runs again (the consumer's retry), still before the turn enters
        except REDIS_ERROR as exc:  # Redis refused the read: the turn enters, unordered, not held up
            log.warning(
                "could not read the turns pending before entry %s of %s (%s): not ordered", entry_id, stream, exc
            )
            return
        if not pending.whole:
            log.warning(
                "more than %d entries of %s are pending before turn entry %s: the turns of trace %s among the "
                "later ones may enter after it",
                MOST_PENDING,
                stream,
                entry_id,
                trace_id,
            )

        def check(other_id: str, fields: Mapping[bytes, bytes]) -> _Checked | None:
            try:
                turn, routing, _ = self._checked(other_id, fields, stream)
            except TurnRejected:
                return None
            except Exception:  # the rules crashed on it: its own handler fails on it and retries it
                log.exception("could not check turn entry %s of %s before entry %s", other_id, stream, entry_id)
                return None
            return None if routing is None else _Checked(turn, routing, fields.get(TURN_FIELD))

        settled = self._settled.get(stream, {})
        for earlier in turn_order.earlier_turns(
            trace_id, entry_id, pending.entries, field=TURN_FIELD, settled=settled, check=check
        ):
            log.info(
                "turn entry %s of %s (turn %s) was published before entry %s of its trace: it enters first",
                earlier.entry_id,
                stream,
                earlier.turn.turn_id,
                entry_id,
            )
            checked = earlier.turn
            try:
                await self._enter(earlier.entry_id, stream, checked.turn, checked.routing, checked.payload, lead=False)
            except _REDIS_DOWN:
                raise
            except Exception:  # its own handler fails on it and retries it: no reason to hold this turn up
                log.exception(
                    "could not admit turn entry %s of %s before entry %s: left to its own handler",
                    earlier.entry_id,
                    stream,
                    entry_id,
                )

    async def _started(self, turn: TurnMessage, fold: TraceFold | None) -> None:
        """A turn entered its trace now: counted, and the trace noted in the gateway's list."""
        metrics.TURNS_STARTED.labels(agent=turn.agent).inc()
        await self._note_turn(turn.trace_id, fold)

    def _settle(self, stream: str, entry_id: str) -> None:
        """Note that this process decided the admission of entry ``entry_id`` of ``stream``: a
        later turn need not admit it again (:meth:`_enter_earlier`). The newest
        :data:`SETTLED_KEPT` per stream are kept."""
        settled = self._settled.setdefault(stream, {})
        settled[entry_id] = None
        if len(settled) > SETTLED_KEPT:
            del settled[next(iter(settled))]

    def _scope(self, stream: str | None, trace_id: str | None, reply_to: str | None) -> TurnScope:
        """What a turn read from ``stream`` may touch (:func:`agentstream.wire.backends.turn_scope`):
        a configured backend's turns stream confines it to that backend's conversations."""
        return turn_scope(self.keys.backend_of_stream(stream), self.keys.replies, trace_id, reply_to)

    async def _refuse_foreign(
        self,
        entry_id: str,
        where: str,
        payload: bytes | None,
        trace_id: str | None,
        turn_id: str | None,
        metadata: dict[str, str],
        scope: TurnScope,
    ) -> None:
        """Refuse a backend's turn that names another backend's conversation or replies stream
        (code ``forbidden``): reported on the errors stream, and, when it names its trace and turn,
        answered on the sender's own replies stream. Nothing is written to the trace it named."""
        assert scope.refusal is not None
        error = f"entry {entry_id} of {where}: {scope.refusal}"
        log.warning("refused turn entry %s: %s", entry_id, scope.refusal)
        metrics.TURNS_REJECTED.inc()
        await self._report(error, payload, source=where, entry=entry_id, trace_id=trace_id or "", turn_id=turn_id or "")
        if trace_id and turn_id and scope.reply_to:
            reply = Reply(
                trace_id=trace_id,
                turn_id=turn_id,
                status="failed",
                code=FailureCode.FORBIDDEN,
                reason=scope.refusal,
                metadata=metadata,
            )
            await operations.send_refusal(self.redis, scope.reply_to, reply)

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
        across the admission keeps the order of one process; across several agent-loop
        processes, :meth:`_enter_earlier` (run under it) admits first the earlier turns another
        process read.
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

    async def _refuse_full(self, turn: TurnMessage, routing: TurnInput, open_turns: int) -> None:
        """Fail a new turn at once (code ``busy``) because its conversation holds ``open_turns``
        turns admitted and not ended, the most it may queue (:func:`queue_full_refusal`).

        As the ``reject`` policy does: the reply first, marked sent, then the ending, unfenced
        (the conversation's running turn may hold the lease; its step loop publishes only the
        replies not marked)."""
        failed = queue_full_refusal(turn.trace_id, turn.turn_id, open_turns, self.max_queued_turns)
        if failed is None:  # the script and the rule disagree: a bug, never a silent admission
            raise RuntimeError(
                f"turn {turn.turn_id!r} of trace {turn.trace_id!r} was refused as over the queue's cap with "
                f"{open_turns} open turns, under the cap {self.max_queued_turns}"
            )
        log.warning("refused turn %s: %s", turn.turn_id, failed.reason)
        await self._ensure_reply(turn.trace_id, routing, failed)
        await self.store.append(turn.trace_id, failed)
        metrics.TURNS_FAILED.labels(agent=turn.agent, code=FailureCode.BUSY).inc()

    async def _admit(self, turn: TurnMessage, routing: TurnInput) -> TurnInput | None:
        """Apply the turn's busy policy (its own, else the process's; :func:`on_busy`) → the turn
        input to append (naming the turn it rolls back, for ``rollback``), or None when it does not
        enter the trace (rejected now, or before)."""
        if await self.store.has_key(turn.trace_id, f"turn:{turn.turn_id}"):
            return routing  # entered before (a re-delivery)
        fold = await self._current_fold(turn.trace_id)
        ending = fold.ending(turn.turn_id)
        if ending is not None:  # rejected before (a re-delivery)
            await self._ensure_reply_unheld(turn.trace_id, routing, ending, fold)
            return None
        running = fold.active_turn()
        decided = on_busy(
            turn.trace_id, turn.turn_id, turn.busy_policy, self.busy_policy, running.turn_id if running else None
        )
        if isinstance(decided, RejectTurn):
            # the reply first, marked sent, then the ending: the running turn holds the lease (so
            # this does not wait for it) and its step loop publishes the replies its fold owes, so
            # an ending appended before its reply was marked could be answered twice. A crash in
            # between leaves the entry pending: its re-delivery appends the ending, the reply
            # already marked.
            await self._ensure_reply(turn.trace_id, routing, decided.failed)
            await self.store.append(turn.trace_id, decided.failed)
            metrics.TURNS_FAILED.labels(agent=turn.agent, code=FailureCode.BUSY).inc()
            return None
        cancel = decided.cancel
        if cancel is not None:
            await self.store.append(turn.trace_id, cancel)
            message = CancelMessage(trace_id=turn.trace_id, turn_id=cancel.turn_id, by=cancel.by, reason=cancel.reason)
            await publish_cancel(self.redis, self.keys, message)  # every process: abort the running step now
            self._abort_local(turn.trace_id, cancel.turn_id)
        if decided.rolls_back is not None:
            return msgspec.structs.replace(routing, rolls_back=decided.rolls_back)
        return routing

    async def _reject(
        self, entry_id: str, payload: bytes | None, exc: TurnRejected, *, stream: str | None = None
    ) -> None:
        """A turn that breaks a rule of the wire: with its ids, it fails ``bad_turn`` in its trace and
        gets a failed reply (to its ``reply_to`` when that passed the check, with its metadata);
        without them, or when its turn id is an accepted turn's, it goes to the errors stream."""
        scope = self._scope(stream, exc.trace_id, exc.reply_to)
        if scope.refusal is not None:  # its failure would go into another backend's trace or replies
            where = stream or self.keys.turns
            await self._refuse_foreign(
                entry_id, where, payload, exc.trace_id, exc.turn_id, exc.metadata, self._both(scope, exc.reason)
            )
            return
        exc.reply_to = scope.reply_to  # a backend's refused turn is answered on its own stream
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
                await self._enter_earlier(entry_id, exc.trace_id)  # its failure goes after them
                await self._reject_turn(entry_id, payload, exc, stream=stream)
            return
        source = stream or (self.keys.turns_for(exc.trace_id) if exc.trace_id else self.keys.turns)
        await self._report(exc.reason, payload, source=source, entry=entry_id)

    @staticmethod
    def _both(scope: TurnScope, reason: str) -> TurnScope:
        """``scope``'s refusal, and the wire's own reason the turn was refused."""
        return TurnScope(f"{scope.refusal}; also, {reason}", scope.reply_to)

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
