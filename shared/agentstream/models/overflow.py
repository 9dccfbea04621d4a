"""Whether a server's refusal says the request is over the model's context window (pure).

OpenAI-compatible servers and the Anthropic API each word it their own way, and some state the
figures; :func:`window_miss` reads them all, so the caller can tell "shorten the request" from
any other refused input. The wordings, as each server sends them (HTTP 400 unless noted):

- OpenAI: ``code: context_length_exceeded``, "This model's maximum context length is 8192
  tokens. However, your messages resulted in 9013 tokens. Please reduce the length of the
  messages." (also the older "...you requested 9013 tokens (8013 in the messages, 1000 in the
  completion)");
- vLLM: the same sentences (``BadRequestError``), and newer releases "...maximum context length is
  4096 tokens and your request has 5000 input tokens", "'max_tokens' or 'max_completion_tokens'
  is too large: ...", "The decoder prompt (length 5000) is longer than the maximum model length
  of 4096";
- llama.cpp's server: ``type: exceed_context_size_error``, "the request exceeds the available
  context size, try increasing it", with ``n_prompt_tokens`` and ``n_ctx``;
- Ollama: "prompt too long; exceeded max context length by 120 tokens", "input length exceeds
  the context length" (and "...maximum context length");
- LM Studio: "Trying to keep the first 5000 tokens when context the overflows. However, the model
  is loaded with context length of only 4096 tokens, which is not enough." and "The number of
  tokens to keep from the initial prompt is greater than the context length";
- LiteLLM's proxy: ``litellm.ContextWindowExceededError`` in the message (whatever the backend);
- Anthropic: "prompt is too long: 208396 tokens > 200000 maximum", and "input length and
  `max_tokens` exceed context limit: 195000 + 8192 > 200000";
- Hugging Face's text-generation-inference (and Together, which runs it), HTTP 422:
  "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000
  `inputs` tokens and 500 `max_new_tokens`";
- Gemini's and Mistral's OpenAI-compatible endpoints: "The input token count (40000) exceeds the
  maximum number of tokens allowed (32768)", "Prompt contains 40000 tokens ... too large for
  model with 32768 maximum context length".

A refusal is taken for a window miss only by these wordings or codes (never by its status
alone: a 400 has many other causes), on the statuses of a refused input (400, 413, 422) or
inside a stream; a server error (5xx) only by its code (``context_length_exceeded``,
``exceed_context_size_error``), as older llama.cpp servers send it: retrying the same body
would be refused again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

REFUSED_STATUSES = frozenset({400, 413, 422})

_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"})

_WORDINGS = (
    re.compile(r"maximum context length", re.I),
    re.compile(r"context[_ ]length[_ ]exceeded", re.I),
    re.compile(r"exceeds? the (available )?context (size|length|window)", re.I),
    re.compile(r"exceed(s|ed)? (the )?max(imum)? context length", re.I),
    re.compile(r"prompt (is )?too long", re.I),
    re.compile(r"exceed context limit", re.I),
    re.compile(r"ContextWindowExceeded", re.I),
    re.compile(r"context length of only \d+ tokens", re.I),
    re.compile(r"greater than the context length", re.I),
    re.compile(r"longer than the maximum model length", re.I),
    re.compile(r"input token count.{0,40}exceeds the maximum number of tokens", re.I),
    re.compile(r"too large for model with \d+ maximum context length", re.I),
    re.compile(r"`inputs` tokens \+ `max_new_tokens` must be <=", re.I),
)

# (pattern, which group is the prompt, which the window); the first that matches gives each figure
_PROMPT_FIGURES = (
    re.compile(r"your messages resulted in (\d+) tokens", re.I),
    re.compile(r"\((\d+) in the messages", re.I),
    re.compile(r"your request has (\d+) input tokens", re.I),
    re.compile(r"prompt is too long: (\d+) tokens", re.I),
    re.compile(r"exceed context limit: (\d+) \+", re.I),
    re.compile(r"decoder prompt \(length (\d+)\)", re.I),
    re.compile(r"keep the first (\d+) tokens", re.I),
    re.compile(r"input token count \((\d+)\)", re.I),
    re.compile(r"prompt contains (\d+) tokens", re.I),
    re.compile(r"Given: (\d+) `inputs` tokens", re.I),
)
_WINDOW_FIGURES = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"tokens > (\d+) maximum", re.I),
    re.compile(r"> (\d+), decrease input length", re.I),
    re.compile(r"maximum model length of (\d+)", re.I),
    re.compile(r"context length of only (\d+) tokens", re.I),
    re.compile(r"maximum number of tokens allowed \((\d+)\)", re.I),
    re.compile(r"model with (\d+) maximum context length", re.I),
    re.compile(r"`max_new_tokens` must be <= (\d+)", re.I),
)
_OVER_BY = re.compile(r"exceeded max context length by (\d+) tokens", re.I)


@dataclass(frozen=True)
class WindowMiss:
    """A server's statement that a request is over the model's window, with its figures.

    Attributes:
        prompt_tokens: the prompt's size in tokens as the server counted it (None: not said).
        window_tokens: the model's window in tokens as the server stated it (None: not said).
        over_by_tokens: by how many tokens the request is over (None: not said; Ollama says only this).
    """

    prompt_tokens: int | None = None
    window_tokens: int | None = None
    over_by_tokens: int | None = None


def _error_object(text: str) -> dict[str, Any]:
    """The ``error`` object of a JSON error body (``{"error": {...}}``), or {}."""
    try:
        payload = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(payload, dict):
        return {}
    error = payload.get("error", payload)
    return error if isinstance(error, dict) else {"message": str(error)}


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def window_miss(status: int | None, text: str) -> WindowMiss | None:
    """A refusal's body → the window miss it states, or None when it says something else.

    Args:
        status: the HTTP status (None: an error event inside a stream, whose status was 200).
        text: the body as received (JSON or not), or the stream error's JSON text.

    Returns:
        The figures the server gave (any may be None), or None when the answer is not about the
        context window, or its status is neither one of a refused input (400, 413, 422) nor a
        server error (5xx) with a window code.
    """
    server_error = status is not None and status >= 500
    if status is not None and status not in REFUSED_STATUSES and not server_error:
        return None
    error = _error_object(text)
    codes = {str(error.get(key) or "") for key in ("code", "type")}
    message = str(error.get("message") or "") if error else ""
    said = f"{message}\n{text}"
    if server_error:
        if not codes & _CODES:
            return None
    elif not (codes & _CODES or any(pattern.search(said) for pattern in _WORDINGS)):
        return None
    return WindowMiss(
        prompt_tokens=_int(error.get("n_prompt_tokens")) or _first(_PROMPT_FIGURES, said),
        window_tokens=_int(error.get("n_ctx")) or _first(_WINDOW_FIGURES, said),
        over_by_tokens=_first((_OVER_BY,), said),
    )
