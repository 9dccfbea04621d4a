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
    as_recorded,
    checked,
    cut_text,
    drop_text,
)
from agentstream.context.layout import DEFAULT_LAYOUT, Layout
from agentstream.context.limits import MESSAGE_OVERHEAD_CHARS, ModelLimits, text_chars
from agentstream.context.policy import ContextPolicy
from agentstream.context.request import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    UserMessage,
)
from agentstream.declarations.inputs import Text, elements_then_text, parse_payload
from agentstream.declarations.inputs import as_recorded as input_as_recorded
from agentstream.errors import ContextError
from agentstream.wire.events import (
    Document,
    Element,
    Image,
    ModelOutput,
    Passage,
    Source,
    ToolCall,
    ToolOutput,
    TurnInput,
)

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


def input_message(event: TurnInput, agent: Any, show: ShowElements) -> UserMessage | None:
    """How the model reads a recorded input: its payload parsed into the agent's input type and
    rendered by the agent's hook (default: its elements, then its text), then the instructions
    of the tools the turn requires, after a blank line; None when the hook keeps it from the model.

    An input the type no longer parses is shown as recorded (its elements, then its payload as
    text or JSON: :func:`agentstream.declarations.inputs.as_recorded`). A plain-text input of an agent with
    the default type and hook is shown without parsing (as before typed inputs).
    """
    render = getattr(agent, "render_input", None)
    input_type = getattr(agent, "input", Text)
    if event.input is None and render is None and input_type is Text:
        message = user_message(event, show)
    else:
        payload = event.input if event.input is not None else event.text
        try:
            parsed = parse_payload(input_type, payload)
        except ValueError:
            text: str | None = input_as_recorded(event, show)
        else:
            text = (render or elements_then_text)(parsed, show, event)
        if text is None:
            return None
        if isinstance(text, UserMessage):  # the hook's own message (its images, say)
            message = text
        else:
            message = UserMessage(text=str(text), images=images_of(event.elements))
    if event.instructions:
        message = msgspec.structs.replace(message, text=join_content(message.text, "\n".join(event.instructions)))
    return message


