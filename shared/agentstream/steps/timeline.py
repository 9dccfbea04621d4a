"""What a conversation is doing, read from its trace's events (pure: no Redis, no asyncio).

Used by the HTTP gateway's conversation list and its console: the state of a trace's newest
turn, which agents a trace's turns name (what an API key must be allowed to see it), and the
root conversation of a child trace.

States of the newest turn:

- ``running``: the turn entered and has no ending; no tool call of it is waiting for a result;
- ``waiting_on_tools``: its newest model output asked for tool calls that have no result yet
  (``pending_tools`` names them);
- ``ended``: ``turn_ended``; ``failed``: ``turn_failed`` (``code`` and ``reason`` say why);
  ``cancelled``: ``turn_failed`` with code ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentstream.steps.decision import final_stop_reason
from agentstream.wire.events import Event, ModelOutput, Reply, TaskInput, ToolOutput, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.failures import FailureCode

if TYPE_CHECKING:
    from agentstream.steps.trace_fold import TraceFold

TurnState = Literal["running", "waiting_on_tools", "ended", "failed", "cancelled"]

TEXT_PREVIEW_CHARS = 200
"""How much of a turn's text or answer a conversation summary carries."""


@dataclass(frozen=True)
class ConversationState:
    """The state of a conversation's newest turn.

    Attributes:
        trace_id: the conversation.
        agent: the agent of the newest turn.
        turn_id: the newest turn.
        state: see the module docstring.
        text: the start of the newest turn's text (at most :data:`TEXT_PREVIEW_CHARS`).
        answer: the start of its answer, when it ended.
        code: the failure code, when it failed.
        reason: the failure reason, when it failed.
        turns: how many turns the trace holds (as far as it was read).
        updated_ms: the time of the newest event read (Unix ms, from its entry id).
        pending_tools: the tools whose calls wait for a result (``waiting_on_tools``).
        metadata: the newest turn's metadata (string pairs, as published).
    """

    trace_id: str
    agent: str
    turn_id: str
    state: TurnState
    text: str = ""
    answer: str = ""
    code: str = ""
    reason: str = ""
    turns: int = 0
    updated_ms: int = 0
    pending_tools: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


FILTER_META_MAX = 8
"""The most metadata pairs a conversation filter may ask for."""
FILTER_META_KEY_MAX = 128
FILTER_META_VALUE_MAX = 512
STATES: tuple[TurnState, ...] = ("running", "waiting_on_tools", "ended", "failed", "cancelled")


@dataclass(frozen=True)
class ConversationFilter:
    """Which conversations a list keeps (every given field must match; the newest turn's).

    Attributes:
        agent: the newest turn's agent, or None for any.
        state: the newest turn's state, or None for any.
        metadata: pairs the newest turn's metadata must hold, each exactly.
    """

    agent: str | None = None
    state: TurnState | None = None
    metadata: tuple[tuple[str, str], ...] = ()

    def matches(self, state: ConversationState) -> bool:
        """True when ``state`` (a conversation's newest turn) holds every condition."""
        if self.agent is not None and state.agent != self.agent:
            return False
        if self.state is not None and state.state != self.state:
            return False
        return all(state.metadata.get(k) == v for k, v in self.metadata)


def conversation_filter(
    *, agent: str | None = None, state: str | None = None, meta: Sequence[str] = ()
) -> ConversationFilter:
    """A filter from a request's values: ``meta`` holds ``key=value`` strings (the value may hold
    ``=``; the key is cut at the first one).

    Raises:
        ValueError: a value that cannot be a filter (the message names the parameter and why).
    """
    if agent is not None and not agent.strip():
        raise ValueError("agent must name an agent, not be empty")
    chosen = next((s for s in STATES if s == state), None)
    if state is not None and chosen is None:
        raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    if len(meta) > FILTER_META_MAX:
        raise ValueError(f"meta may be given at most {FILTER_META_MAX} times, got {len(meta)}")
    pairs = []
    for item in meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"meta must be key=value, got {item!r}")
        if len(key) > FILTER_META_KEY_MAX or len(value) > FILTER_META_VALUE_MAX:
            raise ValueError(
                f"meta {key[:40]!r}: a key is at most {FILTER_META_KEY_MAX} characters and a value "
                f"at most {FILTER_META_VALUE_MAX}"
            )
        pairs.append((key, value))
    return ConversationFilter(agent=agent, state=chosen, metadata=tuple(pairs))


def entry_ms(entry_id: str) -> int:
    """The Unix time (ms) of a Redis stream entry id ``<ms>-<seq>``; 0 when it is not one."""
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else 0


