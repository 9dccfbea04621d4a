"""Rendering: events and result forms → provider-neutral messages.

Pure helpers the builder uses: a user message from an input, an assistant message from a model
output (with reasoning only when the policy replays it), and a tool result message in a given
form (full, compressed under a handle line, or a stub line with the elements floors keep).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agentstream.context.citations import CitationStyle
from agentstream.context.elements import Numbering, images_of
from agentstream.context.forms.shorten import (
    COMPRESSED,
    FULL,
    STUBBED,
    Form,
    checked,
    cut_text,
)
from agentstream.context.layout import DEFAULT_LAYOUT, Layout
from agentstream.context.limits import MESSAGE_OVERHEAD_CHARS, ModelLimits
from agentstream.context.policy import ContextPolicy
from agentstream.context.request import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    UserMessage,
)
from agentstream.errors import ContextError
from agentstream.events import Element, ModelOutput, ToolCall, ToolOutput, TurnInput

MISSING_RESULT_TEXT = (
    "Error: this tool call has no result: it was interrupted before it finished "
    "(the turn ended, failed or was cancelled). It may have partly run."
)
"""The synthetic result of a call that never got one."""

ShowElements = Callable[[Sequence[Element]], str]
"""Shows elements under their numbers in the trace (the layout, bound to the trace's numbering)."""

RenderEvent = Callable[[Any, ShowElements], Sequence[Message]]
"""Renders an app-defined event as the messages the model reads (user or plain assistant messages)."""


@dataclass(frozen=True)
class ContextConfig:
    """The builder's settings for one agent (give it as ``Agent.context``).

    Attributes:
        policy: how the context is kept within the model's limits.
        layout: how elements show as text (default: :func:`~agentstream.context.layout.xml`).
        select: which events a call sees, or None for all of them. :func:`only` makes one that
            the per-worker cache can apply event by event; any other function makes each
            rebuild cold (still correct).
        renderers: how each app-defined event type becomes messages, by class (a subclass uses
            its nearest class's renderer). A selected event that no renderer handles raises
            :class:`~agentstream.errors.UnrenderedEventError`.
        citations: the agent's citation style, or None when the agent does not cite (then no
            source counts as cited, and no ``cite`` attribute is written).
    """

    policy: ContextPolicy = field(default_factory=ContextPolicy)
    layout: Layout = DEFAULT_LAYOUT
    select: Callable[[Sequence[Any]], Sequence[Any]] | None = None
    renderers: Mapping[type, RenderEvent] = field(default_factory=dict)
    citations: CitationStyle | None = None


class EventFilter:
    """A selection of events by type, applied event by event (so the cache stays incremental)."""

    def __init__(self, types: tuple[type, ...]) -> None:
        self.types = types

    def keeps(self, event: object) -> bool:
        """True when the event is of one of the types (subclasses included)."""
        return isinstance(event, self.types)

    def __call__(self, events: Sequence[Any]) -> list[Any]:
        return [e for e in events if isinstance(e, self.types)]

    def __repr__(self) -> str:
        return f"only({', '.join(t.__name__ for t in self.types)})"


def only(*types: type) -> EventFilter:
    """A selection of the events of these types (subclasses included), for :attr:`ContextConfig.select`.

    Turn endings should usually stay selected: they decide which late results are ignored.
    """
    return EventFilter(types)


def join_content(shown: str, text: str) -> str:
    """The elements' text, then the message text after a blank line (either may be empty)."""
    if shown and text:
        return f"{shown}\n\n{text}"
    return shown or text


def user_message(event: TurnInput, show: ShowElements) -> UserMessage:
    """An input as the user message: its elements, then its text."""
    if not event.elements:
        return UserMessage(text=event.text)
    return UserMessage(text=join_content(show(event.elements), event.text), images=images_of(event.elements))


def assistant_message(output: ModelOutput, with_reasoning: bool) -> AssistantMessage:
    """A model output replayed; opaque replay blocks always go with it (the adapter filters them)."""
    return AssistantMessage(
        content=output.content,
        tool_calls=output.tool_calls,
        reasoning=output.reasoning if with_reasoning else None,
        provider=output.provider,
        model=output.model,
        replay_blocks=output.replay_blocks,
    )


def missing_result(call: ToolCall) -> ToolResultMessage:
    """The synthetic result of a call left without one."""
    return ToolResultMessage(call_id=call.id, name=call.name, text=MISSING_RESULT_TEXT, is_error=True)


def is_empty_reply(output: ModelOutput) -> bool:
    """An output with no tool calls and blank content: never replayed (providers refuse empty turns)."""
    return not output.tool_calls and not output.content.strip()


def check_rendered(event: object, messages: Sequence[Message]) -> tuple[Message, ...]:
    """Refuse renderer output that could break call/result pairing.

    Raises:
        ContextError: a renderer returned a tool result or an assistant message with tool calls.
    """
    for message in messages:
        if isinstance(message, ToolResultMessage) or (isinstance(message, AssistantMessage) and message.tool_calls):
            raise ContextError(
                f"the renderer of {type(event).__name__} returned a {type(message).__name__} with tool calls or "
                "results; renderers may return user messages and plain assistant messages only"
            )
    return tuple(messages)


class Parts:
    """A result's full and compressed outputs and their elements' estimated sizes, made once."""

    __slots__ = ("full", "full_chars", "compressed", "compressed_chars")

    def __init__(self) -> None:
        self.full: ToolOutput | None = None
        self.full_chars: tuple[int, ...] = ()
        self.compressed: ToolOutput | None = None
        self.compressed_chars: tuple[int, ...] = ()

    def full_of(self, renderer: ResultRenderer, output: ToolOutput) -> tuple[ToolOutput, tuple[int, ...]]:
        if self.full is None:
            self.full = renderer.full_output(output)
            self.full_chars = tuple(element_chars(e) for e in self.full.elements)
        return self.full, self.full_chars

    def compressed_of(self, renderer: ResultRenderer, output: ToolOutput) -> tuple[ToolOutput, tuple[int, ...]]:
        if self.compressed is None:
            assert renderer.limits is not None
            self.compressed = checked(renderer.config.policy.shorten_for(output.name, COMPRESSED), output, renderer.limits)
            if self.compressed is output and self.full is output:
                self.compressed_chars = self.full_chars
            else:
                self.compressed_chars = tuple(element_chars(e) for e in self.compressed.elements)
        return self.compressed, self.compressed_chars


@dataclass
class ResultRenderer:
    """Renders tool results in their forms, for one agent's settings and one model's limits."""

    config: ContextConfig
    limits: ModelLimits | None
    numbering: Numbering

    def show(self, elements: Sequence[Element], tool: str | None) -> str:
        if not elements:
            return ""
        return self.config.layout(elements, self.numbering, tool, self.config.citations)

    def handle_line(self, handle: str, tool: str, form: Form) -> str:
        reopen = self.config.policy.reopen
        again = f'; {reopen.name} with results=["{handle}"] shows it whole' if reopen is not None else ""
        if form == COMPRESSED:
            return f"[result {handle} of {tool}, shortened{again}]"
        return f"[result {handle} of {tool} left out to save room{again}]"

    def full_output(self, output: ToolOutput) -> ToolOutput:
        if self.limits is None:
            return output
        return checked(self.config.policy.shorten_for(output.name, FULL), output, self.limits)

    def content(self, output: ToolOutput, handle: str | None, form: Form, element_forms: Sequence[Form] | None) -> tuple[str, tuple]:
        """The text of a result in a form, and the images it shows."""
        if self.limits is None:
            return join_content(self.show(output.elements, output.name), output.text), images_of(output.elements)
        full = self.full_output(output)
        line = ""
        if form == FULL:
            elements = full.elements
            text = full.text
        else:
            compressed = checked(self.config.policy.shorten_for(output.name, COMPRESSED), output, self.limits)
            forms = element_forms if element_forms is not None else (form,) * len(output.elements)
            elements = tuple(
                (full.elements[i] if f == FULL else compressed.elements[i])
                for i, f in enumerate(forms)
                if f > STUBBED
            )
            line = self.handle_line(handle or "?", output.name, form)
            text = compressed.text if form == COMPRESSED else ""
        text = join_content(self.show(elements, output.name), text)
        if line:
            text = f"{line}\n{text}" if text else line
        cap = self.config.policy.cap_for(output.name)
        if cap is not None:
            text = cut_text(text, cap, self.limits)
        return text, images_of(elements)

    def estimate(
        self, output: ToolOutput, handle: str | None, form: Form, element_forms: Sequence[Form] | None, parts: Parts | None = None
    ) -> int:
        """Characters of a result's message in a form, estimated from its parts without laying it out.

        Args:
            parts: the result's shortened forms, when the caller keeps them (see :class:`Parts`).

        Raises:
            ShortenError: a shorten function changed the result's elements or its error.
        """
        assert self.limits is not None
        if parts is None:
            parts = Parts()
        full, full_chars = parts.full_of(self, output)
        line = 0
        if form == FULL:
            text = full.text
            elements_chars = sum(full_chars)
            shown = bool(full_chars)
        else:
            compressed, compressed_chars = parts.compressed_of(self, output)
            forms = element_forms if element_forms is not None else (form,) * len(full_chars)
            elements_chars = 0
            shown = False
            for index, element_form in enumerate(forms):
                if element_form > STUBBED:
                    elements_chars += full_chars[index] if element_form == FULL else compressed_chars[index]
                    shown = True
            line = len(self.handle_line(handle or "?", output.name, form)) + 1
            text = compressed.text if form == COMPRESSED else ""
        total = line + len(text) + elements_chars + (2 if shown and text else 0)
        cap = self.config.policy.cap_for(output.name)
        if cap is not None:
            room = self.limits.chars_of_tokens(cap.count)
            if total > room:
                total = room + CUT_NOTE_CHARS
        return total + len(output.call_id) + MESSAGE_OVERHEAD_CHARS

    def message(self, output: ToolOutput, handle: str | None, form: Form, element_forms: Sequence[Form] | None) -> ToolResultMessage:
        text, images = self.content(output, handle, form, element_forms)
        return ToolResultMessage(
            call_id=output.call_id, name=output.name, text=text, is_error=output.error is not None, images=images
        )


CUT_NOTE_CHARS = 48
"""About the characters of the note that ends a cut text."""

_FIELDS: dict[type, tuple[str, ...]] = {}
_BASE_FIELDS = frozenset({"id", "ref", "properties", "text", "data"})


def element_chars(element: Element) -> int:
    """About the characters an element takes in the XML layout (tag, id, citation, attributes, text)."""
    kind = type(element)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(n for n in kind.__struct_fields__ if n not in _BASE_FIELDS)
    chars = 40 + len(getattr(element, "text", "") or "") + (len(element.ref) if element.ref else 0)
    for name in names:
        value = getattr(element, name)
        if value:
            chars += len(name) + 4 + (len(value) if isinstance(value, str) else len(str(value)))
    for key, value in element.properties.items():
        chars += len(key) + 4 + (len(value) if isinstance(value, str) else len(str(value)))
    return chars


def cap_images(messages: list[Message], max_images: int) -> None:
    """Keep the newest ``max_images`` images of a request; each older one becomes a note (in place)."""
    kept = 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        images = getattr(message, "images", ())
        if not images:
            continue
        room = max(0, max_images - kept)
        if room >= len(images):
            kept += len(images)
            continue
        keep = images[len(images) - room :] if room else ()
        left = len(images) - len(keep)
        kept += len(keep)
        note = f"[{left} older image{'s' if left != 1 else ''} left out: the request holds at most {max_images}]"
        messages[index] = msgspec.structs.replace(message, images=tuple(keep), text=f"{message.text}\n{note}")
