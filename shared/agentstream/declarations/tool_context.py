"""What a running tool can know about its call: ids, and whether its turn was cancelled.

The tool worker sets the context before it runs a tool; the tool reads it with
:func:`current_call` (sync tools run in a thread, which sees the same context)::

    from agentstream import current_call, tool

    @tool(timeout_s=600, side_effects=True)
    def deploy(service: str) -> str:
        "Deploy a service."
        for step in plan(service):
            current_call().raise_if_cancelled()   # stop between steps when the turn is cancelled
            step.run()
        return "deployed"

When a turn is cancelled, the worker sets :attr:`CallContext.cancelled` for each of its calls
it is running, and cancels the task of an async tool (it sees ``asyncio.CancelledError``). A
sync tool cannot be interrupted from outside: it should check the flag between steps. Whatever
it returns after the cancel is recorded as a late result, never shown to the model.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field

from agentstream.errors import ToolCancelled


@dataclass(frozen=True)
class CallContext:
    """The call a tool is running for.

    Attributes:
        trace_id: the conversation.
        turn_id: the turn of the call.
        call_id: the tool call's id (stable across re-deliveries: an idempotency key for the
            tool's own effects).
        name: the tool's name.
    """

    trace_id: str
    turn_id: str
    call_id: str
    name: str
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the call's turn was cancelled."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Mark the call cancelled (the tool worker does this when the turn is cancelled)."""
        self._cancel.set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~agentstream.errors.ToolCancelled` when the turn was cancelled."""
        if self._cancel.is_set():
            raise ToolCancelled(f"call {self.call_id} of trace {self.trace_id!r} was cancelled")


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("agentstream_tool_call", default=None)


def current_call() -> CallContext:
    """The call the running tool serves.

    Raises:
        LookupError: not inside a tool run by the tool worker.
    """
    call = _current.get()
    if call is None:
        raise LookupError("current_call() is only available inside a tool run by the agentstream tool worker")
    return call


def set_current_call(call: CallContext | None) -> contextvars.Token[CallContext | None]:
    """Set the current call for the running task (the tool worker's business)."""
    return _current.set(call)
