"""Forms of a tool result, and the shorten functions that make them.

A result is shown in one of three forms, ordered ``STUBBED < COMPRESSED < FULL``. A shrink only
lowers a result's form; a floor only lifts the form of an element in it. Forms are worked out
again at every model call, never stored.

A shorten function makes a result look as it does in one form, for the model that reads it:
``(ToolOutput, ModelLimits) -> ToolOutput``. It may change text, data and each source's text,
but must keep every element, in order, and the error: handles and citations find elements by
id, and the model reacts to the error. :func:`checked` enforces that.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable

import msgspec

from agentstream.context.limits import ModelLimits, Tokens, prefix_within, text_chars
from agentstream.errors import ShortenError
from agentstream.wire.events import Source, ToolOutput


class Form(enum.IntEnum):
    """How much of a result the model is shown (ordered)."""

    STUBBED = 0
    """One line naming the result's handle, plus the elements that floors keep; the call stays."""
    COMPRESSED = 1
    """The compressed function's output, under a line naming the handle."""
    FULL = 2
    """The full function's output (by default, the result as recorded)."""


FULL = Form.FULL
COMPRESSED = Form.COMPRESSED
STUBBED = Form.STUBBED

Shorten = Callable[[ToolOutput, ModelLimits], ToolOutput]
"""Makes a result look as it does in one form, for the model that reads it."""

ShortenText = Callable[[str, ModelLimits], str]
"""Shortens one text for the model that reads it."""

DEFAULT_CUT = "[… about {tokens} more tokens not shown]"
"""What follows a cut text; ``{tokens}`` is about how many tokens were left out."""

_WORD = re.compile(r"\S+")


def as_recorded(output: ToolOutput, limits: ModelLimits) -> ToolOutput:
    """The result as the tool recorded it (the default full form). Returns ``output`` itself."""
    return output


def drop_text(output: ToolOutput, limits: ModelLimits) -> ToolOutput:
    """The result with the text of each source removed (the default compressed form).

    Sources then show as tags without content; the result's own text and data stay.
    """
    if not any(isinstance(e, Source) and e.text for e in output.elements):
        return output
    elements = tuple(
        msgspec.structs.replace(e, text="") if isinstance(e, Source) and e.text else e for e in output.elements
    )
    return msgspec.structs.replace(output, elements=elements)


def sources(shorten: ShortenText) -> Shorten:
    """A shorten function that applies ``shorten`` to the text of each source of a result.

    Other elements, and the result's own text and data, stay as they are.
    ``sources(cap(Tokens(500)))`` cuts each source's text at 500 tokens.
    """

    def apply(output: ToolOutput, limits: ModelLimits) -> ToolOutput:
        changed = False
        elements = []
        for element in output.elements:
            if isinstance(element, Source) and element.text:
                text = shorten(element.text, limits)
                if text != element.text:
                    element = msgspec.structs.replace(element, text=text)
                    changed = True
            elements.append(element)
        return msgspec.structs.replace(output, elements=tuple(elements)) if changed else output

    apply.__qualname__ = apply.__name__ = f"sources({getattr(shorten, '__name__', repr(shorten))})"
    return apply


def cut_text(text: str, limit: Tokens, limits: ModelLimits, cut: str = DEFAULT_CUT) -> str:
    """``text`` cut at ``limit`` tokens before the word the limit falls in, followed by ``cut``.

    A text that fits is returned unchanged.
    """
    budget = limits.chars_of_tokens(limit.count)
    size = text_chars(text)
    if size <= budget:
        return text
    end = prefix_within(text, budget)
    if end > 0 and not text[end - 1].isspace() and not text[end].isspace():
        space = max(text.rfind(" ", 0, end), text.rfind("\n", 0, end))
        if space > 0:
            end = space
    kept = text[:end].rstrip()
    left_out = limits.tokens_of_chars(size - text_chars(kept))
    note = cut.format(tokens=left_out)
    return f"{kept}\n{note}" if kept else note


def cap(limit: Tokens, cut: str = DEFAULT_CUT) -> ShortenText:
    """A text shortener that cuts at ``limit`` tokens, before the word the limit falls in.

    A cut text ends with ``cut`` (``{tokens}`` becomes about how many tokens were left out), so
    the model can tell a cut text from a short one. A text that fits stays as it is.
    """

    def apply(text: str, limits: ModelLimits) -> str:
        return cut_text(text, limit, limits, cut)

    apply.__qualname__ = apply.__name__ = f"cap({limit.count})"
    return apply


def first_words(count: int) -> ShortenText:
    """A text shortener that keeps the first ``count`` words, joined by one space, then ``…``.

    A text of at most ``count`` words stays as it is.
    """
    if count < 0:
        raise ValueError(f"first_words needs a count of at least 0, got {count}")

    def apply(text: str, limits: ModelLimits) -> str:
        words = _WORD.findall(text)
        if len(words) <= count:
            return text
        return " ".join(words[:count]) + " …"

    apply.__qualname__ = apply.__name__ = f"first_words({count})"
    return apply


def json_cap(limit: Tokens, cut: str = DEFAULT_CUT) -> Shorten:
    """A shorten function that writes a result's data as JSON, cut at ``limit`` tokens.

    When the JSON is longer than ``limit``, the result gets no data and the cut JSON follows its
    text on a new line (a text that is only that JSON is replaced by the cut JSON). Data that
    fits, and a result without data, stay as they are.
    """

    def apply(output: ToolOutput, limits: ModelLimits) -> ToolOutput:
        if output.data is None:
            return output
        encoded = msgspec.json.encode(output.data).decode()
        if text_chars(encoded) <= limits.chars_of_tokens(limit.count):
            return output
        shortened = cut_text(encoded, limit, limits, cut)
        base = "" if output.text.strip() == encoded else output.text
        text = f"{base}\n{shortened}" if base else shortened
        return msgspec.structs.replace(output, data=None, text=text)

    apply.__qualname__ = apply.__name__ = f"json_cap({limit.count})"
    return apply


def checked(shorten: Shorten, output: ToolOutput, limits: ModelLimits) -> ToolOutput:
    """Run a shorten function and refuse what it must not change.

    Raises:
        ShortenError: the function added, removed or reordered an element (by id and type), or
            changed the result's error; the message names the function and the call id.
    """
    shortened = shorten(output, limits)
    if shortened is output:
        return output
    name = getattr(shorten, "__qualname__", repr(shorten))
    if not isinstance(shortened, ToolOutput):
        raise ShortenError(
            f"shorten function {name} returned {type(shortened).__name__}, not a ToolOutput (call {output.call_id})"
        )
    if shortened.error != output.error:
        raise ShortenError(
            f"shorten function {name} changed the error of the result of call {output.call_id} "
            f"from {output.error!r} to {shortened.error!r}; a shorten function may change text and data only"
        )
    elements, kept = output.elements, shortened.elements
    if len(elements) != len(kept) or any(
        type(a) is not type(b) or a.id != b.id for a, b in zip(elements, kept, strict=True)
    ):
        before = [(type(e), e.id) for e in elements]
        after = [(type(e), e.id) for e in kept]
        raise ShortenError(
            f"shorten function {name} added, removed or reordered elements of the result of call "
            f"{output.call_id} (before: {[i for _, i in before]}, after: {[i for _, i in after]}); "
            "keep every element, in order"
        )
    return shortened