def declared_order(agent: Any) -> tuple[Any, ...]:
    """The agent's own tools in the order it declares them (``Agent.declared``), else as listed,
    as its model reads them (with its prompt file's tool texts: ``Agent.described_tools``)."""
    declared = getattr(agent, "declared", None)
    described = getattr(agent, "described_tools", None)
    tools = tuple(described() if described is not None else agent.tools)
    if declared is None:
        return tools
    by_name = {t.name: t for t in tools}
    return tuple(by_name[d.name] for d in declared if d.name in by_name)


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
    """A result's full and compressed forms and their elements' estimated sizes, each made once, when first needed.

    The compressed output of the default :func:`~agentstream.context.forms.shorten.drop_text` is
    not made to be measured: it is the result with each source's text removed, so its elements
    take what the recorded ones take less those texts (see :func:`element_chars`).
    """

    __slots__ = (
        "full",
        "full_chars",
        "full_total",
        "compressed",
        "compressed_chars",
        "compressed_total",
        "compressed_text",
    )

    def __init__(self) -> None:
        self.full: ToolOutput | None = None
        self.full_chars: tuple[int, ...] | None = None  # each element's estimated characters
        self.full_total = -1  # their sum (-1 until measured)
        self.compressed: ToolOutput | None = None
        self.compressed_chars: tuple[int, ...] | None = None
        self.compressed_total = -1
        self.compressed_text = -1  # characters of the compressed output's text

    def full_of(self, renderer: ResultRenderer, output: ToolOutput) -> ToolOutput:
        full = self.full
        if full is None:
            full = self.full = renderer.full_output(output)
        return full

    def compressed_of(self, renderer: ResultRenderer, output: ToolOutput) -> ToolOutput:
        compressed = self.compressed
        if compressed is None:
            assert renderer.limits is not None
            compressed = self.compressed = checked(
                renderer.config.policy.shorten_for(output.name, COMPRESSED), output, renderer.limits
            )
        return compressed

    def full_elements(self) -> int:
        """The full elements' estimated characters, summed (after :meth:`full_of`)."""
        total = self.full_total
        if total < 0:
            assert self.full is not None
            total = self.full_total = sum(map(element_chars, self.full.elements)) if self.full.elements else 0
        return total

    def compressed_measure(self, renderer: ResultRenderer, output: ToolOutput) -> tuple[int, int]:
        """The compressed output's text length and its elements' estimated characters, summed (after :meth:`full_of`).

        Raises:
            ShortenError: the compressed function changed the result's elements or its error.
        """
        if self.compressed_total < 0:
            shorten = renderer.config.policy.shorten_for(output.name, COMPRESSED)
            if shorten is drop_text:
                total = self.full_elements() if self.full is output else sum(map(element_chars, output.elements))
                for element in output.elements:
                    if isinstance(element, Source) and element.text:
                        total -= text_chars(element.text)
                self.compressed_text = text_chars(output.text)
            else:
                compressed = self.compressed_of(renderer, output)
                total = (
                    self.full_elements() if compressed is self.full else sum(map(element_chars, compressed.elements))
                )
                self.compressed_text = text_chars(compressed.text)
            self.compressed_total = total
        return self.compressed_text, self.compressed_total

    def elements_chars(self, renderer: ResultRenderer, output: ToolOutput) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each element's estimated characters, full and compressed (after :meth:`full_of`).

        Raises:
            ShortenError: the compressed function changed the result's elements or its error.
        """
        full = self.full
        assert full is not None
        if self.full_chars is None:
            self.full_chars = tuple(map(element_chars, full.elements))
        if self.compressed_chars is None:
            compressed = self.compressed_of(renderer, output)
            self.compressed_chars = (
                self.full_chars if compressed is full else tuple(map(element_chars, compressed.elements))
            )
        return self.full_chars, self.compressed_chars


@dataclass
class ResultRenderer:
    """Renders tool results in their forms, for one agent's settings and one model's limits."""

    config: ContextConfig
    limits: ModelLimits | None
    numbering: Numbering
    _tools: dict[str, _ToolSizes] = field(default_factory=dict, init=False, repr=False, compare=False)

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

    def tool_sizes(self, tool: str) -> _ToolSizes:
        """What the estimates of a tool's results need from the policy, read once per tool."""
        sizes = self._tools.get(tool)
        if sizes is None:
            sizes = self._tools[tool] = _ToolSizes(self, tool)
        return sizes

    def handle_line_chars(self, handle: str, tool: str, form: Form) -> int:
        """``text_chars(self.handle_line(handle, tool, form))``, without writing the line."""
        sizes = self.tool_sizes(tool)
        if form == COMPRESSED:
            return sizes.compressed_line + sizes.compressed_handles * text_chars(handle)
        return sizes.stubbed_line + sizes.stubbed_handles * text_chars(handle)

    def full_output(self, output: ToolOutput) -> ToolOutput:
        if self.limits is None:
            return output
        return checked(self.config.policy.shorten_for(output.name, FULL), output, self.limits)

    def content(
        self, output: ToolOutput, handle: str | None, form: Form, element_forms: Sequence[Form] | None
    ) -> tuple[str, tuple[Image, ...]]:
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
                (full.elements[i] if f == FULL else compressed.elements[i]) for i, f in enumerate(forms) if f > STUBBED
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
        self,
        output: ToolOutput,
        handle: str | None,
        form: Form,
        element_forms: Sequence[Form] | None,
        parts: Parts | None = None,
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
        full = parts.full
        if full is None:
            full = parts.full_of(self, output)
        line = 0
        if form == FULL:
            text = text_chars(full.text)
            shown = bool(full.elements)
            elements_chars = parts.full_elements() if shown else 0
        else:
            if element_forms is None:  # every element in the result's form
                text, elements_chars = parts.compressed_measure(self, output)
                shown = form > STUBBED and bool(full.elements)
                if not shown:
                    elements_chars = 0
            else:
                full_chars, compressed_chars = parts.elements_chars(self, output)
                text = text_chars(parts.compressed_of(self, output).text)
                elements_chars = 0
                shown = False
                for index, element_form in enumerate(element_forms):
                    if element_form > STUBBED:
                        elements_chars += full_chars[index] if element_form == FULL else compressed_chars[index]
                        shown = True
            line = self.handle_line_chars(handle or "?", output.name, form) + 1
            if form != COMPRESSED:
                text = 0
        total = line + text + elements_chars + (2 if shown and text else 0)
        room = self.tool_sizes(output.name).room
        if 0 <= room < total:
            total = room + CUT_NOTE_CHARS
        return total + len(output.call_id) + MESSAGE_OVERHEAD_CHARS

    def estimates(self, output: ToolOutput, handle: str, parts: Parts) -> tuple[int, int, int]:
        """:meth:`estimate` in each form with no element lifted: ``(full, compressed, stubbed)``.

        The lowered forms are measured here only for the default compressed function
        (:func:`~agentstream.context.forms.shorten.drop_text`, whose sizes need no output made);
        for another they are -1, and that function runs when its form is first asked for.

        Raises:
            ShortenError: the full function changed the result's elements or its error.
        """
        assert self.limits is not None
        sizes = self._tools.get(output.name) or self.tool_sizes(output.name)
        full = parts.full
        if full is None:
            full = parts.full = output if sizes.full_as_recorded else self.full_output(output)
        elements = full.elements
        text = text_chars(full.text)
        total = text
        dropped = 0  # the sources' text, which drop_text removes
        elements_chars = 0
        if elements:
            for element in elements:
                if (type(element) is Passage or type(element) is Document) and not element.properties:
                    # element_chars, inline
                    size = text_chars(element.text) if element.text else 0
                    elements_chars += 40 + size + (len(element.ref) if element.ref else 0)
                    if type(element) is Document:
                        if element.title:
                            elements_chars += 9 + text_chars(element.title)  # len("title") + 4
                        if element.url:
                            elements_chars += 7 + text_chars(element.url)  # len("url") + 4
                    dropped += size
                    continue
                elements_chars += element_chars(element)
                if isinstance(element, Source) and element.text:
                    dropped += text_chars(element.text)
            total += elements_chars + (2 if text else 0)
        parts.full_total = elements_chars
        tail = len(output.call_id) + MESSAGE_OVERHEAD_CHARS
        room = sizes.room
        if 0 <= room < total:
            total = room + CUT_NOTE_CHARS
        if not sizes.compressed_drops_text:
            return total + tail, -1, -1
        if full is output:  # drop_text of the recorded result: measured with it
            elements_chars -= dropped
            parts.compressed_total, parts.compressed_text = elements_chars, text
        else:
            text, elements_chars = parts.compressed_measure(self, output)
        compressed = sizes.compressed_line + sizes.compressed_handles * text_chars(handle) + 1 + text
        if elements:
            compressed += elements_chars + (2 if text else 0)
        if 0 <= room < compressed:
            compressed = room + CUT_NOTE_CHARS
        stubbed = sizes.stubbed_line + sizes.stubbed_handles * text_chars(handle) + 1
        if 0 <= room < stubbed:
            stubbed = room + CUT_NOTE_CHARS
        return total + tail, compressed + tail, stubbed + tail

    def message(
        self, output: ToolOutput, handle: str | None, form: Form, element_forms: Sequence[Form] | None
    ) -> ToolResultMessage:
        text, images = self.content(output, handle, form, element_forms)
        return ToolResultMessage(
            call_id=output.call_id, name=output.name, text=text, is_error=output.error is not None, images=images
        )


