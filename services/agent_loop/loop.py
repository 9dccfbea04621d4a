"""The agent loop: turns in, the next step of a trace out.

A thin shell: it receives a hint (a turn or a wake-up), reads the trace, asks the shared
library what to do (:func:`agentstream.steps.decide`), does it, and repeats until the trace
waits on something (tool results) or has no turn left. It holds a trace's lease (with a
fencing token) while it works on it, so one trace takes one step at a time; it never holds a
worker while tools run: their results wake it.

A hint for a trace whose lease another worker holds marks the trace dirty (the holder looks
again before it lets go) and is deferred until the lease would expire, so the hint survives a
holder that dies. Cancels come on the cancel stream (see :mod:`agentstream.cancel`); the
busy-conversation policy (``queue``, ``reject``, ``interrupt``) decides what a turn published
on a busy conversation does. Dead-lettered hints end their turn with code ``dead_letter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from agentstream import codec, logs, metrics, tracing
from agentstream.app import App
from agentstream.compacting import failure_code
from agentstream.context import ContextCache
from agentstream.cancel import cancel_target, publish_cancel
from agentstream.errors import ContextError, Deferred, ModelError, StaleLeaseError, TurnRejected
from agentstream.events import (
    CancelMessage,
    CancelRequested,
    ModelOutput,
    Reply,
    TaskInput,
    ToolJob,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
    Wake,
)
from agentstream.keys import CANCEL_FIELD, REPLY_FIELD, TURN_FIELD, WAKE_FIELD, Keys
from agentstream.deltas import DEFAULT_MAXLEN, DEFAULT_TTL_S, RedisDeltaSink
from agentstream.models import ChatModel, endpoints_of
from agentstream.steps import (
    CallModel,
    CancelTurn,
    EndTurn,
    FailTurn,
    Idle,
    RecordResults,
    RunTools,
    active_turn,
    decide,
    final_stop_reason,
    unanswered_results,
)
from agentstream.store import TraceStore
from agentstream_services.agent_loop.children import Children
from agentstream_services.agent_loop.compactions import Compactions

log = logging.getLogger("agentstream.agent_loop")

BUSY_POLICIES = ("queue", "reject", "interrupt")
"""What a turn published on a busy conversation does: wait behind the running turn (default),
fail at once with code ``busy``, or cancel the running turn and then run."""

DEAD_LETTER_CODE = "dead_letter"


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
    ):
        if busy_policy not in BUSY_POLICIES:
            raise ValueError(f"busy_policy must be one of {BUSY_POLICIES}, got {busy_policy!r}")
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.models = models
        self.endpoints = endpoints_of(models)  # an agent without model_limits gets its endpoint's
        self.delta_maxlen = delta_maxlen
        self.delta_ttl_s = delta_ttl_s
        self.children = Children(app, store)
        self.compactions = Compactions(store)
        self.lease_ttl_ms = lease_ttl_ms
        self.contexts = ContextCache()  # folded traces: each step's rebuild costs what was added
        self.busy_policy = busy_policy
        self.trace_retention_s = trace_retention_s
        self._model_calls: dict[str, tuple[str, asyncio.Task]] = {}  # trace → (turn, model call)

    # --- hints ------------------------------------------------------------------------------

    async def on_turn(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A published turn: validate it, append it once, and advance its trace."""
        payload = fields.get(TURN_FIELD)
        try:
            if payload is None:
                raise TurnRejected(
                    f"entry {entry_id} of {self.keys.turns} has no field 'turn' "
                    f"(fields: {sorted(k.decode(errors='replace') for k in fields)})"
                )
            turn = codec.decode_turn(payload)
            if self.app.agent(turn.agent) is None:
                known = ", ".join(sorted(a.name for a in self.app.agents))
                raise TurnRejected(
                    f"turn {turn.turn_id!r} names agent {turn.agent!r}, which this app does not have (agents: {known})",
                    trace_id=turn.trace_id,
                    turn_id=turn.turn_id,
                )
        except TurnRejected as exc:  # without a `turn` field, the entry's fields show what arrived
            await self._reject(entry_id, payload if payload is not None else codec.fields_json(fields), exc)
            return
        if await self.store.has_key(turn.trace_id, f"end:{turn.turn_id}"):
            await self._reply_again(entry_id, turn)  # re-published (a backend lost the reply) or re-delivered
            return
        # which entry brought the turn: its own re-delivery is not a re-publish (see _reply_again)
        await self.redis.hsetnx(self.keys.trace_keys(turn.trace_id), f"entry:{turn.turn_id}", entry_id)
        if self.busy_policy != "queue" and not await self._admit(turn):
            return
        appended = await self.store.append(
            turn.trace_id,
            TurnInput(turn_id=turn.turn_id, agent=turn.agent, text=turn.text, metadata=turn.metadata, reply_to=turn.reply_to),
        )
        if appended.created:
            metrics.TURNS_STARTED.labels(agent=turn.agent).inc()
            if self.trace_retention_s:
                await self.store.keep_for(turn.trace_id, self.trace_retention_s)
        await self.advance(turn.trace_id)

    async def _reply_again(self, entry_id: str, message: TurnMessage) -> None:
        """Publish the reply of a turn that already ended again: the same reply, to where the turn
        first asked for it (its stored ``reply_to``; for a turn rejected before it entered the
        trace, this message's). Replies are at-least-once: a backend dedupes by turn id.

        The re-delivery of the entry that brought the turn (its worker died after the turn ended)
        only makes sure the reply went out once, as the turn's own ending does.
        """
        events = [e for _, e in await self.store.read(message.trace_id)]
        ending = next((e for e in events if isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == message.turn_id), None)
        if ending is None:  # the key hash says ended but the events do not: nothing to repeat
            return
        original = next((e for e in events if isinstance(e, TurnInput) and e.turn_id == message.turn_id), None)
        turn = original or TurnInput(
            turn_id=message.turn_id, agent=message.agent, text=message.text, metadata=message.metadata, reply_to=message.reply_to
        )
        first = await self.redis.hget(self.keys.trace_keys(message.trace_id), f"entry:{message.turn_id}")
        if first is not None and first.decode() == entry_id:
            await self._ensure_reply(message.trace_id, turn, ending, events)
            return
        if isinstance(original, TaskInput):
            log.info("turn %s of trace %s is a delegated task that ended; its parent has its result", message.turn_id, message.trace_id)
            return
        reply = _reply_of_ending(message.trace_id, turn, ending, events)
        stream = turn.reply_to or self.keys.replies
        log.info("turn %s of trace %s ended before; publishing its reply again to %s", message.turn_id, message.trace_id, stream)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(stream, {REPLY_FIELD: codec.encode(reply)})
        pipe.hset(self.keys.trace_keys(message.trace_id), f"reply:{ending.turn_id}", b"1")
        await pipe.execute()

    async def _admit(self, turn) -> bool:
        """Apply the reject or interrupt policy to a new turn → whether it enters the trace."""
        if await self.store.has_key(turn.trace_id, f"turn:{turn.turn_id}"):
            return True  # entered before (a re-delivery)
        events = [e for _, e in await self.store.read(turn.trace_id)]
        ending = next((e for e in events if isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == turn.turn_id), None)
        routing = TurnInput(turn_id=turn.turn_id, agent=turn.agent, text=turn.text, metadata=turn.metadata, reply_to=turn.reply_to)
        if ending is not None:  # rejected before (a re-delivery)
            await self._ensure_reply(turn.trace_id, routing, ending)
            return False
        running = active_turn(events)
        if running is None:
            return True
        if self.busy_policy == "reject":
            failed = TurnFailed(
                turn_id=turn.turn_id,
                code="busy",
                reason=f"conversation {turn.trace_id!r} is busy with turn {running.turn_id!r}; this turn was rejected "
                "(busy policy 'reject'): publish it again once that turn has ended",
            )
            await self.store.append(turn.trace_id, failed)
            metrics.TURNS_FAILED.labels(agent=turn.agent, code="busy").inc()
            await self._ensure_reply(turn.trace_id, routing, failed)
            return False
        message = CancelMessage(
            trace_id=turn.trace_id, turn_id=running.turn_id, by="interrupt", reason=f"interrupted by turn {turn.turn_id}"
        )
        await self.store.append(turn.trace_id, CancelRequested(turn_id=running.turn_id, by=message.by, reason=message.reason))
        await publish_cancel(self.redis, self.keys, message)  # every process: abort the running step now
        self._abort_local(turn.trace_id, running.turn_id)
        return True

    async def on_wake(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A wake-up: something was appended to a trace; advance it."""
        payload = fields.get(WAKE_FIELD)
        try:
            wake = codec.decode_wake(codec.entry_field(fields, WAKE_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed wake-up %s: %s", entry_id, exc)
            shown = payload if payload is not None else codec.fields_json(fields)
            await self.redis.xadd(self.keys.errors, {b"error": f"malformed wake-up {entry_id}: {exc}".encode(), b"payload": shown})
            return
        await self.advance(wake.trace_id)

    async def on_cancel(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A cancel request (the agent loop's group on the cancel stream): record it, then advance."""
        payload = fields.get(CANCEL_FIELD)
        try:
            message = codec.decode_cancel(codec.entry_field(fields, CANCEL_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed cancel %s: %s", entry_id, exc)
            shown = payload if payload is not None else codec.fields_json(fields)
            await self.redis.xadd(self.keys.errors, {b"error": f"malformed cancel {entry_id}: {exc}".encode(), b"payload": shown})
            return
        recorded = await self.request_cancel(message)
        if recorded is not None:
            self._abort_local(message.trace_id, recorded.turn_id)
            await self.advance(message.trace_id)

    async def request_cancel(self, message: CancelMessage) -> CancelRequested | None:
        """Write the cancel into the trace (once) → the event, or None when no turn is left to cancel.

        A cancel names a turn of the trace that has not ended (or, without a turn id, the running
        one); one for a turn id the trace does not hold, or that ended, records nothing
        (:func:`agentstream.cancel.cancel_target`).
        """
        events = [e for _, e in await self.store.read(message.trace_id)]
        target = cancel_target(events, message.turn_id)
        if target.turn_id is None:
            log.info("cancel for trace %s: %s; nothing recorded", message.trace_id, target.reason)
            return None
        event = CancelRequested(turn_id=target.turn_id, by=message.by, reason=message.reason)
        await self.store.append(message.trace_id, event)
        return event

    async def on_cancel_broadcast(self, message: CancelMessage) -> None:
        """A cancel heard by this process: abort its in-flight model call for the turn, if any."""
        held = self._model_calls.get(message.trace_id)
        if held is None:
            return
        turn_id, _task = held
        if message.turn_id and message.turn_id != turn_id:
            return
        # The truth first: the aborted step reads the trace again and must find the cancel.
        await self.store.append(message.trace_id, CancelRequested(turn_id=turn_id, by=message.by, reason=message.reason))
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
            turn = codec.decode_turn(fields.get(TURN_FIELD) or b"")
        except TurnRejected:
            return  # nothing to fail: the dead-letter stream keeps it
        routing = TurnInput(turn_id=turn.turn_id, agent=turn.agent, text=turn.text, metadata=turn.metadata, reply_to=turn.reply_to)
        await self._dead_end(turn.trace_id, routing, f"turn entry {entry_id} of {self.keys.turns}", error)

    async def on_dead_wake(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A wake-up that kept failing: the trace's running turn fails with code ``dead_letter``."""
        try:
            wake = codec.decode_wake(fields.get(WAKE_FIELD) or b"")
        except msgspec.DecodeError:
            return
        events = [e for _, e in await self.store.read(wake.trace_id)]
        running = active_turn(events)
        if running is not None:
            await self._dead_end(wake.trace_id, running, f"wake-up {entry_id} of {self.keys.wake}", error, events)

    async def _dead_end(self, trace_id: str, turn: TurnInput, what: str, error: str, events=None) -> None:
        """End ``turn`` with code ``dead_letter``; its calls still without a result get an error
        result first (in the same atomic append), so none is left dangling."""
        if events is None:
            events = [e for _, e in await self.store.read(trace_id)]
        failed = TurnFailed(
            turn_id=turn.turn_id,
            code=DEAD_LETTER_CODE,
            reason=f"the {what} failed on every delivery and was moved to its dead-letter stream "
            f"(last error: {error}); the turn was given up",
        )
        unanswered = unanswered_results(
            events, turn, DEAD_LETTER_CODE, "Error: the turn was given up before this call returned a result; "
            "it may have partly run."
        )
        *_, appended = await self.store.append_many(trace_id, [*unanswered, failed])
        if appended.created:
            metrics.TURNS_FAILED.labels(agent=turn.agent, code=DEAD_LETTER_CODE).inc()
        await self._ensure_reply(trace_id, turn, failed)
        # a turn queued behind this one goes on
        await self.redis.xadd(self.keys.wake, {WAKE_FIELD: codec.encode(Wake(trace_id=trace_id, reason="dead_letter"))})

    async def _reject(self, entry_id: str, payload: bytes | None, exc: TurnRejected) -> None:
        log.warning("rejected turn entry %s: %s", entry_id, exc.reason)
        metrics.TURNS_REJECTED.inc()
        if exc.trace_id and exc.turn_id:
            failed = TurnFailed(turn_id=exc.turn_id, code="bad_turn", reason=exc.reason)
            await self.store.append(exc.trace_id, failed)
            await self._ensure_reply(exc.trace_id, None, failed)
            return
        await self.redis.xadd(
            self.keys.errors,
            {b"error": exc.reason.encode(), b"source": self.keys.turns.encode(), b"entry": entry_id.encode(), b"payload": payload or b""},
        )

    # --- the step loop ----------------------------------------------------------------------

    async def advance(self, trace_id: str) -> None:
        """Take the trace's steps until it waits on tools or has no turn left.

        When another worker holds the trace, mark it dirty and return: the holder looks again
        before it lets go.
        """
        with logs.bind(trace_id=trace_id):
            await self._advance(trace_id)

    async def _advance(self, trace_id: str) -> None:
        await self.store.mark_dirty(trace_id, ttl_ms=self.lease_ttl_ms * 4)
        token = await self.store.acquire_lease(trace_id, ttl_ms=self.lease_ttl_ms)
        if token is None:
            # The holder sees the dirty mark when it lets go; if it dies instead, this hint
            # comes back when its lease would have expired and takes the trace over.
            left_ms = await self.redis.pttl(self.keys.lease(trace_id))
            delay_s = min(max(left_ms, 0), self.lease_ttl_ms) / 1000.0 + 0.05
            raise Deferred(delay_s, f"trace {trace_id} is held by another worker")
        renewer = asyncio.create_task(self._renew(trace_id, token))
        try:
            while True:
                progressed = await self._step(trace_id, token)
                if progressed:
                    continue
                outcome = await self.store.release_lease(trace_id, token)
                if outcome != "dirty":
                    return
        except StaleLeaseError:
            log.warning("lost the lease of trace %s mid-step; the new holder goes on", trace_id)
        except BaseException:
            # shielded: a stopping worker gives the trace back even if it is cancelled again
            await asyncio.shield(self.store.release_lease(trace_id, token, keep_if_dirty=False))
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _renew(self, trace_id: str, token: int) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_ms / 3000.0)
            if not await self.store.renew_lease(trace_id, token, ttl_ms=self.lease_ttl_ms):
                log.warning("could not renew the lease of trace %s", trace_id)
                return

    async def _step(self, trace_id: str, token: int) -> bool:
        """One decision and its effect → True when the trace moved and should be looked at again."""
        entries = await self.store.read(trace_id)
        events = [event for _, event in entries]
        decision = decide(events, self.app.agent, self.endpoints)
        turn = getattr(decision, "turn", None)
        # a child of the turn's trace context (OpenTelemetry); every line logged names the turn
        with _step_span(trace_id, decision), logs.bind(turn_id=turn.turn_id if turn is not None else None):
            return await self._act(trace_id, token, entries, events, decision)

    async def _act(self, trace_id: str, token: int, entries, events, decision) -> bool:
        """Carry out one decision → True when the trace moved and should be looked at again."""
        match decision:
            case Idle():
                await self._publish_missing_replies(trace_id, events)
                return False
            case CallModel(turn=turn, agent=agent, step=step):
                if step == 0:  # a turn starts: the turns before it have had their replies
                    await self._publish_missing_replies(trace_id, events)
                try:
                    built = self.contexts.build(trace_id, entries, agent, turn_id=turn.turn_id, step=step)
                    request = await self.compactions.request_for(trace_id, built, events, agent)
                except ContextError as exc:  # does not fit the window, the summary failed, or bad context settings
                    failed = TurnFailed(turn_id=turn.turn_id, code=failure_code(exc), reason=str(exc))
                    await self._end(trace_id, token, failed, turn)
                    return True
                if request is None:  # a summary is written first; its outcome wakes the trace
                    return False
                model = self.models.get(agent.model)
                if model is None:
                    failed = TurnFailed(
                        turn_id=turn.turn_id,
                        code="config",
                        reason=f"agent {agent.name!r} names model {agent.model!r}, which is not configured",
                    )
                    await self._end(trace_id, token, failed, turn)
                    return True
                try:
                    attributes = tracing.model_call_attributes(model, turn_id=turn.turn_id, step=step)
                    with metrics.MODEL_CALL_SECONDS.labels(model=agent.model).time(), tracing.span(
                        "agentstream.model_call", kind="client", attributes=attributes
                    ) as span:
                        output = await self._abortable(trace_id, turn.turn_id, model.complete(request, turn_id=turn.turn_id, step=step, deltas=self._deltas(trace_id)))
                        tracing.record_model_output(span, output)
                    if output is None:  # aborted by a cancel: the next step ends the turn
                        return True
                except ModelError as exc:
                    failed = TurnFailed(turn_id=turn.turn_id, code="model_error", reason=f"model call {step} failed: {exc}")
                    await self._end(trace_id, token, failed, turn)
                    return True
                metrics.record_usage(agent.model, output)
                await self.store.append(trace_id, output, fence=token)
                return True
            case RecordResults(results=results):
                await self.store.append_many(trace_id, list(results), fence=token)
                return True
            case RunTools(turn=turn, agent=agent, step=step, calls=calls):
                await self._publish_jobs(trace_id, turn, agent, step, calls)
                return False
            case EndTurn(turn=turn, answer=answer):
                await self._end(trace_id, token, TurnEnded(turn_id=turn.turn_id, answer=answer), turn)
                return True
            case FailTurn(turn=turn, code=code, reason=reason):
                await self._end(trace_id, token, TurnFailed(turn_id=turn.turn_id, code=code, reason=reason), turn)
                return True
            case CancelTurn(turn=turn, results=results, code=code, reason=reason):
                failed = TurnFailed(turn_id=turn.turn_id, code=code, reason=reason)
                await self._end(trace_id, token, failed, turn, before=results)
                return True
        raise AssertionError(f"unhandled decision {decision!r}")

    def _deltas(self, trace_id: str) -> RedisDeltaSink:
        """Where a model call of the trace publishes its reply's pieces (see agentstream.deltas)."""
        return RedisDeltaSink(self.redis, self.keys, trace_id, maxlen=self.delta_maxlen, ttl_s=self.delta_ttl_s)

    async def _publish_jobs(self, trace_id: str, turn: TurnInput, agent, step: int, calls) -> None:
        """Publish the tool jobs of a step once (a marker in the trace's key hash says so)."""
        marker = f"jobs:{turn.turn_id}:{step}"
        if await self.store.has_key(trace_id, marker):
            return
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            tool = agent.tool(call.name)
            queue = tool.queue if tool is not None else "default"
            job = ToolJob(
                trace_id=trace_id, turn_id=turn.turn_id, call_id=call.id, name=call.name, arguments=call.arguments,
                trace_context=tracing.inject(),  # the tool call's span is a child of this step's
            )
            stream, field = self.children.job_stream(tool, queue)  # a delegation goes to the delegation service
            pipe.xadd(stream, {field: codec.encode(job)})
        pipe.hset(self.keys.trace_keys(trace_id), marker, b"1")
        await pipe.execute()

    async def _end(self, trace_id: str, token: int, ending: TurnEnded | TurnFailed, turn: TurnInput, *, before=()) -> None:
        """Append ``before`` (results) and the turn's ending in one atomic append, then reply."""
        *_, appended = await self.store.append_many(trace_id, [*before, ending], fence=token)
        if appended.created:
            if isinstance(ending, TurnEnded):
                metrics.TURNS_ENDED.labels(agent=turn.agent).inc()
            elif ending.code == "cancelled":
                metrics.TURNS_CANCELLED.labels(agent=turn.agent).inc()
            else:
                metrics.TURNS_FAILED.labels(agent=turn.agent, code=ending.code).inc()
            if self.trace_retention_s:
                await self.store.keep_for(trace_id, self.trace_retention_s)
        await self._ensure_reply(trace_id, turn, ending)

    async def _publish_missing_replies(self, trace_id: str, events) -> None:
        """Publish the reply of every ended turn whose reply did not go out (level-triggered).

        A worker that dies between a turn's ending and its reply leaves the reply unsent while
        the trace goes on with its next turn; this runs when a turn starts and when the trace
        goes idle, with one HMGET of the reply markers.
        """
        endings = [e for e in events if isinstance(e, (TurnEnded, TurnFailed))]
        if not endings:
            return
        sent = await self.redis.hmget(self.keys.trace_keys(trace_id), [f"reply:{e.turn_id}" for e in endings])
        inputs = {e.turn_id: e for e in events if isinstance(e, TurnInput)}
        for ending, marker in zip(endings, sent, strict=True):
            if marker is None:
                await self._ensure_reply(trace_id, inputs.get(ending.turn_id), ending, events)

    async def _ensure_reply(self, trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, events=None) -> None:
        """Publish the turn's reply once: a marker in the trace's key hash records that it went out.

        The reply carries the stop reason of the turn's last model output when it was not a
        normal stop (``events``: the trace, read here when not given).
        """
        marker = f"reply:{ending.turn_id}"
        if await self.store.has_key(trace_id, marker):
            return
        if events is None:
            events = [e for _, e in await self.store.read(trace_id)]
        reply = _reply_of_ending(trace_id, turn, ending, events)
        _log_ending(trace_id, ending, reply.stop_reason)
        stream = (turn.reply_to if turn is not None else None) or self.keys.replies
        pipe = self.redis.pipeline(transaction=False)
        if not await self.children.turn_ended(pipe, trace_id, turn, ending):  # a child answers its parent instead
            pipe.xadd(stream, {REPLY_FIELD: codec.encode(reply)})
        pipe.hset(self.keys.trace_keys(trace_id), marker, b"1")
        await pipe.execute()


def _reply_of_ending(trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, events) -> Reply:
    """The reply of a turn's ending; it carries the stop reason of the turn's last model output
    when that was not a normal stop."""
    stop_reason = final_stop_reason(events, ending.turn_id)
    if isinstance(ending, TurnEnded):
        reply = Reply(trace_id=trace_id, turn_id=ending.turn_id, status="ended", answer=ending.answer, stop_reason=stop_reason)
    else:
        reply = Reply(trace_id=trace_id, turn_id=ending.turn_id, status="failed", code=ending.code, reason=ending.reason,
                      stop_reason=stop_reason)
    if turn is not None:
        reply.metadata = dict(turn.metadata)
    return reply


def _log_ending(trace_id: str, ending: TurnEnded | TurnFailed, stop_reason: str | None) -> None:
    """One line per turn ending (logged as its reply goes out): a WARNING for a failed turn."""
    with logs.bind(trace_id=trace_id, turn_id=ending.turn_id):
        stop = f" (last stop reason {stop_reason})" if stop_reason else ""
        if isinstance(ending, TurnEnded):
            log.info("turn %s of trace %s ended%s", ending.turn_id, trace_id, stop)
        elif ending.code == "cancelled":
            log.info("turn %s of trace %s was cancelled: %s", ending.turn_id, trace_id, ending.reason)
        else:
            log.warning("turn %s of trace %s failed: %s: %s%s", ending.turn_id, trace_id, ending.code, ending.reason, stop)


def _step_span(trace_id: str, decision):
    """The OpenTelemetry span of one step on a turn, a child of the context in the turn's
    metadata (``traceparent``); none for an idle trace (see :mod:`agentstream.tracing`)."""
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
