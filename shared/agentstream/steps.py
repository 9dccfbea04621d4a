"""Deciding a trace's next step: a pure function of its events and the app.

The agent loop is level-triggered: whatever hint woke it (a new turn, a tool result, a
redelivered entry after a crash), it reads the trace and asks :func:`decide` what to do next.
Running the same decision twice is harmless because every append is once-only by key.

Turns of one trace are answered one at a time, in the order their inputs entered the trace;
a turn published while another runs waits behind it.

A turn with a CancelRequested ends as cancelled at its next step, whatever it was waiting on:
every call of the turn still without a result gets a synthetic cancelled result (so the
history stays valid: field case C27), then the turn fails with code ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agentstream.app import Agent
from agentstream.context import reopen_result
from agentstream.delegation import offered_agent
from agentstream.events import (
    CancelRequested,
    Event,
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.models.endpoints import ModelEndpoint

EMPTY_REPLY_RETRIES = 1

_ABNORMAL_STOPS = {
    "unknown": "ended for a reason agentstream does not know",
    "pause": "was paused by the provider (continuing a paused turn is not supported)",
    "interrupted": "was interrupted before the reply completed",
}
"""Stop reasons that end the turn as failed (besides refusal and content filter)."""
"""How many times an empty model reply is retried before the turn fails."""


@dataclass(frozen=True)
class CallModel:
    """Call the model for pass ``step`` of the turn."""

    turn: TurnInput
    agent: Agent
    step: int


@dataclass(frozen=True)
class RecordResults:
    """Append these results (calls that must not run: unknown tool, cut-off arguments)."""

    turn: TurnInput
    results: tuple[ToolOutput, ...]


@dataclass(frozen=True)
class RunTools:
    """Tool calls of pass ``step`` still lack results: make sure their jobs are published."""

    turn: TurnInput
    agent: Agent
    step: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class EndTurn:
    turn: TurnInput
    answer: str


@dataclass(frozen=True)
class FailTurn:
    turn: TurnInput
    code: str
    reason: str


@dataclass(frozen=True)
class CancelTurn:
    """The turn was cancelled: record ``results`` (calls left without one), then end it."""

    turn: TurnInput
    results: tuple[ToolOutput, ...]
    code: str
    reason: str


@dataclass(frozen=True)
class Idle:
    """No turn is waiting for this trace."""


Decision = CallModel | RecordResults | RunTools | EndTurn | FailTurn | CancelTurn | Idle

CANCELLED_CODE = "cancelled"
"""The TurnFailed code of a cancelled turn."""


def final_stop_reason(events: Sequence[Event], turn_id: str) -> str | None:
    """The stop reason of the turn's last model output when it was not a normal stop (``length``:
    cut off by the output token limit), else None (for the reply's ``stop_reason``)."""
    last = next((e for e in reversed(events) if isinstance(e, ModelOutput) and e.turn_id == turn_id), None)
    return last.stop_reason if last is not None and not last.stopped_normally else None


def active_turn(events: Sequence[Event]) -> TurnInput | None:
    """The oldest turn of the trace without an ending, or None."""
    ended = {e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))}
    for event in events:
        if isinstance(event, TurnInput) and event.turn_id not in ended:
            return event
    return None


