"""What a step leaves to publish: turns' replies (once each), tool jobs, and the release of the lease
with them.

A part of :class:`agentstream.agent_loop.loop.AgentLoop`.
"""

from __future__ import annotations

from agentstream.agent_loop._base import (
    LoopState,
    _jobs_marker,
    _log_ending,
    _reply_of_ending,
    _unconfirm,
)
from agentstream.ops import tracing
from agentstream.runtime import operations
from agentstream.runtime.operations import Entry
from agentstream.runtime.watchdog import record_jobs
from agentstream.steps.decision import (
    final_stop_reason,
)
from agentstream.steps.effects import ended_note, jobs_note
from agentstream.steps.trace_fold import TraceFold
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.events import (
    ToolJob,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.keys import REPLY_FIELD


class Replies(LoopState):
    """What a step leaves to publish."""

    async def _missing_replies(
        self, trace_id: str, fold: TraceFold
    ) -> list[tuple[TurnInput | None, TurnEnded | TurnFailed]]:
        """The endings folded whose reply did not go out (level-triggered: a worker that died
        between a turn's ending and its reply left it unsent). Endings this process wrote need
        no look-up; the others are checked with one HMGET of their reply markers."""
        own: list[str] = []
        others: list[str] = []
        for turn_id in fold.unconfirmed:
            (own if fold.notes.get(ended_note(turn_id)) else others).append(turn_id)
        if others:
            sent = await operations.replies_sent(self.redis, self.keys, trace_id, others)
            for turn_id, marker in zip(others, sent, strict=True):
                if not marker:
                    own.append(turn_id)
                else:
                    fold.unconfirmed.pop(turn_id, None)
        out = []
        for turn_id in own:
            ending = fold.ending(turn_id)
            assert ending is not None
            out.append((fold.turn_input(turn_id), ending))
        return out

    async def _owed_replies(self, trace_id: str, fold: TraceFold, entries: list[Entry]) -> list[str]:
        """Add the missing replies to ``entries`` (with what their turns' ends tell other traces)
        → their markers (to be set once the XADDs ran)."""
        marks = []
        for turn, ending in await self._missing_replies(trace_id, fold):
            stop_reason = fold.final_stop_reason(ending.turn_id)
            reply = _reply_of_ending(trace_id, turn, ending, stop_reason)
            _log_ending(trace_id, ending, reply.stop_reason)
            stream = self._reply_stream(turn)
            with tracing.within(fold.notes.get(("context", ending.turn_id), {})):
                child = await self.children.turn_ended(entries, trace_id, turn, ending, events=fold.events)
            if not child:  # a child answers its parent instead
                entries.append((stream, {REPLY_FIELD: codec.encode(reply)}))
            marks.append(f"reply:{ending.turn_id}")
        return marks

    def _confirm(self, fold: TraceFold, marks: list[str]) -> None:
        for mark in marks:
            kind, _, rest = mark.partition(":")
            if kind == "reply":
                fold.unconfirmed.pop(rest, None)
                fold.notes.pop(ended_note(rest), None)
                fold.notes.pop(("context", rest), None)

    async def _publish_replies(self, trace_id: str, fold: TraceFold) -> None:
        """Publish the missing replies now (a new turn's model call is about to start)."""
        entries: list[Entry] = []
        marks = await self._owed_replies(trace_id, fold, entries)
        if not marks:
            return
        await operations.publish_replies(self.redis, self.keys, trace_id, entries, marks)
        self._confirm(fold, marks)

    async def _release(self, trace_id: str, token: int, fold: TraceFold, jobs: list) -> str:
        """Publish what waits (missing replies, tool jobs) and give the lease back, in one round
        trip: the replies and jobs first, then the markers that say they went out, then the
        release (kept when a hint came meanwhile: ``"dirty"``)."""
        entries: list[Entry] = []
        marks = await self._owed_replies(trace_id, fold, entries) if fold.unconfirmed else []
        first = len(entries)  # the replies' entries come first; then the jobs
        for turn_id, step, step_jobs in jobs:  # their marker in the key hash: a step's jobs go out once
            entries.extend((stream, {field: payload}) for _call_id, stream, field, payload in step_jobs)
            marks.append(_jobs_marker(turn_id, step))
        # The fold is this process's, shared with the next task here that takes the lease; once
        # Redis has run the release, such a task (a cancel's or a wake-up's hint) may take the
        # lease before this one has the answer (on a cluster the pipeline also waits on the other
        # nodes), and must find what went out already noted, or it publishes it again: noted
        # first, and undone when the release failed.
        self._confirm(fold, marks)
        for turn_id, step, _step_jobs in jobs:
            fold.notes[jobs_note(turn_id, step)] = True
        try:
            outcome, entry_ids = await self.store.publish_and_release(trace_id, token, entries, marks=marks)
        except BaseException:
            _unconfirm(fold, marks)
            raise
        ids = iter(entry_ids[first:])
        for turn_id, _step, step_jobs in jobs:
            # where each job went, for the watchdog of waiting turns
            sent = [(call_id, stream, next(ids)) for call_id, stream, _, _ in step_jobs]
            await record_jobs(self.redis, self.keys, trace_id, turn_id, sent)
        return outcome

    def _jobs(
        self, trace_id: str, fold: TraceFold, turn: TurnInput, agent, calls
    ) -> list[tuple[str, str, bytes, bytes]]:
        """The tool jobs of a step's calls: ``[(call id, stream, field, payload)]``."""
        offers = fold.offers_of(agent.name)  # an MCP tool's queue: as the agent's calls last offered it
        out = []
        for call in calls:
            tool = agent.tool(call.name)
            queue = tool.queue if tool is not None else (self.mcp.queue_of(agent, offers, call.name) or "default")
            job = ToolJob(
                trace_id=trace_id,
                turn_id=turn.turn_id,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                trace_context=tracing.inject(),  # the tool call's span is a child of this step's
                wake_to=self.wake_owner,  # its result's wake-up comes back here, where the fold is
            )
            stream, field = self.children.job_stream(
                tool, queue, trace_id
            )  # a delegation goes to the delegation service
            out.append((call.id, stream, field, codec.encode(job)))
        return out

    async def _ensure_reply(
        self,
        trace_id: str,
        turn: TurnInput | None,
        ending: TurnEnded | TurnFailed,
        fold: TraceFold | None = None,
        *,
        events=None,
    ) -> None:
        """Publish the turn's reply once: a marker in the trace's key hash records that it went out.

        The reply carries the stop reason of the turn's last model output when it was not a
        normal stop (from ``fold``, or ``events``: the trace; read here when neither is given).
        """
        marker = f"reply:{ending.turn_id}"
        if await self.store.has_key(trace_id, marker):
            return
        if events is not None:
            stop_reason = final_stop_reason(events, ending.turn_id)
            known = events  # what the ending tells other traces: no read
        else:
            if fold is None:
                fold = await self._current_fold(trace_id)
            stop_reason = fold.final_stop_reason(ending.turn_id)
            known = fold.events
        reply = _reply_of_ending(trace_id, turn, ending, stop_reason)
        _log_ending(trace_id, ending, reply.stop_reason)
        stream = self._reply_stream(turn)
        entries: list[Entry] = []
        if not await self.children.turn_ended(
            entries, trace_id, turn, ending, events=known
        ):  # a child answers its parent instead
            entries.append((stream, {REPLY_FIELD: codec.encode(reply)}))
        # raises if any write failed (WRONGTYPE on reply_to...): not marked, retried
        await operations.publish_turn_end(self.redis, self.keys, trace_id, ending.turn_id, entries)
        if fold is not None:
            self._confirm(fold, [marker])

    async def _ensure_reply_unheld(
        self, trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, fold: TraceFold
    ) -> None:
        """:meth:`_ensure_reply` for a handler that does not hold the trace's lease.

        The step loop publishes the replies its own endings owe without asking Redis first (it
        wrote them; nobody else publishes under its lease), so a reply published here outside the
        lease, between an ending and the holder's release, went out twice. The marker is read
        first (the common case: sent long ago); when it is missing the reply goes out under the
        lease, or, when the lease is held (its holder publishes the reply), this raises
        :class:`~agentstream.errors.Deferred` and the entry comes back once that lease would
        have expired.
        """
        if await self.store.has_key(trace_id, f"reply:{ending.turn_id}"):
            return
        async with self._lease(trace_id):
            await self._ensure_reply(trace_id, turn, ending, fold)

    def _reply_stream(self, turn: TurnInput | None) -> str:
        """Where a turn's reply goes: its ``reply_to`` when the wire's rules allow it (checked again
        here, for turns stored before a rule changed), else the default replies stream."""
        wanted = turn.reply_to if turn is not None else None
        if wanted and wire.reply_stream_refusal(wanted, self.keys, self.limits) is None:
            return wanted
        return self.keys.replies
