"""The tool worker: runs tool jobs and records each result once.

A thin shell: a job is a hint (trace, call id, tool, raw arguments). Before running it, the
worker asks the trace about the call and claims it for this job in one atomic step
(:meth:`TraceStore.begin_call`):

- a call already answered, or whose turn was cancelled or has ended, is skipped (a queued job of
  a cancelled turn never runs; the agent loop writes its cancelled result);
- a second job for the same call (published twice) is dropped: the call runs once;
- a re-delivered job of a tool with side effects whose ``tool_started`` is already in the trace
  (its worker died mid-run) is not run again: the call gets an "outcome unknown" error result
  for the model, unless the tool is ``retry_safe``;
- otherwise a tool with side effects gets its ``tool_started`` event, then the tool runs with its
  timeout (bad arguments and tool failures become error results for the model, never a dead
  worker), the result is appended keyed by call id, and the agent loop is woken.

A result that finds its call already answered (cancelled, outcome unknown, dead letter) is kept
as a late result, which no context shows. A cancel heard while a call runs sets the call's
cancel flag (:mod:`agentstream.tool_context`) and cancels an async tool's task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import msgspec

from agentstream import codec, metrics, tracing
from agentstream.app import App
from agentstream.events import CancelMessage, ToolJob, ToolOutput, ToolStarted, Wake
from agentstream.keys import JOB_FIELD, WAKE_FIELD, Keys
from agentstream.store import TraceStore
from agentstream.tool_context import CallContext, set_current_call

log = logging.getLogger("agentstream.tool_worker")

OUTCOME_UNKNOWN = "outcome_unknown"
CANCELLED = "cancelled"
DEAD_LETTER = "dead_letter"


class ToolWorker:
    """Handles tool jobs.

    Args:
        app: the user's app (its tools).
        store: the trace store.
        worker_name: this process's consumer name (recorded in ``tool_started`` events).
    """

    def __init__(self, app: App, store: TraceStore, *, worker_name: str = ""):
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.worker_name = worker_name
        self._running: dict[tuple[str, str], tuple[ToolJob, CallContext, asyncio.Task]] = {}
        self._unrecorded: dict[tuple[str, str], ToolOutput] = {}  # results whose append failed
        self.skipped = 0
        self.duplicates = 0
        self.outcomes_unknown = 0
        self.late = 0

    def handler_for(self, stream: str):
        """The consumer handler of one tool-queue stream."""

        async def handle(entry_id: str, fields: dict[bytes, bytes]) -> None:
            await self.on_job(entry_id, fields, stream=stream)

        return handle

    async def on_job(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str = "") -> None:
        """One tool job: run it once and record its result."""
        payload = fields.get(JOB_FIELD)
        try:
            job = codec.decode_job(codec.entry_field(fields, JOB_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed tool job %s: %s", entry_id, exc)
            shown = payload if payload is not None else codec.fields_json(fields)
            await self.redis.xadd(self.keys.errors, {b"error": f"malformed tool job {entry_id}: {exc}".encode(), b"payload": shown})
            return
        # a child of the step that published the job (OpenTelemetry); the tool runs inside it
        with tracing.span("agentstream.tool_call", parent=job.trace_context, kind="consumer", attributes=_span_attributes(job)):
            await self._on_job(job, entry_id, stream)

    async def _on_job(self, job: ToolJob, entry_id: str, stream: str) -> None:
        key = (job.trace_id, job.call_id)
        ref = f"{stream}/{entry_id}"
        state = await self.store.begin_call(job.trace_id, job.turn_id, job.call_id, ref)
        if state.should_skip:
            if not state.has_result:
                self.skipped += 1
                log.info("skipping job %s: call %s of trace %s belongs to a cancelled or ended turn", ref, job.call_id, job.trace_id)
            self._unrecorded.pop(key, None)
            await self._wake(job)  # the result (or the cancel) is in; make sure the loop heard
            return
        if not state.claimed:
            self.duplicates += 1
            log.info("dropping job %s: call %s of trace %s runs under job %s", ref, job.call_id, job.trace_id, state.holder)
            return
        unrecorded = self._unrecorded.pop(key, None)
        if unrecorded is not None:  # ran here already; only the append failed
            await self._record(job, unrecorded)
            return
        tool = self.app.tool(job.name)
        if tool is not None and tool.side_effects and not tool.retry_safe and state.started:
            self.outcomes_unknown += 1
            metrics.TOOL_OUTCOMES_UNKNOWN.labels(tool=job.name).inc()
            log.warning(
                "call %s of trace %s (tool %s, side effects) started before and its worker stopped mid-run: "
                "recording an outcome-unknown result instead of running it again", job.call_id, job.trace_id, job.name,
            )
            await self.store.append(job.trace_id, _outcome_unknown(job))
            await self._wake(job)
            return
        if tool is not None and tool.side_effects:
            await self.store.append(
                job.trace_id,
                ToolStarted(turn_id=job.turn_id, call_id=job.call_id, name=job.name, worker=self.worker_name, job=ref),
            )
        result = await self._run_tracked(job)
        await self._record(job, result)

    async def _record(self, job: ToolJob, result: ToolOutput) -> None:
        key = (job.trace_id, job.call_id)
        try:
            if result.error == CANCELLED:
                await self.store.append(job.trace_id, result)  # the loop's own cancelled result may be first
            else:
                _, late = await self.store.append_result(job.trace_id, result)
                if late:
                    self.late += 1
                    metrics.LATE_RESULTS.labels(tool=job.name).inc()
                    log.info("call %s of trace %s was answered before its result came; recorded it as late", job.call_id, job.trace_id)
        except BaseException:
            self._unrecorded[key] = result
            raise
        await self._wake(job)

    async def _run_tracked(self, job: ToolJob) -> ToolOutput:
        """Run the job where a cancel can reach it (its cancel flag, and its task for async tools)."""
        call = CallContext(trace_id=job.trace_id, turn_id=job.turn_id, call_id=job.call_id, name=job.name)
        context = contextvars.copy_context()
        context.run(set_current_call, call)  # the tool (and a sync tool's thread) sees `call`
        task = asyncio.create_task(self.run(job), context=context)
        key = (job.trace_id, job.call_id)
        self._running[key] = (job, call, task)
        started = time.perf_counter()
        try:
            await asyncio.wait({task})
        finally:
            self._running.pop(key, None)
            if not task.done():  # the worker stops (its grace period ran out): tell the tool too
                call.cancel()
                task.cancel()
        if task.cancelled():
            return ToolOutput(
                turn_id=job.turn_id,
                call_id=job.call_id,
                name=job.name,
                text=f"Cancelled: tool {job.name!r} was stopped while running because its turn was cancelled; "
                "it may have partly run.",
                error=CANCELLED,
                duration_ms=(time.perf_counter() - started) * 1000.0,
            )
        return task.result()

    async def on_cancel_broadcast(self, message: CancelMessage) -> None:
        """A cancel heard by this process: tell the calls of that turn that it runs."""
        for (trace_id, _call_id), (job, call, task) in list(self._running.items()):
            if trace_id != message.trace_id or (message.turn_id and job.turn_id != message.turn_id):
                continue
            call.cancel()
            tool = self.app.tool(job.name)
            if tool is not None and tool.is_async:
                task.cancel()
            log.info("told call %s (tool %s) of trace %s that its turn was cancelled", job.call_id, job.name, trace_id)

    async def on_dead_job(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A job that failed on every delivery: its call gets an error result the model can see."""
        try:
            job = codec.decode_job(fields.get(JOB_FIELD) or b"")
        except msgspec.DecodeError:
            return
        result = ToolOutput(
            turn_id=job.turn_id,
            call_id=job.call_id,
            name=job.name,
            text=f"Error: tool {job.name!r} could not be run: its job failed on every delivery and was given up "
            f"(last error: {error}). It may have partly run; do not assume it took effect.",
            error=DEAD_LETTER,
        )
        await self.store.append(job.trace_id, result)
        await self._wake(job)

    async def run(self, job: ToolJob) -> ToolOutput:
        """Run the job's tool → its result (an error result when it cannot run)."""
        tool = self.app.tool(job.name)
        started = time.perf_counter()
        if tool is None:
            names = ", ".join(sorted(self.app.tools)) or "none"
            value_text, data, error = f"Error: there is no tool named {job.name!r}. Available tools: {names}.", None, "unknown_tool"
        else:
            value = await tool.invoke(job.arguments)
            value_text, data, error = value.text, value.data, value.error
        duration_s = time.perf_counter() - started
        metrics.TOOL_CALL_SECONDS.labels(tool=job.name).observe(duration_s)
        if error is not None:
            metrics.TOOL_ERRORS.labels(tool=job.name, error=error).inc()
            tracing.current().set({"error.type": error})
            log.info("tool %s call %s of trace %s gave an error result: %s", job.name, job.call_id, job.trace_id, error)
        return ToolOutput(
            turn_id=job.turn_id,
            call_id=job.call_id,
            name=job.name,
            text=value_text,
            data=data,
            error=error,
            duration_ms=duration_s * 1000.0,
        )

    async def _wake(self, job: ToolJob) -> None:
        wake = Wake(trace_id=job.trace_id, reason=f"result:{job.call_id}")
        await self.redis.xadd(self.keys.wake, {WAKE_FIELD: codec.encode(wake)})


def _span_attributes(job: ToolJob) -> dict[str, str]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": job.name,
        "gen_ai.tool.call.id": job.call_id,
        "agentstream.trace_id": job.trace_id,
        "agentstream.turn_id": job.turn_id,
    }


def _outcome_unknown(job: ToolJob) -> ToolOutput:
    return ToolOutput(
        turn_id=job.turn_id,
        call_id=job.call_id,
        name=job.name,
        text=f"Error: the outcome of this call is unknown. Tool {job.name!r} has side effects and its worker "
        "stopped while running it, so it was not run again: it may or may not have taken effect. "
        "Check before you call it again.",
        error=OUTCOME_UNKNOWN,
    )
