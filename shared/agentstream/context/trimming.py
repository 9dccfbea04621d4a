"""Trimming a message list to a token budget, never separating a tool call from its results.

:func:`trim_messages` keeps the first or the last messages that fit ``max_tokens`` as a token
counter counts them, optionally splitting one message's text to fill the rest, starting on or
ending on a message kind, and keeping a leading system message. Unlike a plain trimmer it
works on units: an assistant message with tool calls and all its results are kept or dropped
together, and a result whose call is not in the list is never kept. Under budget, the input
comes back unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Literal

import msgspec

from agentstream.context.limits import ModelLimits, message_chars, text_chars, tools_chars
from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    ToolResultMessage,
    UserMessage,
)
from agentstream.errors import ContextFullError


class SystemMessage(msgspec.Struct, frozen=True, kw_only=True, tag="system"):
    """A system message, for trimming lists that hold one (a ChatRequest keeps its own apart)."""

    text: str


AnyMessage = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage
Kind = Literal["system", "user", "assistant", "tool"]
KindSpec = Kind | type | Sequence[Kind | type]

_KINDS: dict[type, str] = {
    SystemMessage: "system",
    UserMessage: "user",
    AssistantMessage: "assistant",
    ToolResultMessage: "tool",
}
_ALIASES = {"human": "user", "ai": "assistant", "function": "tool"}


def kind_of(message: AnyMessage) -> str:
    """``system``, ``user``, ``assistant`` or ``tool``."""
    return _KINDS[type(message)]


def _kinds(spec: KindSpec | None, where: str = "kind") -> frozenset[str] | None:
    """The kinds a ``start_on``/``end_on`` names, or None.

    Raises:
        ValueError: an item that is no known kind or message class (it would match no message,
            so the trim would keep nothing without a word).
    """
    if spec is None:
        return None
    items = [spec] if isinstance(spec, (str, type)) else list(spec)
    out: set[str] = set()
    for item in items:
        kind = (
            _KINDS.get(item) if isinstance(item, type) else _ALIASES.get(item, item) if isinstance(item, str) else None
        )
        if kind is None or kind not in _KINDS.values():
            known = ", ".join([*_KINDS.values(), *_ALIASES, *(c.__name__ for c in _KINDS)])
            raise ValueError(f"trimming: {where} names {item!r}, which is no message kind (known: {known})")
        out.add(kind)
    return frozenset(out)


def split_lines(text: str) -> list[str]:
    """The default text splitter: lines, each keeping its newline (so the parts join back to the text)."""
    return text.splitlines(keepends=True)


def estimate_counter(limits: ModelLimits) -> Callable[[Sequence[AnyMessage]], int]:
    """A token counter that estimates from characters with the model's characters per token."""

    def count(messages: Sequence[AnyMessage]) -> int:
        return limits.tokens_of_chars(
            sum(text_chars(m.text) if isinstance(m, SystemMessage) else message_chars(m) for m in messages)
        )

    return count