class _ToolSizes:
    """For one tool: its forms' functions as far as estimates care, its cap, and its handle lines' lengths."""

    __slots__ = (
        "full_as_recorded",
        "compressed_drops_text",
        "room",
        "compressed_line",
        "compressed_handles",
        "stubbed_line",
        "stubbed_handles",
    )

    def __init__(self, renderer: ResultRenderer, tool: str) -> None:
        policy = renderer.config.policy
        assert renderer.limits is not None
        self.full_as_recorded = policy.shorten_for(tool, FULL) is as_recorded
        self.compressed_drops_text = policy.shorten_for(tool, COMPRESSED) is drop_text
        cap = policy.cap_for(tool)
        self.room = -1 if cap is None else renderer.limits.chars_of_tokens(cap.count)  # -1: never cut
        # the handle is written into the line whole, a fixed number of times
        self.compressed_line = text_chars(renderer.handle_line("", tool, COMPRESSED))
        self.compressed_handles = text_chars(renderer.handle_line("h", tool, COMPRESSED)) - self.compressed_line
        self.stubbed_line = text_chars(renderer.handle_line("", tool, STUBBED))
        self.stubbed_handles = text_chars(renderer.handle_line("h", tool, STUBBED)) - self.stubbed_line


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
    chars = 40
    text = getattr(element, "text", None)
    if text:
        chars += text_chars(text)
    if element.ref:
        chars += len(element.ref)
    for name in names:
        value = getattr(element, name)
        if value:
            chars += len(name) + 4 + (text_chars(value) if isinstance(value, str) else text_chars(str(value)))
    if element.properties:
        for key, value in element.properties.items():
            chars += text_chars(key) + 4 + (text_chars(value) if isinstance(value, str) else text_chars(str(value)))
    return chars


def cap_images(messages: list[Message], max_images: int) -> None:
    """Keep the newest ``max_images`` images of a request; each older one becomes a note (in place)."""
    kept = 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):  # carries no images
            continue
        images = message.images
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
