"""The delegation service: opens child traces for delegation calls and hands their results back.

A thin shell around :mod:`agentstream.delegation`. Both hints it takes are level-triggered:

- a delegation job (a call of a delegation tool): read what the parent's trace gained since this
  process last looked (its fold, :class:`agentstream.runtime.fold_reader.FoldReader`); append the error
  result the call gets instead of a child, or open the child: note its deadline, append its
  TaskInput (once, by the task's turn id) and wake it;
- a child ending: read the child's trace; append its result to the parent's trace (once, by
  call id) and wake the parent.

The :class:`Supervisor` ends every child that passes its deadline with exactly one TurnFailed
(code ``timed_out``) and hands it back, so the parent hears even when the child's worker died.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from agentstream.declarations.apps import App
from agentstream.delegation import (
    Delegation,
    HandOff,
    decode_child_ended,
    delegations_of,
    descendants_refused,
    ending_of,
    hand_back,
    hand_off,
    task_of,
    timed_out,
)
from agentstream.ops import logs, metrics, tracing
from agentstream.runtime import operations
from agentstream.runtime.connection import COMMAND_ERRORS
from agentstream.runtime.fold_reader import FoldReader
from agentstream.runtime.reports import report_error
from agentstream.runtime.store import TraceStore
from agentstream.steps.trace_fold import FoldCache, TraceFold
from agentstream.wire import codec
from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits, tool_result_refusal
from agentstream.wire.events import CancelMessage, TaskInput, ToolCall, ToolJob, ToolOutput
from agentstream.wire.keys import ENDING_FIELD, JOB_FIELD, Keys

log = logging.getLogger("agentstream.delegation")

_SWEEP_ERRORS: tuple[type[Exception], ...] = (*COMMAND_ERRORS, OSError)
"""What a supervisor's sweep backs off and retries on: a Redis error, or the socket's."""


class Delegator:
    """Handles delegation jobs and child endings.

    Args:
        app: the user's app (its delegations).
        store: the trace store.
        max_descendants: the most child traces one root trace may open, all levels together.
        fold_cache_bytes: the most bytes of memory (as measured) of parent traces kept folded
            (:class:`agentstream.runtime.fold_reader.FoldReader`).
    """

    def __init__(
        self,
        app: App,
        store: TraceStore,
        *,
        max_descendants: int = 100,
        limits: WireLimits = DEFAULT_LIMITS,
        fold_cache_bytes: int = 64 * 1024 * 1024,
    ):
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.delegations = delegations_of(app)
        self.max_descendants = max_descendants
        self.limits = limits
        self.folds = FoldReader(store, FoldCache(fold_cache_bytes))  # parents folded: a delegation reads what is new

    # --- hints ------------------------------------------------------------------------------

    async def on_delegation(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A delegation job: open its child, or give the call its error result."""
        try:
            job = codec.decode_job(codec.entry_field(fields, JOB_FIELD))
        except msgspec.DecodeError as exc:
            await self._malformed(
                "delegation job",
                entry_id,
                codec.entry_shown(fields, JOB_FIELD),
                exc,
                source=stream or self.keys.delegations,
            )
            return
        attributes = {
            "agentstream.trace_id": job.trace_id,
            "agentstream.turn_id": job.turn_id,
            "agentstream.delegation": job.name,
            "gen_ai.tool.call.id": job.call_id,
        }
        with (
            logs.bind(trace_id=job.trace_id, turn_id=job.turn_id, call_id=job.call_id),
            tracing.span("agentstream.delegation", parent=job.trace_context, kind="consumer", attributes=attributes),
        ):  # a child of the step that published the job (OpenTelemetry)
            await self.open(job, entry_id=entry_id, source=stream or self.keys.delegations)

    async def on_child_ended(self, entry_id: str, fields: dict[bytes, bytes], *, stream: str | None = None) -> None:
        """A child ending: hand the child's result back to its parent."""
        try:
            ending = decode_child_ended(codec.entry_field(fields, ENDING_FIELD))
        except msgspec.DecodeError as exc:
            await self._malformed(
                "child ending",
                entry_id,
                codec.entry_shown(fields, ENDING_FIELD),
                exc,
                source=stream or self.keys.child_endings,
            )
            return
        with (
            logs.bind(trace_id=ending.trace_id),
            tracing.span(
                "agentstream.hand_back",
                parent=ending.trace_context,
                kind="consumer",
                attributes={"agentstream.trace_id": ending.trace_id},
            ),
        ):  # a child of the child's last step (OpenTelemetry)
            await self.give_back(ending.trace_id)

    async def on_dead_delegation(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        """A delegation job that failed on every delivery: the call gets an error result."""
        try:
            job = codec.decode_job(fields.get(JOB_FIELD) or b"")
        except msgspec.DecodeError:
            return
        await self._result(
            job.trace_id,
            ToolOutput(
                turn_id=job.turn_id,
                call_id=job.call_id,
                name=job.name,
                error="dead_letter",
                text=f"Error: the delegation {job.name!r} could not be started (it failed on every try: {error}).",
            ),
        )

    async def _malformed(self, what: str, entry_id: str, payload: bytes | None, exc: Exception, *, source: str) -> None:
        log.error("dropping malformed %s %s: %s", what, entry_id, exc)
        await report_error(
            self.redis,
            self.keys,
            f"malformed {what} {entry_id}: {exc}",
            payload,
            self.limits,
            source=source,
            entry=entry_id,
        )

    # --- hand-off -----------------------------------------------------------------------------

    async def open(self, job: ToolJob, *, entry_id: str = "", source: str = "") -> None:
        """Open the child of a delegation call once (or record why it gets none).

        A job that names no call of its parent's running turn (no such trace or turn, a call the
        turn never made, a call of another tool or with other arguments: the job is a hint, the
        parent's trace says what was called) opens nothing and writes nothing; it is reported on
        the errors stream (``entry_id`` and ``source``: the job's entry and stream, named there).
        """
        parent = job.trace_id
        if await self.store.has_key(parent, f"result:{job.call_id}"):
            await self._wake(parent, f"result:{job.call_id}")
            return
        fold = await self.folds.current(parent)  # what came since this process last looked at the parent
        if fold.ending(job.turn_id) is not None:
            log.info("delegation %s of trace %s: the parent's turn already ended; no child opened", job.call_id, parent)
            return
        problem = fold.job_problem(
            job.trace_id, job.turn_id, job.call_id, job.name, job.arguments
        )  # O(the turn), not O(the trace)
        if problem:
            if not fold.events:
                self.folds.folds.forget(parent)  # no such trace: keep no fold of it
            log.warning(
                "dropping delegation job %s (delegation %s, call %s): %s",
                entry_id or "?",
                job.name,
                job.call_id,
                problem,
            )
            await report_error(
                self.redis,
                self.keys,
                f"delegation job {entry_id or '?'} names no call that may run: {problem}",
                codec.encode(job),
                self.limits,
                source=source or self.keys.delegations,
                entry=entry_id,
            )
            return
        delegation = self.delegations.get(job.name)
        call = _call(fold, job)
        if delegation is None:
            known = ", ".join(sorted(self.delegations)) or "none"
            await self._result(
                parent,
                ToolOutput(
                    turn_id=job.turn_id,
                    call_id=job.call_id,
                    name=job.name,
                    error="unknown_tool",
                    text=f"Error: there is no delegation named {job.name!r}. Delegations: {known}.",
                ),
            )
            return
        outcome = hand_off(
            delegation,
            parent,
            fold.events,
            call,
            job.turn_id,
            numbering=fold.numbering(),
            turn=fold.turn_input(job.turn_id),
            child=self.app.agent(delegation.agent),
        )
        if isinstance(outcome, ToolOutput):
            log.info("delegation %s of trace %s refused: %s", job.call_id, parent, outcome.error)
            await self._result(parent, outcome)
            return
        if not await operations.admit_child(
            self.redis, self.keys, outcome.task.root_trace_id, outcome.child_trace_id, self.max_descendants
        ):
            await self._result(parent, descendants_refused(delegation, call, job.turn_id, self.max_descendants))
            return
        if not await self._start(outcome, delegation, entry_id=entry_id, source=source):
            return
        if await self.store.has_key(parent, f"end:{job.turn_id}"):
            # the parent ended while the child was being opened: the child must not run on
            await self._cancel(outcome.child_trace_id, outcome.task.turn_id, f"its parent turn {job.turn_id!r} ended")

    async def _start(self, handoff: HandOff, delegation: Delegation, *, entry_id: str = "", source: str = "") -> bool:
        """Open the child trace with its task and wake it → False when the child's id is taken.

        A child trace's first event is its task. A trace of that id that begins otherwise was
        begun by someone else (a client that published a root turn under ``<trace>/<call id>``
        before the call came): its history would be the subagent's context and its first turn
        would hide the task from the hand-back. The task is not added; the parent's call gets an
        error result and the errors stream says which trace.
        """
        child = handoff.child_trace_id
        first = await self.store.read(child, count=1)
        if first and not _opens(first[0][1], handoff.task):
            error = (
                f"delegation {delegation.name!r} (call {handoff.task.call_id} of trace {handoff.task.parent_trace_id!r}) "
                f"could not open its child trace {child!r}: that trace already begins with a "
                f"{type(first[0][1]).__name__} that is not this task (entry {first[0][0]}); the task did not run"
            )
            log.warning("%s", error)
            await report_error(
                self.redis,
                self.keys,
                error,
                None,
                self.limits,
                source=source or self.keys.delegations,
                entry=entry_id,
                trace_id=child,
            )
            await self._result(
                handoff.task.parent_trace_id,
                ToolOutput(
                    turn_id=handoff.task.parent_turn_id,
                    call_id=handoff.task.call_id,
                    name=delegation.name,
                    error="child_trace_taken",
                    text=f"Error: {delegation.name!r} could not start: its child trace {child!r} is held by another "
                    "conversation. The task did not run; try the call again (a new call opens a new child trace).",
                ),
            )
            return False
        deadline_ms = int((time.time() + delegation.deadline_s) * 1000)
        await operations.set_child_deadline(self.redis, self.keys, child, deadline_ms)
        # the child's steps continue this delegation's OpenTelemetry trace (its metadata's traceparent)
        task = msgspec.structs.replace(handoff.task, metadata={**handoff.task.metadata, **tracing.inject()})
        appended = await self.store.append(child, task)
        if appended.created:
            metrics.DELEGATIONS.labels(agent=handoff.task.agent).inc()
            log.info(
                "opened child trace %s (depth %d) for call %s of trace %s",
                child,
                handoff.task.depth,
                handoff.task.call_id,
                handoff.task.parent_trace_id,
            )
        await self._wake(child, "task")
        return True

    # --- hand-back ----------------------------------------------------------------------------

    async def give_back(self, child: str) -> bool:
        """Append an ended child's result to its parent once and wake the parent.

        Returns:
            False when the child has not ended (or is not a child trace): nothing was done.
        """
        events = [e for _, e in await self.store.read(child)]
        task = task_of(events)
        if task is None or ending_of(events, task.turn_id) is None:
            return False
        parent = task.parent_trace_id
        if not await self.store.has_key(parent, f"result:{task.call_id}"):
            result = self._held_to_limit(hand_back(self.delegations.get(task.delegation), events))
            await self.store.append(parent, result)
            log.info(
                "handed back child trace %s to call %s of trace %s%s",
                child,
                task.call_id,
                parent,
                f" (error: {result.error})" if result.error else "",
            )
        await operations.clear_child_deadline(self.redis, self.keys, child)
        await self._wake(parent, f"result:{task.call_id}")
        return True

    async def expire(self, child: str) -> None:
        """End a child past its deadline (one TurnFailed, ``timed_out``) and hand it back."""
        events = [e for _, e in await self.store.read(child)]
        task = task_of(events)
        if task is None:  # its TaskInput never made it: a redelivered job opens it afresh
            await operations.clear_child_deadline(self.redis, self.keys, child)
            return
        if ending_of(events, task.turn_id) is None:
            appended = await self.store.append(child, timed_out(task))
            if appended.created:
                log.warning("child trace %s passed its deadline of %g s; ended it as timed out", child, task.deadline_s)
            # its own agent loop (if alive) sees the ending, cancels the child's children and stops
            await self._wake(child, "timed_out")
        await self.give_back(child)

    def _held_to_limit(self, result: ToolOutput) -> ToolOutput:
        """A child's result is a tool result: over ``AGENTSTREAM_MAX_TOOL_RESULT_BYTES`` (text and
        data, :func:`agentstream.wire.checks.tool_result_refusal`) it is replaced by an error result
        (``result_too_large``) that names the limit and the size, as the tool worker does; the
        child's own trace keeps what it wrote."""
        too_large = tool_result_refusal(result.name, result.text, result.data, self.limits)
        if too_large is None:
            return result
        log.warning(
            "the result of call %s (%s) is over AGENTSTREAM_MAX_TOOL_RESULT_BYTES: replaced by an error result",
            result.call_id,
            result.name,
        )
        return msgspec.structs.replace(result, text=too_large, data=None, error="result_too_large", elements=())

    # --- publishing ---------------------------------------------------------------------------

    async def _result(self, trace_id: str, result: ToolOutput) -> None:
        await self.store.append(trace_id, result)
        await self._wake(trace_id, f"result:{result.call_id}")

    async def _wake(self, trace_id: str, reason: str) -> None:
        await operations.wake_trace(self.redis, self.keys, trace_id, reason)

    async def _cancel(self, trace_id: str, turn_id: str, reason: str) -> None:
        message = CancelMessage(trace_id=trace_id, turn_id=turn_id, by="parent", reason=reason)
        await operations.request_cancel(self.redis, self.keys, message)


def _opens(first, task: TaskInput) -> bool:
    """Whether a child trace's first event is ``task`` (the same call of the same parent)."""
    return (
        isinstance(first, TaskInput)
        and first.call_id == task.call_id
        and first.parent_trace_id == task.parent_trace_id
        and first.turn_id == task.turn_id
    )


def _call(fold: TraceFold, job: ToolJob) -> ToolCall:
    """The call as the trace recorded it (the truth), else as the job carries it."""
    record = fold.turns.get(job.turn_id)
    for event in record.outputs if record is not None else ():
        for call in event.tool_calls:
            if call.id == job.call_id:
                return call
    return ToolCall(id=job.call_id, name=job.name, arguments=job.arguments)


class Supervisor:
    """Ends child traces that pass their deadline, in every delegation service process.

    Several supervisors may run at once: the ending is appended once (by the child's turn id)
    and the hand-back once (by the call id).

    Args:
        delegator: the delegator that ends and hands back.
        interval_ms: how often to look for children past their deadline.
        batch: the most children handled per look.
    """

    connections = (0, 0)
    """No blocking read and no handler: it sweeps every ``interval_ms`` (for the start-up check of
    the pool, :func:`agentstream.runtime.runner.runner_connections`)."""

    def __init__(self, delegator: Delegator, *, interval_ms: int = 1000, batch: int = 100):
        self.delegator = delegator
        self.redis = delegator.redis
        self.stream = delegator.keys.child_endings  # for the service runner's bookkeeping
        self.interval_s = interval_ms / 1000.0
        self.batch = batch
        self.expired = 0

    async def sweep(self, now_ms: int | None = None) -> int:
        """End and hand back every child whose deadline is before ``now_ms`` → how many."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        due = await operations.children_past_deadline(self.redis, self.delegator.keys, now_ms, self.batch)
        for child in due:
            with logs.bind(trace_id=child):
                await self.delegator.expire(child)
            self.expired += 1
        return len(due)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval_ms`` until ``stop`` is set; Redis errors back off and retry."""
        backoff_s = self.interval_s
        while not stop.is_set():
            try:
                await self.sweep()
                backoff_s = self.interval_s
            except _SWEEP_ERRORS as exc:
                log.warning("supervisor could not read the deadlines (%s); retrying in %.1f s", exc, backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
            try:
                await asyncio.wait_for(stop.wait(), timeout=backoff_s)
            except TimeoutError:
                pass
