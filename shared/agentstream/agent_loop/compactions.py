"""The agent loop's side of compaction: send a model call, or have its summary written first.

See :mod:`agentstream.steps.summarising`: when a built call needs a summary, the loop publishes one
compaction job (a marker in the trace's key hash makes it once) and lets the trace go; the
compaction service's outcome wakes it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agentstream.context import BuiltContext, ChatRequest
from agentstream.declarations.agents import Agent
from agentstream.ops import tracing
from agentstream.runtime import operations
from agentstream.runtime.store import TraceStore
from agentstream.steps.summarising import CompactionJob, Summarise, job_marker, next_call
from agentstream.wire import codec
from agentstream.wire.events import Event

log = logging.getLogger("agentstream.agent_loop")


class Compactions:
    """Decides, for the agent loop, whether a built model call goes out now.

    Args:
        store: the trace store.
        wake_owner: the agent-loop consumer its jobs name as the owner of the wake-up that
            follows the summary (``CompactionJob.wake_to``); ``""``: none.
    """

    def __init__(self, store: TraceStore, *, wake_owner: str = ""):
        self.store = store
        self.keys = store.keys
        self.wake_owner = wake_owner

    async def request_for(
        self, trace_id: str, built: BuiltContext, events: Sequence[Event], agent: Agent
    ) -> ChatRequest | None:
        """The request to send, or None when a summary must be written first (its job is published).

        Raises:
            CompactionError: the summary of this call was empty or would replace nothing.
            ContextFullError: the call does not fit, and no summary can make room.
        """
        decision = next_call(built, events, agent, trace_id=trace_id)
        if isinstance(decision, Summarise):
            await self._publish(trace_id, decision, built.step)
            return None
        if decision.trimmed:
            log.warning(
                "trace %s turn %s: the summary failed (see its compaction_failed event); the call goes out "
                "with the oldest history trimmed instead",
                trace_id,
                built.turn_id,
            )
        return decision.request

    async def _publish(self, trace_id: str, decision: Summarise, step: int) -> None:
        plan = decision.plan
        marker = job_marker(plan.turn_id, plan.kept_from_turn)
        if await self.store.has_key(trace_id, marker):
            return
        job = CompactionJob(
            trace_id=trace_id,
            turn_id=plan.turn_id,
            step=step,
            kept_from_turn=plan.kept_from_turn,
            trace_context=tracing.inject(),  # the compaction's span is a child of the asking step's
            wake_to=self.wake_owner,  # the summary's wake-up comes back here, where the fold is
        )
        await operations.publish_compaction(self.store.redis, self.keys, trace_id, codec.encode(job), marker)
        log.info(
            "trace %s turn %s: the context is over the compaction threshold; asked for a summary of %d turn(s)",
            trace_id,
            plan.turn_id,
            len(plan.new_turns),
        )
