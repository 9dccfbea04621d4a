"""Events → the chat request of one model call: a pure function of the trace and the config.

No I/O, no clock, no randomness: the same events, agent and model give the same request, in
any process. The rules it keeps (tested as properties):

- every assistant tool call is followed by exactly one result, in call order, before the next
  user or assistant message; a result is matched by call id whatever order results arrived in,
  and the first result for a call id wins; a result with no matching call is never shown;
- a call that never got a result (the worker died, the turn was cancelled or failed) gets a
  synthetic error result saying so, once the conversation has moved past it;
- the system prompt is always first; after it, history starts on a user message.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentstream.app import Agent
from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    Message,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)
from agentstream.errors import UnrenderedEventError
from agentstream.events import Event, ModelOutput, ToolOutput, TurnEnded, TurnFailed, TurnInput

MISSING_RESULT_TEXT = (
    "Error: this tool call has no result: it was interrupted before it finished "
    "(the turn ended, failed or was cancelled). It may have partly run."
)


def build_messages(events: Sequence[Event], *, upto_turn: str | None = None) -> tuple[Message, ...]:
    """Trace events (in trace order) → the history messages.

    Turns are shown one after another in the order their inputs entered the trace, each with
    all its own events, so a turn queued behind a running one does not appear in the middle of
    it. A tool result counts only if it was appended before its turn ended: a late result (after
    a cancel, a crash or a failure) never moves into an older turn.

    Args:
        events: the trace's events, oldest first.
        upto_turn: show only the turns up to and including this one (the turn being answered);
            None shows every turn.

    Raises:
        UnrenderedEventError: an event type that no rule renders.
    """
    by_turn: dict[str, list[Event]] = {}
    order: list[str] = []
    ended: set[str] = set()
    results: dict[str, ToolOutput] = {}
    for event in events:
        match event:
            case TurnInput(turn_id=turn_id):
                if turn_id not in by_turn:
                    order.append(turn_id)
                    by_turn[turn_id] = [event]
                continue
            case ToolOutput(turn_id=turn_id, call_id=call_id):
                if turn_id not in ended:
                    results.setdefault(call_id, event)
                continue
            case TurnEnded(turn_id=turn_id) | TurnFailed(turn_id=turn_id):
                ended.add(turn_id)
                continue
            case ModelOutput(turn_id=turn_id):
                bucket = by_turn.get(turn_id)
                if bucket is not None:
                    bucket.append(event)
                continue
            case _:
                raise UnrenderedEventError(f"no renderer for event type {type(event).__name__}")

    if upto_turn is not None and upto_turn in by_turn:
        order = order[: order.index(upto_turn) + 1]

    messages: list[Message] = []
    for turn_id in order:
        for event in by_turn[turn_id]:
            if isinstance(event, TurnInput):
                messages.append(UserMessage(text=event.text))
                continue
            assert isinstance(event, ModelOutput)
            if not event.tool_calls and not event.content.strip():
                continue  # an empty reply (retried) is not replayed: providers refuse empty turns
            messages.append(
                AssistantMessage(
                    content=event.content,
                    tool_calls=event.tool_calls,
                    reasoning=event.reasoning,
                    provider=event.provider,
                    model=event.model,
                    replay_blocks=event.replay_blocks,
                )
            )
            for call in event.tool_calls:
                result = results.get(call.id)
                if result is not None:
                    messages.append(
                        ToolResultMessage(call_id=call.id, name=call.name, text=result.text, is_error=result.error is not None)
                    )
                else:
                    messages.append(ToolResultMessage(call_id=call.id, name=call.name, text=MISSING_RESULT_TEXT, is_error=True))
    return tuple(messages)


def tool_definitions(agent: Agent) -> tuple[ToolDefinition, ...]:
    """The agent's tools, in declaration order (stable, so prompt caches survive)."""
    return tuple(ToolDefinition(name=t.name, description=t.description, parameters=t.parameters) for t in agent.tools)


def build_request(events: Sequence[Event], agent: Agent, *, turn_id: str, step: int) -> ChatRequest:
    """The request of model call ``step`` (0-based) of turn ``turn_id``, from the events before it.

    Args:
        events: the trace's events up to (not including) the model output of this call.
        turn_id: the turn being answered; later (queued) turns are not shown.
        agent: the agent answering the turn.
        step: the pass number within the turn, which sets the tool choice (the last pass under
            the passes cap offers no tools, so the model must answer).

    Raises:
        UnrenderedEventError: see :func:`build_messages`.
    """
    choice = agent.tool_choice_for(step)
    return ChatRequest(
        system=agent.system_prompt,
        messages=build_messages(events, upto_turn=turn_id),
        tools=tool_definitions(agent) if choice != "none" else (),
        tool_choice=choice,
        max_output_tokens=agent.max_output_tokens,
        temperature=agent.temperature,
    )
