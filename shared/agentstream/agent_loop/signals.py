"""Wake-ups, cancels and dead letters: hints that end or stop a turn, and the endings the watchdog asks
for.

A part of :class:`agentstream.agent_loop.loop.AgentLoop`.
"""

from __future__ import annotations

import asyncio

import msgspec

from agentstream.agent_loop._base import (
    DEAD_LETTER_CODE,
    LoopState,
    log,
)
from agentstream.errors import (
    Deferred,
)
from agentstream.ops import metrics
from agentstream.runtime import operations
from agentstream.runtime.cancel import CancelTarget, cancel_target
from agentstream.runtime.salvage import readable_events
from agentstream.runtime.watchdog import LOST_WORK_CODE
from agentstream.steps.approvals import AlreadyDecided, Refused, decide_message
from agentstream.steps.decision import (
    active_turn,
    unanswered_results,
)
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.backends import confined_approval, confined_cancel, turn_scope
from agentstream.wire.events import (
    ApprovalDecided,
    ApprovalMessage,
    CancelMessage,
    CancelRequested,
    ModelOutput,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import APPROVAL_FIELD, CANCEL_FIELD, TURN_FIELD, WAKE_FIELD


class Signals(LoopState):
    """Wake-ups, cancels and dead letters."""

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

    async def on_cancel(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A cancel request (the agent loop's group on a cancel stream: ``stream``, default the
        shared ``<ns>:cancel``): record it, then advance. A backend's cancel stream may cancel only
        that backend's conversations, and names it as the cancel's ``by``
        (:func:`agentstream.wire.backends.confined_cancel`)."""
        where = stream or self.keys.cancel
        try:
            message = wire.validate_cancel(codec.entry_field(fields, CANCEL_FIELD), self.limits)
        except msgspec.DecodeError as exc:
            log.error("dropping malformed cancel %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, CANCEL_FIELD)
            await self._report(f"malformed cancel {entry_id}: {exc}", shown, source=where, entry=entry_id)
            return
        confined, refusal = confined_cancel(self.keys.backend_of_stream(stream), message)
        if confined is None:  # another backend's conversation: nothing read or written there
            error = f"cancel {entry_id} of {where} refused ({FailureCode.FORBIDDEN}): {refusal}"
            log.warning("%s", error)
            await self._report(error, codec.entry_shown(fields, CANCEL_FIELD), source=where, entry=entry_id)
            return
        message = confined
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
            error = f"cancel {entry_id} of {where} cancelled nothing: {why}"
            log.warning("%s", error)
            await self._report(
                error,
                codec.entry_shown(fields, CANCEL_FIELD),
                source=where,
                entry=entry_id,
                trace_id=message.trace_id,
                turn_id=message.turn_id,
            )

    async def on_approval(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """An approval or a denial (the agent loop's group on the approvals stream): record it
        once per call, then advance the trace. One that cannot be read, or decides nothing (no
        such call awaiting approval, its turn ended, arguments the tool does not let a person
        edit or that do not match its schema), is reported on the errors stream; a second one for
        a decided call changes nothing and is not reported (the first decision stands). A
        backend's approvals stream (``stream``; default the shared ``<ns>:approvals``) may decide
        only that backend's conversations' calls, under its name
        (:func:`agentstream.wire.backends.confined_approval`)."""
        source = stream or self.keys.approvals
        try:
            message = wire.validate_approval(codec.entry_field(fields, APPROVAL_FIELD), self.limits)
        except msgspec.DecodeError as exc:
            log.error("dropping malformed approval %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, APPROVAL_FIELD)
            await self._report(f"malformed approval {entry_id}: {exc}", shown, source=source, entry=entry_id)
            return
        confined, refusal = confined_approval(self.keys.backend_of_stream(stream), message)
        if confined is None:  # another backend's conversation: nothing read or written there
            error = f"approval {entry_id} of {source} refused ({FailureCode.FORBIDDEN}): {refusal}"
            log.warning("%s", error)
            await self._report(error, codec.entry_shown(fields, APPROVAL_FIELD), source=source, entry=entry_id)
            return
        message = confined
        outcome = await self.record_approval(message, by=message.by)
        if isinstance(outcome, Refused):
            error = f"approval {entry_id} of {source} decided nothing: {outcome.reason}"
            log.warning("%s", error)
            await self._report(
                error,
                codec.entry_shown(fields, APPROVAL_FIELD),
                source=source,
                entry=entry_id,
                trace_id=message.trace_id,
            )
            return
        await self.advance(message.trace_id, entry_id=entry_id)

    async def record_approval(self, message: ApprovalMessage, *, by: str) -> ApprovalDecided | AlreadyDecided | Refused:
        """Append the decision of ``message`` to its trace once per call (``by``: who decides, as
        the transport knows them) → the decision appended, the earlier one that stands, or why it
        decides nothing (:func:`agentstream.steps.approvals.decide_message`). Needs no lease: the
        append is once by call id, and a denial by timeout races it under the same key."""
        fold = await self._current_fold(message.trace_id)
        awaited, decided, turn_open = fold.approval_of(message.call_id)
        outcome = decide_message(message, awaited=awaited, decided=decided, turn_open=turn_open, by=by)
        if isinstance(outcome, ApprovalDecided):
            appended = await self.store.append(message.trace_id, outcome)
            if appended.created:
                log.info(
                    "trace %s: call %s %s by %r",
                    message.trace_id,
                    message.call_id,
                    "approved" if outcome.approved else "denied",
                    by,
                )
            else:  # another decision came first (a timeout, a twin message): it stands
                fold = await self._current_fold(message.trace_id)
                _, first, _ = fold.approval_of(message.call_id)
                return AlreadyDecided(first or outcome)
        return outcome

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
            return await task  # a cancel of this handler cancels the call too
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                return None  # the call was aborted (_abort_local), not this handler
            raise
        finally:
            self._model_calls.pop(trace_id, None)
            if not task.done():
                task.cancel()

    async def on_dead_turn(
        self, entry_id: str, fields: dict[bytes, bytes], error: str, *, stream: str | None = None
    ) -> None:
        """A turn entry that kept failing: its turn fails with code ``dead_letter`` (not when it came
        on a backend's ``stream`` and names what that backend may not touch)."""
        try:
            turn = wire.validate_turn(fields.get(TURN_FIELD) or b"", keys=self.keys, limits=self.limits)
        except Exception:  # any bytes: nothing to fail, the dead-letter stream keeps the entry
            return
        backend = self.keys.backend_of_stream(stream)
        scope = turn_scope(backend, self.keys.replies, turn.trace_id, turn.reply_to)
        if scope.refusal is not None:  # the dead-letter stream keeps it; no other backend's trace is touched
            return
        routing = TurnInput(
            turn_id=turn.turn_id,
            agent=turn.agent,
            text=turn.text or "",
            metadata=turn.metadata,
            reply_to=scope.reply_to,
        )
        where = self.keys.backend_turns_for(backend, turn.trace_id) if backend else self.keys.turns_for(turn.trace_id)
        await self._dead_end(turn.trace_id, routing, f"turn entry {entry_id} of {where}", error)

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