def conversation_state(trace_id: str, entries: Sequence[tuple[str, Event]]) -> ConversationState | None:
    """The state of the newest turn among ``entries`` (``(entry id, event)``, oldest first).

    ``entries`` may be the trace's tail: the newest turn's input must be among them. None when
    no turn input is.
    """
    last_input = None
    turns = 0
    for index, (_, event) in enumerate(entries):
        if isinstance(event, TurnInput):
            turns += 1
            last_input = index
    if last_input is None:
        return None
    turn = entries[last_input][1]
    assert isinstance(turn, TurnInput)
    updated_ms = entry_ms(entries[-1][0])
    base: dict[str, Any] = dict(
        trace_id=trace_id,
        agent=turn.agent,
        turn_id=turn.turn_id,
        text=_preview(turn.text),
        turns=turns,
        updated_ms=updated_ms,
        metadata=dict(turn.metadata),
    )
    answered: set[str] = set()
    asked: list[tuple[str, str]] = []
    for _, event in entries[last_input:]:
        if getattr(event, "turn_id", None) != turn.turn_id:
            continue
        match event:
            case TurnEnded(answer=answer):
                return ConversationState(state="ended", answer=_preview(answer), **base)
            case TurnFailed(code=code, reason=reason):
                return ConversationState(
                    state="cancelled" if code == FailureCode.CANCELLED else "failed", code=code, reason=reason, **base
                )
            case ModelOutput(tool_calls=calls):
                asked = [(c.id, c.name) for c in calls]
            case ToolOutput(call_id=call_id):
                answered.add(call_id)
    pending = [name for call_id, name in asked if call_id not in answered]
    return ConversationState(state="waiting_on_tools" if pending else "running", pending_tools=pending, **base)


def trace_agents(events: Sequence[Event]) -> set[str]:
    """The agents the trace's own turns name (a child trace's task names its subagent)."""
    return {e.agent for e in events if isinstance(e, TurnInput)}


def root_of(events: Sequence[Event], trace_id: str) -> str:
    """The root conversation of a trace: a child trace's task names it; else the trace itself."""
    for event in events:
        if isinstance(event, TaskInput) and event.root_trace_id:
            return event.root_trace_id
    return trace_id


def reply_of_ending(
    trace_id: str, turn: TurnInput | None, ending: TurnEnded | TurnFailed, stop_reason: str | None
) -> Reply:
    """The reply of a turn's ending, as the agent loop publishes it (the one place it is made).

    An ended turn's reply has its ``answer`` and ``citations``; a failed one's ``code`` and
    ``reason``. Both carry ``stop_reason`` (the stop reason of the turn's last model output when
    that was not a normal stop, :func:`agentstream.steps.decision.final_stop_reason`) and the turn's
    metadata (none when ``turn`` is None).
    """
    metadata = dict(turn.metadata) if turn is not None else {}
    if isinstance(ending, TurnEnded):
        return Reply(
            trace_id=trace_id,
            turn_id=ending.turn_id,
            status="ended",
            answer=ending.answer,
            metadata=metadata,
            stop_reason=stop_reason,
            citations=ending.citations,
        )
    return Reply(
        trace_id=trace_id,
        turn_id=ending.turn_id,
        status="failed",
        code=ending.code,
        reason=ending.reason,
        metadata=metadata,
        stop_reason=stop_reason,
    )


def reply_of(trace_id: str, events: Sequence[Event], turn_id: str) -> Reply | None:
    """The reply of turn ``turn_id`` as the agent loop publishes it, or None while it has not ended
    (see :func:`reply_of_ending`)."""
    ending = next((e for e in events if isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == turn_id), None)
    if ending is None:
        return None
    turn = next((e for e in events if isinstance(e, TurnInput) and e.turn_id == turn_id), None)
    return reply_of_ending(trace_id, turn, ending, final_stop_reason(events, turn_id))


def reply_from_fold(fold: TraceFold, turn_id: str) -> Reply | None:
    """:func:`reply_of` from a trace's fold (:class:`agentstream.steps.trace_fold.TraceFold`: no scan of the
    trace's events)."""
    ending = fold.ending(turn_id)
    if ending is None:
        return None
    return reply_of_ending(fold.trace_id, fold.turn_input(turn_id), ending, fold.final_stop_reason(turn_id))


def _preview(text: str) -> str:
    return text if len(text) <= TEXT_PREVIEW_CHARS else text[: TEXT_PREVIEW_CHARS - 1] + "…"
