"""The pieces of a folded trace: turns, replayed model outputs, result slots and form changes.

:class:`~agentstream.context.state.TraceState` keeps one :class:`Turn` per input, one
:class:`Output` per replayed model output, and one :class:`Slot` per accepted tool result
(its handle, where it shows, its current form and its estimated size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentstream.context.forms.shorten import FULL, Form
from agentstream.context.limits import MESSAGE_OVERHEAD_CHARS, message_chars
from agentstream.context.render import MISSING_RESULT_TEXT, assistant_message
from agentstream.context.request import Message
from agentstream.events import ModelOutput, ToolOutput, TurnInput

RECORD_ONLY_TAGS = frozenset({"tool_started", "cancel_requested", "compaction_failed"})
"""Stored event types that change no context: they are records for the runtime (a side-effect
tool about to run, a cancel request whose effects are written as their own events)."""


def record_only(event: object) -> bool:
    """True for a stored event type that changes no context (see :data:`RECORD_ONLY_TAGS`)."""
    config = getattr(type(event), "__struct_config__", None)
    return config is not None and getattr(config, "tag", None) in RECORD_ONLY_TAGS


class Slot:
    """One accepted tool result: its handle, where it shows, and its current form."""

    __slots__ = ("handle", "output", "turn", "form", "by", "at", "element_forms", "message", "chars", "futile", "renders")

    def __init__(self, handle: str, output: ToolOutput) -> None:
        self.handle = handle
        self.output = output
        self.turn: Turn | None = None
        self.form: Form = FULL
        self.by: Any = None
        self.at: int = -1
        self.element_forms: tuple[Form, ...] | None = None
        self.message: Any = None
        self.chars = 0
        self.futile = 0  # bit (1 << form) set: lowering to that form frees nothing (or is refused)
        self.renders: dict[tuple, Any] | None = None  # (kind, form, element forms) → message or chars


class Output:
    """One replayed model output (an empty reply is never one)."""

    __slots__ = ("event", "message", "chars", "reasoning_chars", "round")

    def __init__(self, event: ModelOutput) -> None:
        self.event = event
        self.message = assistant_message(event, False)
        self.chars = message_chars(self.message)
        self.reasoning_chars = len(event.reasoning) if event.reasoning else 0
        self.round = -1


class Turn:
    """One turn: its input, then its outputs (and app events' messages) in trace order."""

    __slots__ = (
        "index", "turn_id", "user", "items", "handles", "chars", "reasoning_chars", "version", "cache_key", "cache",
        "first_round", "first_slot",
    )

    def __init__(self, index: int, event: TurnInput, user: Message, first_round: int, first_slot: int) -> None:
        self.index = index
        self.first_round = first_round
        self.first_slot = first_slot
        self.turn_id = event.turn_id
        self.user = user
        self.items: list[Output | tuple[Message, ...]] = []
        self.handles: list[str] = []
        self.chars = message_chars(user)
        self.reasoning_chars = 0
        self.version = 0
        self.cache_key: tuple[int, bool] | None = None
        self.cache: tuple[Message, ...] = ()


@dataclass(frozen=True)
class Change:
    """The state of a slot before a form change (to undo a speculative or unprofitable change)."""

    slot: Slot
    form: Form
    by: Any
    at: int
    element_forms: tuple[Form, ...] | None
    chars: int


def missing_chars(call_id: str) -> int:
    """Characters of the synthetic result of a call without one."""
    return len(MISSING_RESULT_TEXT) + len(call_id) + MESSAGE_OVERHEAD_CHARS