def units(messages: Sequence[AnyMessage]) -> list[list[AnyMessage]]:
    """Group messages into units that are kept or dropped whole.

    An assistant message with tool calls forms one unit with the results of those calls that
    follow it; every other message is its own unit; a tool result that answers no call of the
    assistant message before it is dropped.
    """
    out: list[list[AnyMessage]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if isinstance(message, ToolResultMessage):
            continue  # an orphan result: never kept
        unit: list[AnyMessage] = [message]
        if isinstance(message, AssistantMessage) and message.tool_calls:
            ids = {c.id for c in message.tool_calls}
            while index < len(messages) and isinstance(messages[index], ToolResultMessage):
                result = messages[index]
                assert isinstance(result, ToolResultMessage)
                if result.call_id in ids:
                    unit.append(result)
                index += 1
        out.append(unit)
    return out


Count = Generator[tuple[str, Any], Any, Any]
"""The trimming algorithm's requests: ``("count", messages)`` → tokens, ``("split", text)`` → parts."""


def _partial(message: AnyMessage, fits: Callable[[AnyMessage], Count], keep_end: bool) -> Count:
    """The message with as many of its text's parts as fit (its last parts, or its first), or None."""
    if isinstance(message, ToolResultMessage) or (isinstance(message, AssistantMessage) and message.tool_calls):
        return None
    field = "content" if isinstance(message, AssistantMessage) else "text"
    parts = yield ("split", getattr(message, field))
    chosen: list[str] = []
    best = None
    for part in reversed(parts) if keep_end else parts:
        trial = [part, *chosen] if keep_end else [*chosen, part]
        candidate = msgspec.structs.replace(message, **{field: "".join(trial)})
        if not (yield from fits(candidate)):
            break
        chosen, best = trial, candidate
    return best


def _trim(
    original: tuple[AnyMessage, ...],
    *,
    max_tokens: int,
    strategy: Literal["first", "last"],
    allow_partial: bool,
    starts: frozenset[str] | None,
    ends: frozenset[str] | None,
    include_system: bool,
) -> Count:
    """The trimming algorithm, asking its driver for each count and split (sync or async).

    In order: a leading system message is set apart (``include_system``) and the rest grouped
    in :func:`units`; with ``last``, the units after the last one that ends on an ``ends`` kind
    go; all the units are kept when they fit, else the newest (``last``) or the oldest
    (``first``) that fit, and, with ``allow_partial``, part of the next one when it is a single
    message; then, with ``last``, the kept units before the first that starts on a ``starts``
    kind go, and, with ``first``, those after the last that ends on an ``ends`` kind.
    """

    def under(messages: list[AnyMessage]) -> Count:
        return (yield ("count", messages)) <= max_tokens

    system: list[AnyMessage] = []
    body = list(original)
    if include_system and body and isinstance(body[0], SystemMessage):
        system = [body.pop(0)]
    grouped = units(body)
    if strategy == "last":
        grouped = drop_after_last(grouped, ends)
    kept: list[list[AnyMessage]]
    if (yield from under([*system, *(m for u in grouped for m in u)])):
        kept = grouped
    elif strategy == "last":
        kept = yield from _newest_that_fit(system, grouped, under, allow_partial)
    else:
        kept = yield from _oldest_that_fit(system, grouped, under, allow_partial)
    if strategy == "last":
        kept = drop_before_first(kept, starts)
    else:
        kept = drop_after_last(kept, ends)
    result = tuple([*system, *(m for u in kept for m in u)])
    return original if result == original else result


def _newest_that_fit(
    system: list[AnyMessage],
    grouped: list[list[AnyMessage]],
    under: Callable[[list[AnyMessage]], Count],
    allow_partial: bool,
) -> Count:
    """The newest units that fit after ``system``, then part of the next older one (a single
    message, ``allow_partial``: its last parts that fit) → the kept units, oldest first."""
    kept: list[list[AnyMessage]] = []
    tail: list[AnyMessage] = []
    for unit in reversed(grouped):
        if (yield from under([*system, *unit, *tail])):
            kept.insert(0, unit)
            tail = [*unit, *tail]
            continue
        if allow_partial and len(unit) == 1:

            def fits(m: AnyMessage, tail: list[AnyMessage] = tail) -> Count:
                return under([*system, m, *tail])

            part = yield from _partial(unit[0], fits, True)
            if part is not None:
                kept.insert(0, [part])
        break
    return kept


def _oldest_that_fit(
    system: list[AnyMessage],
    grouped: list[list[AnyMessage]],
    under: Callable[[list[AnyMessage]], Count],
    allow_partial: bool,
) -> Count:
    """The oldest units that fit after ``system``, then part of the next one (a single message,
    ``allow_partial``: its first parts that fit) → the kept units, in order."""
    kept: list[list[AnyMessage]] = []
    head: list[AnyMessage] = list(system)
    for unit in grouped:
        if (yield from under([*head, *unit])):
            kept.append(unit)
            head.extend(unit)
            continue
        if allow_partial and len(unit) == 1:
            part = yield from _partial(unit[0], lambda m: under([*head, m]), False)
            if part is not None:
                kept.append([part])
        break
    return kept


def drop_after_last(grouped: list[list[AnyMessage]], ends: frozenset[str] | None) -> list[list[AnyMessage]]:
    """The units up to the last that ends on one of the ``ends`` kinds (pure; all when None,
    none when no unit does)."""
    if ends is None:
        return grouped
    end = len(grouped)
    while end and kind_of(grouped[end - 1][-1]) not in ends:
        end -= 1
    return grouped[:end]


def drop_before_first(grouped: list[list[AnyMessage]], starts: frozenset[str] | None) -> list[list[AnyMessage]]:
    """The units from the first that starts on one of the ``starts`` kinds (pure; all when
    None, none when no unit does)."""
    if starts is None:
        return grouped
    start = 0
    while start < len(grouped) and kind_of(grouped[start][0]) not in starts:
        start += 1
    return grouped[start:]


_ARGS_DOC = """
    Args:
        messages: the messages, oldest first (a system message, if any, first).
        max_tokens: the most tokens the kept messages may count.
        token_counter: counts the tokens of a list of messages (see :func:`estimate_counter`).
        strategy: ``last`` keeps the newest messages, ``first`` the oldest.
        allow_partial: split one message's text (user or plain assistant) to fill what is left:
            its last parts with ``last``, its first parts with ``first``.
        text_splitter: splits a text into parts that join back to it (default: lines).
        start_on: with ``last``, drop leading messages until one of this kind (or kinds).
        end_on: drop trailing messages after the last one of this kind (or kinds).
        include_system: with ``last``, keep a leading system message (it counts toward the budget).

    Kinds (``start_on``, ``end_on``) are ``system``, ``user`` (or ``human``), ``assistant`` (or
    ``ai``), ``tool`` (or ``function``), or the message classes.

    Returns:
        The kept messages; ``messages`` itself, as a tuple, when nothing had to go.

    Raises:
        ValueError: a kind that is none of these (it would keep nothing, silently), a
            ``strategy`` other than ``first`` and ``last``, or a negative ``max_tokens``.
"""


def _start(
    messages: Sequence[AnyMessage],
    max_tokens: int,
    strategy: str,
    allow_partial: bool,
    start_on: KindSpec | None,
    end_on: KindSpec | None,
    include_system: bool,
) -> Count:
    if strategy not in ("first", "last"):
        raise ValueError(f"trimming: strategy must be 'first' or 'last', got {strategy!r}")
    if max_tokens < 0:
        raise ValueError(f"trimming: max_tokens must be at least 0, got {max_tokens}")
    return _trim(
        tuple(messages),
        max_tokens=max_tokens,
        strategy=strategy,  # type: ignore[arg-type]
        allow_partial=allow_partial,
        starts=_kinds(start_on, "start_on"),
        ends=_kinds(end_on, "end_on"),
        include_system=include_system,
    )


def trim_messages(
    messages: Sequence[AnyMessage],
    *,
    max_tokens: int,
    token_counter: Callable[[Sequence[AnyMessage]], int],
    strategy: Literal["first", "last"] = "last",
    allow_partial: bool = False,
    text_splitter: Callable[[str], list[str]] | None = None,
    start_on: KindSpec | None = None,
    end_on: KindSpec | None = None,
    include_system: bool = False,
) -> tuple[AnyMessage, ...]:
    """Keep the first or the last messages that fit ``max_tokens`` (a sync counter and splitter;
    :func:`atrim_messages` takes async ones too).
    """
    steps = _start(messages, max_tokens, strategy, allow_partial, start_on, end_on, include_system)
    splitter = text_splitter or split_lines
    answer: Any = None
    try:
        while True:
            what, arg = steps.send(answer)
            answer = token_counter(arg) if what == "count" else splitter(arg)
            if inspect.isawaitable(answer):
                close = getattr(answer, "close", None)
                if close is not None:
                    close()  # never awaited: no "coroutine was never awaited" warning
                raise TypeError(
                    f"trim_messages: the {'token_counter' if what == 'count' else 'text_splitter'} is async; "
                    "use `await atrim_messages(...)`, which takes sync and async ones"
                )
    except StopIteration as done:
        kept: tuple[AnyMessage, ...] = done.value  # what the steps returned
        return kept


async def atrim_messages(
    messages: Sequence[AnyMessage],
    *,
    max_tokens: int,
    token_counter: Callable[[Sequence[AnyMessage]], int | Awaitable[int]],
    strategy: Literal["first", "last"] = "last",
    allow_partial: bool = False,
    text_splitter: Callable[[str], list[str] | Awaitable[list[str]]] | None = None,
    start_on: KindSpec | None = None,
    end_on: KindSpec | None = None,
    include_system: bool = False,
) -> tuple[AnyMessage, ...]:
    """:func:`trim_messages` with a token counter and a text splitter that may be async (a
    coroutine function, or one returning an awaitable), awaited in turn; sync ones work too.
    """
    steps = _start(messages, max_tokens, strategy, allow_partial, start_on, end_on, include_system)
    splitter = text_splitter or split_lines
    answer: Any = None
    try:
        while True:
            what, arg = steps.send(answer)
            answer = token_counter(arg) if what == "count" else splitter(arg)
            if inspect.isawaitable(answer):
                answer = await answer
    except StopIteration as done:
        kept: tuple[AnyMessage, ...] = done.value  # what the steps returned
        return kept


trim_messages.__doc__ = (trim_messages.__doc__ or "") + _ARGS_DOC
atrim_messages.__doc__ = (atrim_messages.__doc__ or "") + _ARGS_DOC


def trim_request(
    request: ChatRequest, limits: ModelLimits, *, output_reserve: int, note: str | None = None
) -> ChatRequest:
    """A request whose history is trimmed, from the oldest, to fit the window (a last resort).

    The system prompt and the tools are kept, and so is the running turn whole: its newest user
    input and every call made since, each with its results (field case C04: a trim must never
    leave the model only the system prompt). Older history is kept from the newest back, in
    whole tool-call units, starting on a user message. ``note`` (if given) is added to the
    system prompt to say that earlier messages were left out.

    Returns:
        ``request`` itself when it fits.

    Raises:
        ContextFullError: the system prompt, the tools, the running turn and the output reserve
            alone are over the window; the message gives each size.
    """
    counter = estimate_counter(limits)
    system = request.system + (f"\n\n{note}" if note else "")
    system_tokens = limits.tokens_of_chars(text_chars(system))
    tools_tokens = limits.tokens_of_chars(tools_chars(request.tools))
    budget = limits.window.count - output_reserve - system_tokens - tools_tokens
    if counter(request.messages) <= budget:
        return request
    messages = request.messages
    start = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], UserMessage)), 0)
    running = tuple(messages[start:])  # the newest user input and the calls made since
    running_tokens = counter(running)
    if running_tokens > budget:
        raise ContextFullError(
            f"the running turn (its newest user input and its {sum(isinstance(m, ToolResultMessage) for m in running)} "
            f"tool result(s)) needs about {running_tokens} tokens, the system prompt {system_tokens}, the tool "
            f"definitions {tools_tokens} and the output reserve {output_reserve}: "
            f"{running_tokens + system_tokens + tools_tokens + output_reserve} "
            f"in all, over the model's window of {limits.window.count} tokens, even with every earlier message left out. "
            "Shorten the tool results (result_cap, per-tool forms) or the input, or use a model with a larger "
            "window. Nothing was sent."
        )
    older = trim_messages(
        messages[:start],
        max_tokens=budget,
        token_counter=lambda kept: counter([*kept, *running]),
        strategy="last",
        start_on="user",
    )
    kept = tuple(m for m in older if not isinstance(m, SystemMessage)) + running
    return msgspec.structs.replace(request, system=system, messages=kept)
