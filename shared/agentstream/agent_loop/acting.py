"""One step: carry out the decision of the fold (:mod:`agentstream.steps.decision`,
:mod:`agentstream.steps.machine`) and apply its effects in one operation.

A part of :class:`agentstream.agent_loop.loop.AgentLoop`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from agentstream.agent_loop._base import (
    LoopState,
    _log_ending,
    _Outcome,
    _reply_of_ending,
    _step_span,
    log,
)
from agentstream.context.builder import request_after_miss
from agentstream.context.limits import PLAUSIBLE_USAGE_RATIO, WINDOW_MISS, plausible_prompt_tokens, request_chars
from agentstream.context.request import ChatRequest
from agentstream.declarations.agents import Agent
from agentstream.errors import (
    ContextError,
    ContextWindowExceeded,
    ModelError,
)
from agentstream.models import ChatModel
from agentstream.ops import metrics, tracing
from agentstream.runtime import operations
from agentstream.runtime.consumer import current_delivery
from agentstream.runtime.deltas import RedisDeltaSink
from agentstream.runtime.store import Publication
from agentstream.runtime.watchdog import awaiting_key
from agentstream.steps.approvals import AwaitApproval, RecordApprovals
from agentstream.steps.call_ids import scope_call_ids
from agentstream.steps.decision import (
    CallModel,
    CancelTurn,
    EndTurn,
    FailTurn,
    Idle,
    RecordResults,
    RunTools,
    decide_view,
)
from agentstream.steps.effects import (
    Effects,
    after_apply,
    ending_effects,
    ending_kind,
    jobs_marker,
    jobs_note,
    notes_before,
    output_effects,
    recorded,
    reply_marker,
    turn_ends,
)
from agentstream.steps.machine import (
    model_call_failure,
    stamped_output,
    storable_results,
    turn_deadline_failure,
    turn_time_left_s,
    unknown_model_failure,
    unstorable_output_failure,
)
from agentstream.steps.summarising import failure_code
from agentstream.steps.trace_fold import AWAITS_APPROVAL, TraceFold
from agentstream.wire import codec
from agentstream.wire.events import (
    ModelOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import REPLY_FIELD


class Acting(LoopState):
    """One step."""

    async def _act(self, trace_id: str, token: int, fold: TraceFold, decision, jobs: list) -> _Outcome:
        """Carry out one decision → what the step loop does next."""
        match decision:
            case Idle():
                return _Outcome.WAIT
            case CallModel(turn=turn, agent=agent, step=step):
                return await self._carry_out_call(trace_id, token, fold, turn, agent, step)
            case RecordResults(results=results):
                return await self._apply(trace_id, token, fold, recorded(self._storable(results)))
            case RunTools(turn=turn, agent=agent, step=step, calls=calls):
                published = fold.notes.get(jobs_note(turn.turn_id, step))
                if published is None:  # not known here: another worker may have published them
                    published = await self.store.has_key(trace_id, jobs_marker(turn.turn_id, step))
                if not published:  # built here, inside the step's span: each job carries it
                    jobs.append((turn.turn_id, step, self._jobs(trace_id, fold, turn, agent, calls)))
                return _Outcome.WAIT
            case EndTurn() | FailTurn() | CancelTurn():
                return await self._apply(trace_id, token, fold, ending_effects(decision))
            case AwaitApproval(awaited=awaited, due_ms=due_ms):
                # the due time first: a crash after it and before the append wakes the trace for nothing
                await operations.note_approval_due(self.redis, self.keys, trace_id, due_ms)
                fold.notes[AWAITS_APPROVAL] = True
                if awaited:
                    outcome = await self._apply(trace_id, token, fold, recorded(awaited))
                    self._log_awaited(trace_id, awaited)
                    return outcome
                return _Outcome.WAIT  # the lease goes back: nothing waits in memory for the person
            case RecordApprovals(decisions=decisions):  # calls nobody decided in time: denied
                return await self._apply(trace_id, token, fold, recorded(decisions))
        raise AssertionError(f"unhandled decision {decision!r}")

    async def _carry_out_call(
        self, trace_id: str, token: int, fold: TraceFold, turn: TurnInput, agent: Agent, step: int
    ) -> _Outcome:
        """Carry out a CallModel: the decisions of :mod:`agentstream.steps.machine`, in its order."""
        if fold.unconfirmed:  # a turn starts: the turns before it have had their replies
            await self._publish_replies(trace_id, fold)
        entries = fold.turn_entry(turn.turn_id)
        left_s = turn_time_left_s(entries, turn.turn_id, self.turn_deadline_s, time.time())
        failed = turn_deadline_failure(turn, left_s, self.turn_deadline_s, step)  # 1
        if failed is not None:
            return await self._end(trace_id, token, fold, failed, turn)
        # 2: what the MCP offer reads of the trace: the agent's latest offer and the turn's input entry
        offer = await self.mcp.before_call(trace_id, token, turn, agent, step, entries, fold.offers_of(agent.name))
        if isinstance(offer, TurnFailed):  # an MCP server never published its tools
            return await self._end(trace_id, token, fold, offer, turn)
        if offer:  # the trace now records the MCP tools offered from this call on
            return _Outcome.REFRESH
        try:  # 3
            built = fold.build(agent, turn_id=turn.turn_id, step=step)
            request = await self.compactions.request_for(trace_id, built, fold.events, agent)
        except ContextError as exc:  # does not fit the window, the summary failed, or bad context settings
            failed = TurnFailed(turn_id=turn.turn_id, code=failure_code(exc), reason=str(exc))
            return await self._end(trace_id, token, fold, failed, turn)
        if request is None:  # a summary is written first; its outcome wakes the trace
            return _Outcome.WAIT
        failed = unknown_model_failure(agent, self.models, turn)  # 4
        if failed is not None or agent.model is None:
            assert failed is not None
            return await self._end(trace_id, token, fold, failed, turn)
        model = self.models[agent.model]
        miss: dict[str, int | None] | None = None
        try:
            try:
                output = await self._call_model(trace_id, turn, agent, step, model, request, left_s)
            except ContextWindowExceeded as exc:  # the server's window is smaller than the estimate said
                miss = self._window_missed(trace_id, turn, agent, step, exc)
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
        except (TimeoutError, ModelError) as exc:  # 5
            failed = model_call_failure(
                exc, turn, step, turn_deadline_s=self.turn_deadline_s, bounded=left_s is not None
            )
            if failed is None:
                raise
            return await self._end(trace_id, token, fold, failed, turn)
        failed = unstorable_output_failure(self.store.codec.unstorable(output), turn, step)  # 6
        if failed is not None:  # the turn's failure, not a handler failure that calls the model again
            return await self._end(trace_id, token, fold, failed, turn)
        metrics.record_usage(agent.model, output)
        self._check_usage(agent, request, output)
        return await self._record_output(trace_id, token, fold, turn, stamped_output(output, agent))  # 7

    @staticmethod
    def _log_awaited(trace_id: str, awaited) -> None:
        for wait in awaited:
            log.info(
                "trace %s: call %s of %s awaits approval (%s), due at %d ms",
                trace_id,
                wait.call_id,
                wait.name,
                wait.why,
                wait.due_ms,
            )

    def _window_missed(
        self, trace_id: str, turn: TurnInput, agent: Agent, step: int, exc: ContextWindowExceeded
    ) -> dict[str, int | None]:
        """Log a request the model's server refused as over its window → what the retry needs."""
        log.warning(
            "trace %s turn %s step %d: the model's server refused the request as over its window (%s); "
            "sending it once more, smaller",
            trace_id,
            turn.turn_id,
            step,
            exc,
        )
        endpoint = self.endpoints.get(agent.model) if agent.model is not None else None
        if endpoint is not None and exc.window_tokens and exc.window_tokens < endpoint.window_tokens:
            log.warning(
                "model endpoint %r is configured with window_tokens %d, but its server states a "
                "window of %d tokens: set window_tokens to it, or every call that fits the first "
                "and not the second is refused once before it goes out smaller",
                endpoint.id,
                endpoint.window_tokens,
                exc.window_tokens,
            )
        return {
            "prompt_tokens": exc.prompt_tokens,
            "window_tokens": exc.window_tokens,
            "over_by_tokens": exc.over_by_tokens,
        }

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
        """:func:`~agentstream.steps.machine.storable_results`, each replaced result logged."""
        out = storable_results(results, self.store.codec.unstorable)
        self._log_replaced(results, out)
        return out

    def _log_replaced(self, results, storable) -> None:
        for before, after in zip(results, storable, strict=True):
            if after is not before:
                log.warning(
                    "call %s (%s): its result cannot be stored (%s); recorded as an error result",
                    before.call_id,
                    before.name,
                    self.store.codec.unstorable(before),
                )

    async def _apply(self, trace_id: str, token: int, fold: TraceFold, effects: Effects) -> _Outcome:
        """Apply a step's ``effects`` under the lease ``token`` in one operation
        (:meth:`TraceStore.apply`, one script), fold what came since the fold's last entry, and
        note what :func:`~agentstream.steps.effects.after_apply` says → what the step loop does
        next.

        The events are appended, then ``then`` when nothing came into the trace since the fold's
        last entry. With jobs or a reply to publish (one Redis server only: the pure layer plans
        none on a cluster, where the step loop publishes them with its release) they go out, their
        markers are set and the lease is released in the same script, provided every event was
        appended by it: ``RELEASED`` or ``DIRTY`` (a hint came: the lease kept), else ``AGAIN``.
        The work entry being handled (a turn, a wake-up, a cancel) is acknowledged in that script
        when the lease is released: every handler's step loop is its last work, and a release
        ends it (:func:`agentstream.runtime.consumer.current_delivery`).
        """
        publication, reply = self._publication(trace_id, fold, effects) if effects.releases else (None, None)
        noted = notes_before(effects)
        fold.notes.update(noted)  # before Redis runs the release: see notes_before
        try:
            applied = await self.store.apply(
                trace_id,
                effects.events,
                then=effects.then,
                fence=token,
                after=fold.last_id or "",
                expire_ms=self._expire_ms,
                publication=publication,
            )
        except BaseException:
            for key in noted:  # unknown: asked of Redis before the jobs are published
                fold.notes.pop(key, None)
            raise
        if applied.acknowledged:
            delivery = current_delivery()
            assert delivery is not None  # acknowledged only with its ack arguments
            delivery.acknowledged = True
        await self._fold_with(trace_id, fold, applied.read)
        after = after_apply(effects, [a.created if a is not None else None for a in applied.appended], applied.outcome)
        for key in after.forget:
            fold.notes.pop(key, None)
        fold.notes.update(after.notes)
        if after.ended is not None:
            assert effects.turn is not None  # an ending is a turn's
            self._ended(fold, effects.turn, after.ended, replied=after.replied is not None)
        if after.replied is not None:
            assert reply is not None
            _log_ending(trace_id, after.replied.ending, reply.stop_reason)
            self._confirm(fold, [reply_marker(after.replied.ending.turn_id)])
        return _Outcome(after.step)

    def _publication(self, trace_id: str, fold: TraceFold, effects: Effects) -> tuple[Publication, Any]:
        """What ``effects`` publish, as the store writes it → (the publication, the reply or None).

        A step's jobs are built inside the step's span (each job carries it, as when the step
        loop builds them); the work entry being handled is acknowledged with the release."""
        entries: list[tuple[str, str, bytes, bytes]] = []
        reply = None
        if effects.jobs is not None:
            run = effects.jobs
            with _step_span(trace_id, run):
                entries += self._jobs(trace_id, fold, run.turn, run.agent, run.calls)
        if effects.reply is not None:
            answered = effects.reply
            reply = _reply_of_ending(trace_id, answered.turn, answered.ending, answered.stop_reason)
            entries.append(("", self._reply_stream(answered.turn), REPLY_FIELD, codec.encode(reply)))
        delivery = current_delivery()
        ack = delivery.ack_args() if delivery is not None and not delivery.acknowledged else None
        awaiting = awaiting_key(self.keys, self.keys.partition(trace_id))
        return Publication(entries, effects.marks, awaiting, ack), reply

    async def _record_output(
        self, trace_id: str, token: int, fold: TraceFold, turn: TurnInput, output: ModelOutput
    ) -> _Outcome:
        """Append a model output with what the step after it would write
        (:func:`~agentstream.steps.effects.output_effects`): its ending or the results of calls
        that must not run, provided nothing else came into the trace meanwhile, and on one Redis
        server the jobs of its calls or the reply of its answer, with the release."""
        output = scope_call_ids(output, used=fold.call_ids)  # a call id names one call of the trace
        view = fold.view()  # as folded up to fold.last_id: the conditional part holds only if nothing came since
        nxt = decide_view(view.with_output(output), self.app.agent, self.served) if view.turn == turn else None
        effects = output_effects(
            turn,
            output,
            nxt,
            publish_with_append=self._publishes_with_append,
            replies_owed=bool(fold.unconfirmed),
            others_waiting=fold.others_unended(turn.turn_id),
            unstorable=self.store.codec.unstorable,
        )
        if isinstance(nxt, RecordResults):
            self._log_replaced(nxt.results, list(effects.then))
        return await self._apply(trace_id, token, fold, effects)

    async def _end(
        self, trace_id: str, token: int, fold: TraceFold, ending: TurnEnded | TurnFailed, turn: TurnInput
    ) -> _Outcome:
        """Append the turn's ending (:func:`~agentstream.steps.effects.turn_ends`); the reply goes
        out with the next release (or before the next model call)."""
        return await self._apply(trace_id, token, fold, turn_ends(turn, ending))

    def _ended(
        self, fold: TraceFold, turn: TurnInput, ending: TurnEnded | TurnFailed, *, replied: bool = False
    ) -> None:
        """Count a turn's ending this process appended; unless its reply went out with it, the
        reply goes out in the ending step's context."""
        if not replied:
            fold.notes[("context", ending.turn_id)] = tracing.inject()
        kind = ending_kind(ending)
        if kind == "ended":
            metrics.TURNS_ENDED.labels(agent=turn.agent).inc()
        elif kind == "cancelled":
            metrics.TURNS_CANCELLED.labels(agent=turn.agent).inc()
        else:
            assert isinstance(ending, TurnFailed)
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
