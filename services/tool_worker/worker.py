"""The tool worker: runs tool jobs and records each result once.

A thin shell: a job is a hint (trace, call id, tool, raw arguments). Before running it, the
worker checks the call, claims it for this job and takes its run key in one atomic step that
reads no event (:meth:`TraceStore.begin_call`), so a job costs the same whatever the length of
its trace; the result is recorded and the run key given back in one more:

- a job that names no call of its trace's running turn (a call the trace never made, whether
  or not its turn has ended; a turn that is not running; a trace that does not exist; a real
  call with another tool or other arguments than the call recorded) is
  acknowledged and reported on the errors stream; nothing is written into any trace
  (:func:`agentstream.runtime.call_runs.job_problem`);
- a call already answered, or whose turn was cancelled or has ended, is skipped (a queued job of
  a cancelled turn never runs; the agent loop writes its cancelled result);
- a second job for the same call (published twice) is dropped: the call runs once;
- a re-delivered job of a tool with side effects whose ``tool_started`` is already in the trace
  (its worker died mid-run) is not run again: the call gets an "outcome unknown" error result
  for the model, unless the tool is ``retry_safe``;
- a job whose call another worker runs right now (its entry was claimed from that worker, as
  happens to a tool slower than the claim idle time) waits until that run ends or its run key
  expires (:class:`agentstream.runtime.call_runs.CallRuns`): a call runs once, whichever job entry or consumer carries it;
- otherwise a tool with side effects gets its ``tool_started`` event, then the tool runs with its
  timeout (bad arguments and tool failures become error results for the model, never a dead
  worker), the result is appended keyed by call id, and the agent loop is woken.

A result that finds its call already answered (cancelled, outcome unknown, dead letter) is kept
as a late result, which no context shows. A cancel heard while a call runs sets the call's
cancel flag (:mod:`agentstream.declarations.tool_context`) and cancels an async tool's task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import TYPE_CHECKING

import msgspec

from agentstream.app.base import invoke_tool
from agentstream.declarations.apps import App
from agentstream.declarations.readable import readable_result
from agentstream.declarations.tool_context import CallContext, set_current_call
from agentstream.errors import Deferred
from agentstream.ops import metrics, tracing
from agentstream.runtime import operations
from agentstream.runtime.call_runs import CallRuns, job_problem
from agentstream.runtime.reports import report_error
from agentstream.runtime.store import TraceStore
from agentstream.wire import codec
from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits, tool_arguments_refusal, tool_result_refusal
from agentstream.wire.events import CancelMessage, ToolJob, ToolOutput, ToolStarted

if TYPE_CHECKING:
    from agentstream.mcp_tools.host import McpHost
from agentstream.wire.keys import JOB_FIELD, Keys
from agentstream.wire.registry import check_elements

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
        limits: the largest tool arguments run and results recorded (:mod:`agentstream.wire.checks`).
        run_ttl_ms: how long a call's run key outlives a worker that died running it (renewed
            while the tool runs; see :mod:`.calls`).
    """

    def __init__(
        self,
        app: App,
        store: TraceStore,
        *,
        worker_name: str = "",
        run_ttl_ms: int = 30_000,
        limits: WireLimits = DEFAULT_LIMITS,
    ):
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.worker_name = worker_name
        self.limits = limits
        self._running: dict[tuple[str, str], tuple[ToolJob, CallContext, asyncio.Task]] = {}
        self._unrecorded: dict[tuple[str, str], ToolOutput] = {}  # results whose append failed
        self._events: dict[tuple[str, str], tuple] = {}  # the app's events a result records, until it is appended
        self.skipped = 0
        self.duplicates = 0
        self.outcomes_unknown = 0
        self.late = 0
        self.strays = 0
        self.run_elsewhere = 0
        self.runs = CallRuns(store.redis, store.keys, worker_name=worker_name, ttl_ms=run_ttl_ms)
        self.mcp: McpHost | None = None  # the MCP servers this process keeps, if any

    def tool(self, name: str):
        """The tool of that name: the app's, else one of this process's MCP servers'; or None."""
        tool = self.app.tool(name)
        if tool is None and self.mcp is not None:
            tool = self.mcp.tool(name)
        return tool

    def handler_for(self, stream: str):
        """The consumer handler of one tool-queue stream."""

        async def handle(entry_id: str, fields: dict[bytes, bytes]) -> None:
            await self.on_job(entry_id, fields, stream=stream)

        return handle

    async def on_job(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str = "") -> None:
        """One tool job: run it once and record its result."""
        try:
            job = codec.decode_job(codec.entry_field(fields, JOB_FIELD))
        except msgspec.DecodeError as exc:
            log.error("dropping malformed tool job %s: %s", entry_id, exc)
            shown = codec.entry_shown(fields, JOB_FIELD)
            await report_error(
                self.redis,
                self.keys,
                f"malformed tool job {entry_id}: {exc}",
                shown,
                self.limits,
                source=stream,
                entry=entry_id,
            )
            return
        # a child of the step that published the job (OpenTelemetry); the tool runs inside it
        with tracing.span(
            "agentstream.tool_call", parent=job.trace_context, kind="consumer", attributes=lambda: _span_attributes(job)
        ):
            await self._on_job(job, entry_id, stream)

    async def _on_job(self, job: ToolJob, entry_id: str, stream: str) -> None:
        key = (job.trace_id, job.call_id)
        ref = f"{stream}/{entry_id}"
        run = self.runs.run(job.trace_id, job.call_id)
        # one step, no event read: the call checked against its markers, claimed, its run key taken
        state = await self.store.begin_call(
            job.trace_id, job.turn_id, job.call_id, ref, name=job.name, arguments=job.arguments, run=run
        )
        if state.unchecked:  # no marker of the call: read its turn (never the whole trace) to decide
            events = [e for _, e in await self.store.read(job.trace_id, from_id=state.turn_entry)]
            problem = job_problem(events, job)
            if not problem:
                state = await self.store.begin_call(
                    job.trace_id, job.turn_id, job.call_id, ref, name=job.name, run=run, checked=True
                )
        else:
            problem = state.problem
        if problem:  # not a call of this trace's running turn: run nothing, write no trace
            self.strays += 1
            log.warning("dropping tool job %s (tool %s, call %s): %s", ref, job.name, job.call_id, problem)
            await report_error(
                self.redis,
                self.keys,
                f"tool job {ref} names no call that may run: {problem}",
                codec.encode(job),
                self.limits,
                source=stream,
                entry=entry_id,
            )
            return
        if state.should_skip:
            if not state.has_result:
                self.skipped += 1
                # a queued job of a cancelled turn, or a re-sent job of a turn that ended: legitimate
                (log.debug if state.turn_ended else log.info)(
                    "skipping job %s: call %s of trace %s belongs to a cancelled or ended turn",
                    ref,
                    job.call_id,
                    job.trace_id,
                )
            self._unrecorded.pop(key, None)
            await self._wake(job)  # the result (or the cancel) is in; make sure the loop heard
            return
        if not state.claimed:
            self.duplicates += 1
            log.info(
                "dropping job %s: call %s of trace %s runs under job %s", ref, job.call_id, job.trace_id, state.holder
            )
            return
        if not state.run_taken:  # another worker runs this call now (its entry was claimed from it): wait
            self.run_elsewhere += 1
            raise Deferred(
                max(0.05, state.run_left_ms / 1000.0 + 0.05),
                f"call {job.call_id} of trace {job.trace_id} runs on {state.run_holder}",
            )
        # the result check and the run key were one step: a runner that finished first left its result
        async with self.runs.held(job.trace_id, job.call_id) as held:
            await self._run_claimed(job, ref, state, held)

    async def _run_claimed(self, job: ToolJob, ref: str, state, held) -> None:
        """Run a call whose claim and run key this worker holds (see :mod:`.calls`); the write that
        records its outcome also deletes the run key (``held``)."""
        key = (job.trace_id, job.call_id)
        unrecorded = self._unrecorded.pop(key, None)
        if unrecorded is not None:  # ran here already; only the append failed
            await self._record(job, unrecorded, held)
            return
        tool = self.tool(job.name)
        if tool is not None and tool.side_effects and not tool.retry_safe and state.started:
            self.outcomes_unknown += 1
            metrics.TOOL_OUTCOMES_UNKNOWN.labels(tool=job.name).inc()
            log.warning(
                "call %s of trace %s (tool %s, side effects) started before and its worker stopped mid-run: "
                "recording an outcome-unknown result instead of running it again",
                job.call_id,
                job.trace_id,
                job.name,
            )
            await self.store.append(job.trace_id, _outcome_unknown(job), release=held.release)
            held.released = True
            await self._wake(job)
            return
        if tool is not None and tool.side_effects:
            await self.store.append(
                job.trace_id,
                ToolStarted(turn_id=job.turn_id, call_id=job.call_id, name=job.name, worker=self.worker_name, job=ref),
            )
        result = await self._run_tracked(job)
        await self._record(job, result, held)

    async def _record(self, job: ToolJob, result: ToolOutput, held) -> None:
        key = (job.trace_id, job.call_id)
        # the wake-up goes in the append's round trip; one that failed is sent again (and raises) below
        hints = [operations.wake_entry(self.keys, job.trace_id, f"result:{job.call_id}", owner=job.wake_to)]
        unsent: list[operations.Hint] = []
        try:
            if result.error == CANCELLED:  # the loop's own cancelled result may be first
                await self.store.append(job.trace_id, result, release=held.release, hints=hints, failed_hints=unsent)
            else:
                _, late = await self.store.append_result(
                    job.trace_id,
                    result,
                    self._events.get(key, ()),
                    release=held.release,
                    hints=hints,
                    failed_hints=unsent,
                )
                if late:
                    self.late += 1
                    metrics.LATE_RESULTS.labels(tool=job.name).inc()
                    log.info(
                        "call %s of trace %s was answered before its result came; recorded it as late",
                        job.call_id,
                        job.trace_id,
                    )
        except BaseException:
            self._unrecorded[key] = result
            raise
        held.released = True
        self._events.pop(key, None)
        if unsent:
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
            tool = self.tool(job.name)
            if tool is not None and tool.is_async:
                task.cancel()
            log.info("told call %s (tool %s) of trace %s that its turn was cancelled", job.call_id, job.name, trace_id)

    async def on_dead_job(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A job that failed on every delivery: its call gets an error result the model can see."""
        try:
            job = codec.decode_job(fields.get(JOB_FIELD) or b"")
        except Exception:  # any bytes: no call to answer, the dead-letter stream keeps the entry
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
        tool = self.tool(job.name)
        started = time.perf_counter()
        elements: tuple = ()
        error: str | None
        too_large = tool_arguments_refusal(job.name, job.arguments, self.limits)
        if tool is None:
            names = ", ".join(sorted([*self.app.tools, *(self.mcp.tool_names() if self.mcp else ())])) or "none"
            value_text, data, error = (
                f"Error: there is no tool named {job.name!r}. Available tools: {names}.",
                None,
                "unknown_tool",
            )
            elements = ()
        elif too_large is not None:
            value_text, data, error, elements = too_large, None, "arguments_too_large", ()
        else:
            value = await invoke_tool(tool, job.arguments)
            # a lone surrogate or bytes anywhere in the result: made readable, never a reason to drop it
            value_text, data, error, elements = readable_result(value.text, value.data, value.error, value.elements)
            events = tuple(value.events)
            unstorable = self._unstorable(job.name, value_text, data, error, elements)
            if unstorable is not None:  # recorded as an error result now, not retried on every delivery
                value_text, data, error, elements, events = f"Error: {unstorable}", None, "invalid_result", (), ()
                log.warning(
                    "tool %s call %s of trace %s returned an unstorable result: %s",
                    job.name,
                    job.call_id,
                    job.trace_id,
                    unstorable,
                )
            if elements or events:
                problem = self._invalid(job.name, elements, events)
                if problem is not None:
                    value_text, data, error, elements, events = f"Error: {problem}", None, "invalid_result", (), ()
                    log.warning(
                        "tool %s call %s of trace %s returned an invalid result: %s",
                        job.name,
                        job.call_id,
                        job.trace_id,
                        problem,
                    )
            if events:
                self._events[(job.trace_id, job.call_id)] = events
            too_large = tool_result_refusal(job.name, value_text, data, self.limits)
            if too_large is not None:
                value_text, data, error, elements = too_large, None, "result_too_large", ()
                self._events.pop((job.trace_id, job.call_id), None)
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
            elements=elements,
        )

    def _unstorable(self, name: str, text: str, data: object, error: str | None, elements: tuple) -> str | None:
        """Why a tool's result cannot be stored in the trace and read back (a lone UTF-16
        surrogate in its text or error, a value JSON has no form for in its data), or None."""
        problem = self.store.codec.unstorable(
            ToolOutput(turn_id="", call_id="", name=name, text=text, data=data, error=error, elements=elements)
        )
        return (
            None
            if problem is None
            else f"tool {name!r} returned a result that cannot be stored ({problem}); none of it was recorded"
        )

    def _invalid(self, name: str, elements: tuple, events: tuple) -> str | None:
        """What is wrong with the elements and events a tool returned, or None (see agentstream.wire.registry)."""
        try:
            check_elements(elements, self.app.types, where=f"the result of tool {name!r}")
        except ValueError as exc:
            return str(exc)
        for index, event in enumerate(events):
            if type(event) not in self.app.types.event_types:
                names = ", ".join(c.__name__ for c in self.app.types.event_types) or "none"
                return (
                    f"tool {name!r} returned event {index}, a {type(event).__name__}, which is not one of the app's own "
                    f"event types (registered: {names}; add it to App(event_types=...))"
                )
            problem = self.store.codec.unstorable(event)
            if problem is not None:
                return (
                    f"tool {name!r} returned event {index} ({type(event).__name__}), which cannot be stored: {problem}"
                )
        return None

    async def _wake(self, job: ToolJob) -> None:
        # to the agent loop that published the job while it is alive (it holds the fold), else any
        await operations.wake_trace(self.redis, self.keys, job.trace_id, f"result:{job.call_id}", owner=job.wake_to)


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
