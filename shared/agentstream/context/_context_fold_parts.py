"""The pieces of a folded trace: turns, replayed model outputs, result slots and form changes.

:class:`~agentstream.context._context_fold.ContextFold` keeps one :class:`Turn` per input, one
:class:`Output` per replayed model output, and one :class:`Slot` per accepted tool result
(its handle, where it shows, its current form and its estimated size).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agentstream.context.forms.shorten import FULL, Form
from agentstream.context.limits import MESSAGE_OVERHEAD_CHARS, message_chars, text_chars
from agentstream.context.render import MISSING_RESULT_TEXT, Parts, assistant_message
from agentstream.context.request import AssistantMessage, Message, ToolDefinition
from agentstream.wire.events import ModelOutput, ToolOutput, TurnInput

RECORD_ONLY_TAGS = frozenset(
    {
        "tool_started",
        "cancel_requested",
        "compaction_failed",
        "tools_offered",
        "forked_from",
        "approval_awaited",
        "approval_decided",
    }
)
"""Stored event types that add no message to a context: they are records for the runtime (a
side-effect tool about to run, a cancel request whose effects are written as their own events,
a call awaiting approval and its decision (a denial is written as the call's error result, and
an approval with edited arguments shows in its result's first line:
:func:`agentstream.context._context_fold.edited_result`);
the MCP tools offered change the request's tools, which the trace state reads itself; a fork's
first event names its source)."""


def record_only(event: object) -> bool:
    """True for a stored event type that changes no context (see :data:`RECORD_ONLY_TAGS`)."""
    config = getattr(type(event), "__struct_config__", None)
    return config is not None and getattr(config, "tag", None) in RECORD_ONLY_TAGS


class Slot(Parts):
    """One accepted tool result: its handle, where it shows, its current form, and its sizes.

    As :class:`~agentstream.context.render.Parts` it keeps the result's full and compressed
    outputs, made once, and the estimate of each form when no element is lifted (``chars_full``,
    ``chars_compressed``, ``chars_stubbed``; -1 until asked), and the form the judge plans for it
    while it plans a pass (``plan_*``; see :func:`agentstream.context.shrink.judge`).
    """

    __slots__ = (
        "handle",
        "output",
        "turn",
        "more",
        "form",
        "by",
        "at",
        "element_forms",
        "message",
        "chars",
        "futile",
        "renders",
        "chars_full",
        "chars_compressed",
        "chars_stubbed",
        "plan_form",
        "plan_chars",
        "plan_by",
        "plan_floors",
        "record",
    )

    def __init__(self, handle: str, output: ToolOutput) -> None:
        self.full: ToolOutput | None = None
        self.full_chars: tuple[int, ...] | None = None
        self.full_total = -1
        self.compressed: ToolOutput | None = None
        self.compressed_chars: tuple[int, ...] | None = None
        self.compressed_total = -1
        self.compressed_text = -1
        self.handle = handle
        self.output = output
        self.turn: Turn | None = None  # the turn of the first model output that made the call: where it shows
        self.more: list[Output] | None = None  # later outputs that made a call of the same id (it shows there too)
        self.form: Form = FULL
        self.by: Any = None
        self.at: int = -1
        self.element_forms: tuple[Form, ...] | None = None
        self.message: Any = None
        self.chars = 0
        self.futile = 0  # bit (1 << form) set: lowering to that form frees nothing (or is refused)
        self.renders: dict[tuple[Any, ...], Any] | None = None  # (kind, form, element forms) → message or chars
        self.chars_full = self.chars_compressed = self.chars_stubbed = -1
        self.plan_form: Form | None = None
        self.plan_chars = 0
        self.plan_by: Any = None
        self.plan_floors: tuple[Form, ...] | None = None
        self.record: Any = None  # the builder's Shrunk for its current form (see builder._shrunk)


class Output:
    """One replayed model output (an empty reply is never one); its message is laid out when sent."""

    __slots__ = ("event", "turn", "_message", "round")

    def __init__(self, event: ModelOutput, turn: int) -> None:
        self.event = event
        self.turn = turn  # the index of its turn (not the turn: a folded state holds no reference cycle)
        self._message: AssistantMessage | None = None
        self.round = -1  # the index of its round among the trace's, when it called tools

    @property
    def message(self) -> AssistantMessage:
        """The output replayed without its reasoning."""
        message = self._message
        if message is None:
            message = self._message = assistant_message(self.event, False)
        return message


class Turn:
    """One turn: its input, then its outputs (and app events' messages) in trace order."""

    __slots__ = (
        "index",
        "turn_id",
        "user",
        "items",
        "handles",
        "chars",
        "reasoning_chars",
        "version",
        "cache_key",
        "cache",
        "first_round",
        "first_slot",
        "tool_steps",
        "answer_steps",
        "input",
        "off",
        "tools",
        "system",
    )

    def __init__(self, index: int, event: TurnInput, user: Message | None, first_round: int, first_slot: int) -> None:
        self.off: frozenset[str] = frozenset()  # the agent's own tools this turn does not offer
        # when some are off: (the agent's tool definitions it was made from, (its own, their characters))
        self.tools: tuple[tuple[ToolDefinition, ...], tuple[tuple[ToolDefinition, ...], int]] | None = None
        self.index = index
        self.first_round = first_round
        self.first_slot = first_slot
        self.turn_id = event.turn_id
        self.user = user
        self.items: list[Output | tuple[Message, ...]] = []
        self.handles: list[str] = []
        self.chars = message_chars(user) if user is not None else 0
        self.reasoning_chars = 0
        self.version = 0
        self.cache_key: tuple[int, bool] | None = None
        self.cache: tuple[Message, ...] = ()
        self.tool_steps: list[int] = []  # the steps of its outputs that called tools (the passes cap counts them)
        self.answer_steps: list[int] = []  # steps whose calls got an answer to a request (Agent.answers_request)
        self.input = event  # the turn's input (its system prompt is written from it)
        self.system: str | None = None  # the system prompt of its calls, once written (ContextFold.base_system)


class Change(NamedTuple):
    """The state of a slot before a form change (to undo a speculative change)."""

    slot: Slot
    form: Form
    by: Any
    at: int
    element_forms: tuple[Form, ...] | None
    chars: int


MISSING_CHARS = text_chars(MISSING_RESULT_TEXT) + MESSAGE_OVERHEAD_CHARS
"""Characters of the synthetic result of a call without one, less its call id's."""


def missing_chars(call_id: str) -> int:
    """Characters of the synthetic result of a call without one."""
    return MISSING_CHARS + len(call_id)
