"""The agent loop's side of delegation: where a delegation call goes, and what a turn's end
means for the traces around it.

- A call of a delegation goes to the delegations stream (the delegation service opens a child
  trace for it), not to a tool queue.
- A child trace's turn that ends publishes a child ending (the delegation service hands its
  result back to the parent) instead of a reply.
- A turn that fails (cancelled, timed out, given up) while children it opened still run
  cancels them; each child does the same for its own children when its cancel ends it, so a
  cancel reaches every descendant.
"""

from __future__ import annotations

from agentstream.declarations.apps import App
from agentstream.declarations.tools import Tool
from agentstream.delegation import ChildEnded, children_of, delegations_of
from agentstream.ops import tracing
from agentstream.runtime.operations import Entry
from agentstream.runtime.store import TraceStore
from agentstream.wire import codec
from agentstream.wire.events import CancelMessage, TaskInput, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.keys import CANCEL_FIELD, ENDING_FIELD, JOB_FIELD


class Children:
    """Routes delegation calls and child endings for one agent loop.

    Args:
        app: the user's app (which tools are delegations).
        store: the trace store.
    """

    def __init__(self, app: App, store: TraceStore):
        self.store = store
        self.keys = store.keys
        self.delegations = delegations_of(app)

    def job_stream(self, tool: Tool | None, queue: str, trace_id: str) -> tuple[str, bytes]:
        """The stream and field a call's job goes to (the trace's partition of it): the
        delegations stream for a delegation, else the tool queue's stream."""
        if tool is not None and tool.delegated:
            return self.keys.for_trace(self.keys.delegations, trace_id), JOB_FIELD
        return self.keys.tools_for(queue, trace_id), JOB_FIELD

    async def turn_ended(
        self,
        entries: list[Entry],
        trace_id: str,
        turn: TurnInput | None,
        ending: TurnEnded | TurnFailed,
        *,
        events=None,
    ) -> bool:
        """Add to ``entries`` what the end of ``turn`` tells other traces (the cancels of the
        children a failed turn leaves running, a child's ending), for the caller to publish
        (:func:`agentstream.runtime.operations.publish_turn_end`).

        Args:
            events: the trace's events when the caller has them folded (read here otherwise).

        Returns:
            True when the turn is a child's task: its ending went to the delegation service,
            and no reply is published.
        """
        if isinstance(ending, TurnFailed) and self.delegations and turn is not None:
            await self._cancel_children(entries, trace_id, turn, ending, events)
        if isinstance(turn, TaskInput):
            ending_hint = ChildEnded(trace_id=trace_id, turn_id=turn.turn_id, trace_context=tracing.inject())
            entries.append(
                (self.keys.for_trace(self.keys.child_endings, trace_id), {ENDING_FIELD: codec.encode(ending_hint)})
            )
            return True
        return False

    async def _cancel_children(
        self, entries: list[Entry], trace_id: str, turn: TurnInput, ending: TurnFailed, events=None
    ) -> None:
        if events is None:  # the caller's fold holds them, else the trace is read
            events = [e for _, e in await self.store.read(trace_id)]
        for child, child_turn in children_of(trace_id, events, turn.turn_id, self.delegations.__contains__):
            if await self.store.has_key(child, f"end:{child_turn}"):
                continue
            message = CancelMessage(
                trace_id=child,
                turn_id=child_turn,
                by="parent",
                reason=f"its parent turn {turn.turn_id!r} of trace {trace_id!r} ended ({ending.code})",
            )
            entries.append((self.keys.cancel, {CANCEL_FIELD: codec.encode(message)}))
