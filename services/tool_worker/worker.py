"""The tool worker: runs tool jobs and records each result once.

A thin shell: a job is a hint (trace, call id, tool, raw arguments). The worker skips a call
whose result is already in the trace, runs the tool with its timeout (bad arguments and tool
failures become error results for the model, never a dead worker), appends the result keyed by
call id, and wakes the agent loop.
"""

from __future__ import annotations

import logging
import time

import msgspec

from agentstream import codec, logs, metrics
from agentstream.app import App
from agentstream.events import ToolJob, ToolOutput, Wake
from agentstream.keys import JOB_FIELD, WAKE_FIELD, Keys
from agentstream.store import TraceStore

log = logging.getLogger("agentstream.tool_worker")


class ToolWorker:
    """Handles tool jobs.

    Args:
        app: the user's app (its tools).
        store: the trace store.
    """

    def __init__(self, app: App, store: TraceStore):
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys

    async def on_job(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """One tool job: run it once and record its result."""
        payload = fields.get(JOB_FIELD)
        try:
            job = codec.decode_job(payload or b"")
        except msgspec.DecodeError as exc:
            log.error("dropping malformed tool job %s: %s", entry_id, exc)
            await self.redis.xadd(self.keys.errors, {b"error": f"malformed tool job {entry_id}: {exc}".encode(), b"payload": payload or b""})
            return
        with logs.bind(trace_id=job.trace_id, turn_id=job.turn_id, call_id=job.call_id):
            if await self.store.has_key(job.trace_id, f"result:{job.call_id}"):
                await self._wake(job)  # the result is in; make sure the loop heard about it
                return
            result = await self.run(job)
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
