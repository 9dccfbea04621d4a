"""Model limits and size estimates: how many tokens a request takes, without a tokenizer.

A model's limits are its context window in tokens and how many characters make one of its
tokens on average (3.0 by default: low on purpose, so estimates count more tokens than a real
tokenizer would). A size is either a number of :class:`Tokens` or a :class:`Share` of the window
(their own types, so one is never taken for the other).

The estimate of a request counts every part that the provider counts: the system prompt, each
message's text, tool-call names, ids and arguments, replayed reasoning, the tool definitions
(JSON schemas), and a per-message overhead. The builder adds the output reserve on top, and
corrects the estimate with the prompt token count that a model output recorded (see
:func:`corrected_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import msgspec

from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    Message,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)

MESSAGE_OVERHEAD_CHARS = 12
"""Characters counted for each message beyond its text (role, separators): about 4 tokens."""

TOOL_CALL_OVERHEAD_CHARS = 24
"""Characters counted for each tool call beyond its name, id and arguments."""


@dataclass(frozen=True, order=True)
class Tokens:
    """A number of tokens (its own type, so it is never taken for a share of a window).

    Attributes:
        count: the number of tokens, at least 0.
    """

    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"a number of tokens cannot be negative, got {self.count}")


@dataclass(frozen=True)
class Share:
    """A share of the window of the model that the call goes to: ``Share(0.6)`` of 100 000 is 60 000.

    Attributes:
        fraction: above 0 and at most 1.

    Raises:
        ValueError: ``fraction`` is not in (0, 1].
    """

    fraction: float

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"a share of the window must be above 0 and at most 1, got {self.fraction}")


Threshold = Union[Share, Tokens]
"""A size of a context: a :class:`Share` of the window or a number of :class:`Tokens`."""


@dataclass(frozen=True)
class ModelLimits:
    """What one model accepts: its window and its characters per token.

    Attributes:
        window: the most tokens one call may send and receive together.
        characters_per_token: average characters in one token of the model (default 3.0).
        model: the provider's model name whose recorded prompt token counts correct the
            estimate; None trusts the counts of any model output in the trace.
    """

    window: Tokens
    characters_per_token: float = 3.0
    model: str | None = None

    def __post_init__(self) -> None:
        if self.characters_per_token <= 0:
            raise ValueError(f"characters_per_token must be above 0, got {self.characters_per_token}")
        if self.window.count <= 0:
            raise ValueError(f"the window must hold at least one token, got {self.window.count}")

    def tokens(self, threshold: Threshold) -> int:
        """A threshold in tokens of this model's window."""
        if isinstance(threshold, Tokens):
            return threshold.count
        return int(self.window.count * threshold.fraction)

    def tokens_of_chars(self, chars: int) -> int:
        """Estimated tokens of ``chars`` characters (rounded up, so the estimate is conservative)."""
        return math.ceil(chars / self.characters_per_token) if chars > 0 else 0

    def chars_of_tokens(self, tokens: int) -> int:
        """About how many characters ``tokens`` tokens hold (rounded down)."""
        return int(tokens * self.characters_per_token)


DEFAULT_LIMITS = ModelLimits(window=Tokens(32_000))
"""Limits for an agent that names none: a conservative 32 000-token window, 3.0 characters a token."""


def message_chars(message: Message) -> int:
    """Characters that one message counts for in the estimate (text, calls, reasoning, overhead)."""
    kind = type(message)
    if kind is UserMessage:
        return len(message.text) + MESSAGE_OVERHEAD_CHARS  # type: ignore[union-attr]
    if kind is ToolResultMessage:
        return len(message.text) + len(message.call_id) + MESSAGE_OVERHEAD_CHARS  # type: ignore[union-attr]
    if kind is AssistantMessage:
        assert isinstance(message, AssistantMessage)
        chars = len(message.content) + MESSAGE_OVERHEAD_CHARS + (len(message.reasoning) if message.reasoning else 0)
        for call in message.tool_calls:
            chars += len(call.id) + len(call.name) + len(call.arguments) + TOOL_CALL_OVERHEAD_CHARS
        return chars
    return len(msgspec.json.encode(message)) + MESSAGE_OVERHEAD_CHARS


def tools_chars(tools: tuple[ToolDefinition, ...]) -> int:
    """Characters of the tool definitions as the provider receives them (JSON schemas included)."""
    return len(msgspec.json.encode(tools)) if tools else 0


def request_chars(request: ChatRequest) -> int:
    """Characters of a whole request: system prompt, messages and tool definitions."""
    return (
        len(request.system)
        + MESSAGE_OVERHEAD_CHARS
        + sum(message_chars(m) for m in request.messages)
        + tools_chars(request.tools)
    )


def estimate_tokens(request: ChatRequest, limits: ModelLimits) -> int:
    """Estimated prompt tokens of a request (no output reserve, no recorded correction)."""
    return limits.tokens_of_chars(request_chars(request))


def corrected_tokens(chars_now: int, limits: ModelLimits, recorded: tuple[int, int] | None) -> int:
    """Prompt tokens of a request, corrected by the count a model output recorded.

    Args:
        chars_now: characters of the request now (see :func:`request_chars`).
        limits: the model's limits.
        recorded: ``(prompt_tokens, chars_then)``: the real prompt token count that an earlier
            call recorded and the characters of that call's request; None when no call did.

    Returns:
        The recorded count plus the estimate of what changed since (``chars_now - chars_then``),
        or the plain estimate without a recorded count. Never below 0.
    """
    if recorded is None:  # limits.tokens_of_chars, inline (called at every offer of every pass)
        return math.ceil(chars_now / limits.characters_per_token) if chars_now > 0 else 0
    prompt_tokens, chars_then = recorded
    delta = chars_now - chars_then
    if delta >= 0:
        return prompt_tokens + (math.ceil(delta / limits.characters_per_token) if delta > 0 else 0)
    return max(0, prompt_tokens - int(-delta / limits.characters_per_token))
