"""The agent loop: turns in, the next step of a trace out.

A thin shell: it receives a hint (a turn or a wake-up), reads the trace, asks the shared
library what to do (:func:`agentstream.steps.decide`), does it, and repeats until the trace
waits on something (tool results) or has no turn left. It holds a trace's lease (with a
fencing token) while it works on it, so one trace takes one step at a time; it never holds a
worker while tools run: their results wake it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from agentstream import codec, logs, metrics
from agentstream.app import App
from agentstream.context import ContextCache
from agentstream.errors import ContextError, ModelError, StaleLeaseError, TurnRejected
from agentstream.events import ModelOutput, Reply, ToolJob, TurnEnded, TurnFailed, TurnInput
from agentstream.keys import JOB_FIELD, REPLY_FIELD, TURN_FIELD, WAKE_FIELD, Keys
from agentstream.models.openai import OpenAIChatModel
from agentstream.steps import CallModel, EndTurn, FailTurn, Idle, RecordResults, RunTools, decide
from agentstream.store import TraceStore
from agentstream_services.agent_loop.children import Children

log = logging.getLogger("agentstream.agent_loop")


class AgentLoop:
    """Handles turns and wake-ups for every trace.

    Args:
        app: the user's app.
        store: the trace store.
        models: model clients by endpoint id (agents name them).
        lease_ttl_ms: the trace lease's time to live, renewed every third of it while held.
    """

    def __init__(self, app: App, store: TraceStore, models: dict[str, OpenAIChatModel], *, lease_ttl_ms: int = 30_000):
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.models = models
        self.children = Children(app, store)
        self.lease_ttl_ms = lease_ttl_ms
        self.contexts = ContextCache()  # folded traces: each step's rebuild costs what was added

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
        except TurnRejected as exc:
            await self._reject(entry_id, payload, exc)
            return
        appended = await self.store.append(
            turn.trace_id,
            TurnInput(turn_id=turn.turn_id, agent=turn.agent, text=turn.text, metadata=turn.metadata, reply_to=turn.reply_to),
        )
        if appended.created:
            metrics.TURNS_STARTED.labels(agent=turn.agent).inc()
        await self.advance(turn.trace_id)

    async def on_wake(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A wake-up: something was appended to a trace; advance it."""
        payload = fields.get(WAKE_FIELD)
        try:
            wake = codec.decode_wake(payload or b"")
        except msgspec.DecodeError as exc:
            log.error("dropping malformed wake-up %s: %s", entry_id, exc)
            await self.redis.xadd(self.keys.errors, {b"error": f"malformed wake-up {entry_id}: {exc}".encode(), b"payload": payload or b""})
            return
        await self.advance(wake.trace_id)

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
            return
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
            await self.store.release_lease(trace_id, token)
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
        decision = decide(events, self.app.agent)
        match decision:
            case Idle():
                await self._publish_missing_reply(trace_id, events)
                return False
            case CallModel(turn=turn, agent=agent, step=step):
                try:
                    request = self.contexts.request(trace_id, entries, agent, turn_id=turn.turn_id, step=step)
                except ContextError as exc:  # does not fit the window, or the agent's context settings are wrong
                    await self._end(trace_id, token, TurnFailed(turn_id=turn.turn_id, code="context", reason=str(exc)), turn)
                    return True
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
                    with metrics.MODEL_CALL_SECONDS.labels(model=agent.model).time():
                        output = await model.complete(request, turn_id=turn.turn_id, step=step)
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
        raise AssertionError(f"unhandled decision {decision!r}")

    async def _publish_jobs(self, trace_id: str, turn: TurnInput, agent, step: int, calls) -> None:
        """Publish the tool jobs of a step once (a marker in the trace's key hash says so)."""
        marker = f"jobs:{turn.turn_id}:{step}"
        if await self.store.has_key(trace_id, marker):
            return
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            tool = agent.tool(call.name)
            queue = tool.queue if tool is not None else "default"
            job = ToolJob(trace_id=trace_id, turn_id=turn.turn_id, call_id=call.id, name=call.name, arguments=call.arguments)
            stream, field = self.children.job_stream(tool, queue)  # a delegation goes to the delegation service
            pipe.xadd(stream, {field: codec.encode(job)})
        pipe.hset(self.keys.trace_keys(trace_id), marker, b"1")
        await pipe.execute()

    async def _end(self, trace_id: str, token: int, ending: TurnEnded | TurnFailed, turn: TurnInput) -> None:
        appended = await self.store.append(trace_id, ending, fence=token)
        if appended.created:
            if isinstance(ending, TurnEnded):
                metrics.TURNS_ENDED.labels(agent=turn.agent).inc()
            else:
                metrics.TURNS_FAILED.labels(agent=turn.agent, code=ending.code).inc()
        await self._ensure_reply(trace_id, turn, ending)

    async def _publish_missing_reply(self, trace_id: str, events) -> None:
        """Publish the reply of the newest ended turn unless it was published (level-triggered)."""
        for event in reversed(events):
            if isinstance(event, (TurnEnded, TurnFailed)):
                turn = next((e for e in events if isinstance(e, TurnInput) and e.turn_id == event.turn_id), None)
                await self._ensure_reply(trace_id, turn, event)
                return

    async def _ensure_reply(self, trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed) -> None:
        """Publish the turn's reply once: a marker in the trace's key hash records that it went out."""
        marker = f"reply:{ending.turn_id}"
        if await self.store.has_key(trace_id, marker):
            return
        if isinstance(ending, TurnEnded):
            reply = Reply(trace_id=trace_id, turn_id=ending.turn_id, status="ended", answer=ending.answer)
        else:
            reply = Reply(trace_id=trace_id, turn_id=ending.turn_id, status="failed", code=ending.code, reason=ending.reason)
        if turn is not None:
            reply.metadata = dict(turn.metadata)
        stream = (turn.reply_to if turn is not None else None) or self.keys.replies
        pipe = self.redis.pipeline(transaction=False)
        if not await self.children.turn_ended(pipe, trace_id, turn, ending):  # a child answers its parent instead
            pipe.xadd(stream, {REPLY_FIELD: codec.encode(reply)})
        pipe.hset(self.keys.trace_keys(trace_id), marker, b"1")
        await pipe.execute()
