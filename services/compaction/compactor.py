"""The compaction service: writes the summaries that replace old turns in later contexts.

A thin shell around :mod:`agentstream.steps.summarising` and :mod:`agentstream.context.compaction`.
A compaction job is a hint: the service reads the trace, builds the waiting model call's
context itself and asks the context library which turns a summary replaces. If that compaction
still has no outcome, it asks the summary model (the configured one, else the agent's own) for
the summary, one budgeted call per chunk of turns, each folding in the summary so far (and an
earlier compaction's summary); then it appends the outcome under one idempotency key:

- a Compaction (the summary, the first kept turn, the turns replaced, the summary calls'
  usage), when the summary is not empty and the next call's context changes with it;
- a CompactionFailed ``compaction_error`` when the summary is empty or would replace nothing
  (the turn then ends with that reason);
- a CompactionFailed ``summary_failed`` when a summary call failed (the turn then goes on with
  plain trimming).

Then it wakes the trace.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from agentstream.context import CompactionPlan, build_context, compaction_event, settings_of, summary_request
from agentstream.context.builder import build_from_state, new_state
from agentstream.declarations.apps import App
from agentstream.delegation import offered_agent
from agentstream.errors import CompactionError, ContextError, ModelError
from agentstream.models import ChatModel, endpoints_of
from agentstream.ops import logs, metrics, tracing
from agentstream.runtime import operations
from agentstream.runtime.fold_reader import FoldReader
from agentstream.runtime.reports import report_error
from agentstream.runtime.store import TraceStore
from agentstream.steps.summarising import COMPACTION_ERROR, SUMMARY_FAILED, CompactionJob, decode_job, outcome_key
from agentstream.steps.trace_fold import FoldCache
from agentstream.wire import codec
from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits
from agentstream.wire.events import Compaction, CompactionFailed, Usage
from agentstream.wire.keys import COMPACTION_FIELD, Keys

log = logging.getLogger("agentstream.compaction")


class Compactor:
    """Handles compaction jobs.

    Args:
        app: the user's app (the agents' context settings).
        store: the trace store.
        models: model clients by endpoint id.
        summary_model: the endpoint id that writes summaries; None uses the agent's own model.
        fold_cache_bytes: the most bytes of memory (as measured) of traces kept folded between jobs
            (:class:`agentstream.runtime.fold_reader.FoldReader`).
    """

    def __init__(
        self,
        app: App,
        store: TraceStore,
        models: Mapping[str, ChatModel],
        *,
        summary_model: str | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
        fold_cache_bytes: int = 64 * 1024 * 1024,
    ):
        self.app = app
        self.folds = FoldReader(store, FoldCache(fold_cache_bytes))  # traces folded: a job reads what is new
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.models = models
        self.endpoints = endpoints_of(models)  # an agent without model_limits gets its endpoint's
        self.summary_model = summary_model
        self.limits = limits

    async def on_job(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A compaction job: write the summary it asks for, once (``stream``: the partition it
        came from, for a report; default ``<ns>:compactions``)."""
        try:
            job = decode_job(codec.entry_field(fields, COMPACTION_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed compaction job %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, COMPACTION_FIELD)
            await report_error(
                self.redis,
                self.keys,
                f"malformed compaction job {entry_id}: {exc}",
                shown,
                self.limits,
                source=stream or self.keys.compactions,
                entry=entry_id,
            )
            return
        attributes = {
            "agentstream.trace_id": job.trace_id,
            "agentstream.turn_id": job.turn_id,
            "agentstream.step": job.step,
        }
        with (
            logs.bind(trace_id=job.trace_id, turn_id=job.turn_id),
            tracing.span("agentstream.compaction", parent=job.trace_context, kind="consumer", attributes=attributes),
        ):  # a child of the step that asked for the summary (OpenTelemetry)
            await self.compact(job)
            await self._wake(job.trace_id, job.wake_to)

    async def on_dead_job(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A job that failed on every delivery: record the summary as failed, so the turn goes on."""
        try:
            job = decode_job(fields.get(COMPACTION_FIELD) or b"")
        except msgspec.DecodeError:
            return
        failed = CompactionFailed(
            turn_id=job.turn_id,
            kept_from_turn=job.kept_from_turn,
            code=SUMMARY_FAILED,
            reason=f"the compaction job failed on every delivery ({error})",
        )
        await self.store.append(job.trace_id, failed, key=outcome_key(job.turn_id, job.kept_from_turn))
        await self._wake(job.trace_id, job.wake_to)

    async def compact(self, job: CompactionJob) -> Compaction | CompactionFailed | None:
        """Write the outcome of the compaction the job's call needs → it, or None when none is due.

        None when the trace moved on (the turn ended, the compaction was made already, or the
        call no longer needs one).
        """
        fold = await self.folds.current(job.trace_id)  # what came since this process last looked
        events = fold.events  # the context is folded afresh (pure): a summary's own calls dwarf it
        turn = fold.active_turn()
        if turn is None or turn.turn_id != job.turn_id:
            return None
        agent = self.app.agent(turn.agent)
        if agent is None:
            return None
        agent = offered_agent(agent, turn, self.endpoints)  # the limits the agent loop used
        config, limits = settings_of(agent)
        state = new_state(events, agent, config, limits)
        built = build_from_state(state, turn_id=turn.turn_id, step=job.step)
        plan = built.compaction
        if plan is None:
            return None
        key = outcome_key(plan.turn_id, plan.kept_from_turn)
        if await self.store.has_key(job.trace_id, key):
            return None
        model_id = self.summary_model or agent.model
        outcome: Compaction | CompactionFailed
        try:
            model = self.models.get(model_id) if model_id is not None else None
            if model is None:
                raise ModelError(f"the summary model {model_id!r} is not configured")
            outcome = await self._summarise(state, plan, model, job.step)
            unstorable = self.store.codec.unstorable(outcome)
            if unstorable is not None:
                raise CompactionError(
                    f"turn {plan.turn_id}: the summary cannot be stored ({unstorable}); nothing was compacted"
                )
            after = build_context([*events, outcome], agent, turn_id=turn.turn_id, step=job.step)
            if after.request == built.request:
                raise CompactionError(
                    f"turn {plan.turn_id}: the summary would replace nothing (the next context is unchanged)"
                )
        except CompactionError as exc:
            outcome = self._failed(plan, COMPACTION_ERROR, str(exc))
        except (ModelError, ContextError) as exc:
            outcome = self._failed(plan, SUMMARY_FAILED, f"the summary call to model {model_id!r} failed: {exc}")
        appended = await self.store.append(job.trace_id, outcome, key=key)
        if appended.created:
            metrics.COMPACTIONS.labels(outcome="compacted" if isinstance(outcome, Compaction) else outcome.code).inc()
            if isinstance(outcome, Compaction):
                log.info(
                    "trace %s: a summary now replaces %d turn(s); kept from turn %s",
                    job.trace_id,
                    outcome.replaced_turns,
                    outcome.kept_from_turn,
                )
            else:
                log.warning("trace %s: compaction failed (%s): %s", job.trace_id, outcome.code, outcome.reason)
        return outcome

    async def _summarise(self, state, plan: CompactionPlan, model: ChatModel, step: int) -> Compaction:
        """The summary of the plan's turns, chunk by chunk, each call folding in the summary so far."""
        summary = plan.previous_summary
        prompt = completion = 0
        provider = name = ""
        for chunk in range(len(plan.chunks)):
            request = summary_request(state, plan, chunk, summary)
            attributes = tracing.model_call_attributes(model, turn_id=plan.turn_id, step=step)
            with tracing.span("agentstream.model_call", kind="client", attributes=attributes) as span:
                output = await model.complete(request, turn_id=plan.turn_id, step=step)
                tracing.record_model_output(span, output)
            if not output.content.strip():
                raise CompactionError(
                    f"turn {plan.turn_id}: the model wrote an empty summary (chunk {chunk + 1} of {len(plan.chunks)}, "
                    f"stop reason {output.stop_reason}); nothing was compacted"
                )
            summary = output.content
            prompt += output.usage.prompt_tokens or 0
            completion += output.usage.completion_tokens or 0
            provider, name = output.provider, output.model
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        return compaction_event(plan, summary or "", provider=provider, model=name, usage=usage)

    @staticmethod
    def _failed(plan: CompactionPlan, code: str, reason: str) -> CompactionFailed:
        return CompactionFailed(turn_id=plan.turn_id, kept_from_turn=plan.kept_from_turn, code=code, reason=reason)

    async def _wake(self, trace_id: str, owner: str = "") -> None:
        # to the agent loop that asked while it is alive (it holds the fold), else any
        await operations.wake_trace(self.redis, self.keys, trace_id, "compaction", owner=owner)