def decide(
    events: Sequence[Event], agent_of: Callable[[str], Agent | None], endpoints: Mapping[str, ModelEndpoint] | None = None
) -> Decision:
    """The next step of the trace.

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        endpoints: the configured model endpoints by id (an agent without ``model_limits``
            gets its endpoint's, see :func:`agentstream.delegation.offered_agent`).
    """
    turn = active_turn(events)
    if turn is None:
        return Idle()
    cancel = next((e for e in events if isinstance(e, CancelRequested) and e.turn_id == turn.turn_id), None)
    if cancel is not None:
        return cancel_turn(events, turn, cancel)
    agent = agent_of(turn.agent)
    if agent is None:
        return FailTurn(turn, "unknown_agent", f"no agent named {turn.agent!r} in this app")
    offered = offered_agent(agent, turn, endpoints)  # a child's model and depth: delegations withheld at the limit
    outputs = [e for e in events if isinstance(e, ModelOutput) and e.turn_id == turn.turn_id]
    if not outputs:
        return CallModel(turn, offered, 0)
    last = outputs[-1]
    results = {e.call_id for e in events if isinstance(e, ToolOutput) and e.turn_id == turn.turn_id}

    if last.stop_reason in ("refusal", "content_filter"):
        detail = f": {last.stop_detail}" if last.stop_detail else ""
        what = "refused" if last.stop_reason == "refusal" else "was stopped by the provider's content filter"
        return FailTurn(turn, last.stop_reason, f"the model {what}{detail}")

    if last.stop_reason in _ABNORMAL_STOPS:  # C14: never taken for a success, its tool calls never run
        detail = f" ({last.stop_detail})" if last.stop_detail else ""
        return FailTurn(turn, last.stop_reason, f"model call {last.step} {_ABNORMAL_STOPS[last.stop_reason]}{detail}")

    if last.tool_calls:
        unrunnable = []
        for call in last.tool_calls:
            if call.id in results:
                continue
            if last.stop_reason == "length":
                unrunnable.append(
                    _error_result(turn, call, "cut_off", "Error: your reply was cut off by the output token limit "
                                  "in the middle of this tool call, so it was not run. Make the arguments shorter.")
                )
            elif (reopened := reopen_result(events, agent, turn.turn_id, call)) is not None:
                unrunnable.append(reopened)  # the context library's reopen tool: recorded here, run nowhere
            elif agent.tool(call.name) is None:
                names = ", ".join(t.name for t in agent.tools) or "none"
                unrunnable.append(
                    _error_result(turn, call, "unknown_tool", f"Error: there is no tool named {call.name!r}. "
                                  f"Available tools: {names}.")
                )
        if unrunnable:
            return RecordResults(turn, tuple(unrunnable))
        pending = tuple(c for c in last.tool_calls if c.id not in results)
        if pending:
            return RunTools(turn, agent, last.step, pending)
        if len(outputs) >= agent.max_passes:
            return FailTurn(
                turn,
                "passes_cap",
                f"the agent {agent.name!r} reached its passes cap of {agent.max_passes} model calls "
                "without a final answer; raise max_passes or simplify the task",
            )
        return CallModel(turn, offered, last.step + 1)

    if last.stop_reason == "length" and not last.content.strip():
        return FailTurn(turn, "cut_off", "the model's reply was cut off by the output token limit before any answer")
    if not last.content.strip():
        empty_in_a_row = 0
        for output in reversed(outputs):
            if output.tool_calls or output.content.strip():
                break
            empty_in_a_row += 1
        if empty_in_a_row <= EMPTY_REPLY_RETRIES and len(outputs) < agent.max_passes:
            return CallModel(turn, offered, last.step + 1)
        return FailTurn(turn, "empty_reply", f"the model gave an empty reply {empty_in_a_row} times in a row")
    return EndTurn(turn, last.content.strip())


def cancel_turn(events: Sequence[Event], turn: TurnInput, cancel: CancelRequested) -> CancelTurn:
    """The cancel of ``turn``: a cancelled result for each of its calls without one, and the reason."""
    who = f"by {cancel.by}" if cancel.by else ""
    why = f": {cancel.reason}" if cancel.reason else ""
    results = unanswered_results(
        events, turn, CANCELLED_CODE, f"Cancelled {who}{why} before this call returned a result; it may have partly run."
    )
    return CancelTurn(turn, results, CANCELLED_CODE, f"the turn was cancelled {who}{why}".rstrip())


def unanswered_results(events: Sequence[Event], turn: TurnInput, error: str, text: str) -> tuple[ToolOutput, ...]:
    """An error result (``error``, ``text``) for each call of ``turn`` that has no result yet, in
    call order: what a turn that ends early appends first, so no call is left dangling."""
    answered = {e.call_id for e in events if isinstance(e, ToolOutput) and e.turn_id == turn.turn_id}
    results = []
    for event in events:
        if not isinstance(event, ModelOutput) or event.turn_id != turn.turn_id:
            continue
        for call in event.tool_calls:
            if call.id in answered:
                continue
            answered.add(call.id)
            results.append(_error_result(turn, call, error, text))
    return tuple(results)


def _error_result(turn: TurnInput, call: ToolCall, error: str, text: str) -> ToolOutput:
    return ToolOutput(turn_id=turn.turn_id, call_id=call.id, name=call.name, text=text, error=error)
