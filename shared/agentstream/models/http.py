"""HTTP for the model adapters: attempts with retries, and every failure converted to a ModelError.

Retried, with exponential backoff (tenacity) or the server's ``Retry-After`` (RFC 9110
§10.2.3: seconds or an HTTP date, capped at :data:`MAX_RETRY_AFTER_S`):

- network errors and timeouts (``httpx.TransportError``), including a stream cut mid-reply;
- HTTP 408, 409, 429 and every 5xx (Anthropic's 529 "overloaded" too);
- a stream that ends before the reply finished (no finish reason: even one that ends with
  ``[DONE]``, which llama.cpp's server sends for a stream it interrupted), and an error event inside a stream that says
  the server is overloaded or failed (see :func:`stream_error`).

Not retried:

- HTTP 401, 403, 404 → :class:`ModelConfigError` (wrong key, model or URL);
- HTTP 400, 413, 422 → :class:`ModelInputRejected` (the same body would be refused again), or
  :class:`ContextWindowExceeded` when the answer says the request is over the model's window
  (any server's wording, see :mod:`agentstream.models.overflow`);
- any other 4xx → :class:`ModelUnanswered` with its status.

Error messages name the URL and the model, show the start of the server's answer, and never
contain the API key (it is masked if a server echoes it back).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx
import tenacity

from agentstream.errors import (
    ContextWindowExceeded,
    ModelConfigError,
    ModelError,
    ModelInputRejected,
    ModelUnanswered,
)
from agentstream.models.overflow import WindowMiss, window_miss
from agentstream.ops import metrics

log = logging.getLogger("agentstream.models")

T = TypeVar("T")

CONFIG_STATUSES = frozenset({401, 403, 404})
REJECTED_STATUSES = frozenset({400, 413, 422})
MAX_RETRY_AFTER_S = 60.0
"""The longest wait a server's Retry-After can ask for, in seconds."""

_RETRY_ERROR_TYPES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "server_error",
        "internal_server_error",
        "timeout_error",
        "service_unavailable",
    }
)
_CONFIG_ERROR_TYPES = frozenset(
    {
        "authentication_error",
        "permission_error",
        "not_found_error",
        "invalid_api_key",
        "model_not_found",
        "permission_denied",
    }
)


class Retryable(Exception):
    """One attempt failed in a way that another attempt may not.

    Attributes:
        reason: what happened, for the final error message.
        status_code: the HTTP status, when there was one.
        retry_after_s: how long the server asked to wait, in seconds, when it said.
    """

    def __init__(self, reason: str, *, status_code: int | None = None, retry_after_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code
        self.retry_after_s = retry_after_s


def retry_after_s(headers: httpx.Headers) -> float | None:
    """The ``Retry-After`` header in seconds (0 to :data:`MAX_RETRY_AFTER_S`), or None."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(when.timestamp() - time.time(), 0.0), MAX_RETRY_AFTER_S)


class _WaitRetryAfter(tenacity.wait.wait_base):
    """Exponential backoff, or the server's Retry-After when it sent one."""

    def __init__(self, backoff_s: float):
        self._exp = tenacity.wait_exponential(multiplier=backoff_s, max=MAX_RETRY_AFTER_S)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        if outcome is not None and outcome.failed:
            exc = outcome.exception()
            if isinstance(exc, Retryable) and exc.retry_after_s is not None:
                return exc.retry_after_s
        return self._exp(retry_state)


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-empty secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def excerpt(text: str, limit: int = 300) -> str:
    """The start of a server's answer, for an error message."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "…"


def _window_exceeded(url: str, label: str, miss: WindowMiss, status: int | None) -> ContextWindowExceeded:
    figures = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("prompt tokens", miss.prompt_tokens),
            ("window tokens", miss.window_tokens),
            ("over by tokens", miss.over_by_tokens),
        )
        if value is not None
    )
    return ContextWindowExceeded(
        f"{url}: the request is over the model's context window ({figures or 'no figures given'}): {label}",
        status_code=status,
        prompt_tokens=miss.prompt_tokens,
        window_tokens=miss.window_tokens,
        over_by_tokens=miss.over_by_tokens,
    )


def check_status(response: httpx.Response, *, url: str, model: str, secrets: Iterable[str] = ()) -> None:
    """Raise for a response that is not a 2xx (its body must have been read).

    Raises:
        Retryable: 408, 409, 429, 5xx (but a 5xx with a window code, as below).
        ModelConfigError: 401, 403, 404.
        ContextWindowExceeded: 400, 413, 422 saying the request is over the window, or a 5xx
            with a window code (``exceed_context_size_error``, ``context_length_exceeded``).
        ModelInputRejected: 400, 413, 422 otherwise.
        ModelUnanswered: any other status that is not 2xx.
    """
    status = response.status_code
    if 200 <= status < 300:
        return
    body = mask(excerpt(response.text), secrets)
    if status >= 500:
        miss = window_miss(status, mask(response.text, secrets))
        if miss is not None:  # a server error that says the window is exceeded: the same body fails again
            raise _window_exceeded(url, f"HTTP {status}: {body}", miss, status)
    if status in (408, 409, 429) or status >= 500:
        raise Retryable(f"HTTP {status}: {body}", status_code=status, retry_after_s=retry_after_s(response.headers))
    if status in CONFIG_STATUSES:
        raise ModelConfigError(
            f"{url}: HTTP {status} (check the model endpoint's URL, the model name {model!r} and the API key): {body}",
            status_code=status,
        )
    if status in REJECTED_STATUSES:
        miss = window_miss(status, mask(response.text, secrets))
        if miss is not None:
            raise _window_exceeded(url, f"HTTP {status}: {body}", miss, status)
        raise ModelInputRejected(f"{url}: HTTP {status}, the server refused this request: {body}", status_code=status)
    raise ModelUnanswered(f"{url}: HTTP {status}: {body}", status_code=status)


def stream_error(error: Any, *, url: str, model: str, secrets: Iterable[str] = ()) -> Exception:
    """The exception for an error object sent inside a stream (status 200, data ``{"error": ...}``).

    OpenAI-compatible servers (mock-llm among them) and the Anthropic API (``event: error``)
    send errors this way once a stream has started. The error's ``type``/``code`` decides:
    overloaded or server errors are :class:`Retryable`; key, permission and model errors are
    :class:`ModelConfigError`; a window miss (:func:`agentstream.models.overflow.window_miss`)
    is :class:`ContextWindowExceeded`; anything else is :class:`ModelInputRejected`.
    """
    info = error if isinstance(error, dict) else {"message": str(error)}
    kind = str(info.get("type") or "")
    code = info.get("code")
    message = mask(excerpt(str(info.get("message") or info)), secrets)
    label = f"error in the stream ({kind or code or 'no type'}): {message}"
    code_text = str(code) if code is not None else ""
    if kind in _RETRY_ERROR_TYPES or code_text in ("429",) or code_text.startswith("5"):
        return Retryable(label)
    if kind in _CONFIG_ERROR_TYPES or code_text in _CONFIG_ERROR_TYPES or code_text in ("401", "403", "404"):
        return ModelConfigError(
            f"{url}: {label} (check the model endpoint's URL, the model name {model!r} and the API key)"
        )
    miss = window_miss(None, json.dumps({"error": info}, default=str))
    if miss is not None:
        return _window_exceeded(url, label, miss, None)
    return ModelInputRejected(f"{url}: {label}")


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    url: str,
    retries: int,
    backoff_s: float,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    secrets: Iterable[str] = (),
    endpoint: str = "",
) -> T:
    """Run ``attempt(n)`` (n = 1, 2, ...) until it returns, retrying :class:`Retryable` and
    ``httpx.TransportError`` up to ``retries`` times.

    Args:
        attempt: one attempt; it raises Retryable for a failure worth another attempt and a
            ModelError for one that is not.
        url: the URL, for error messages.
        retries: how many times a retryable failure is retried.
        backoff_s: the first backoff in seconds (doubles each retry) when the server gave no
            Retry-After.
        sleep: the coroutine that waits (tests pass one that records the waits).
        secrets: strings masked in error messages (the key).
        endpoint: the endpoint id, the label of ``agentstream_model_errors_total`` (every
            failed attempt, by HTTP status or ``network``/``timeout``/``invalid_output``) and
            ``agentstream_model_retries_total`` (every retried one).

    Raises:
        ModelUnanswered: every attempt failed in a retryable way; ``status_code`` is the last
            HTTP status, or None for a network failure.
        ModelError: an attempt failed in a way that is not retried.
    """
    secrets = tuple(secrets)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            metrics.MODEL_RETRIES.labels(endpoint=endpoint, status=metrics.model_error_status(exc)).inc()
        why = exc.reason if isinstance(exc, Retryable) else f"{type(exc).__name__}: {exc}"
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        log.info(
            "model call to %s failed (%s); retrying in %.1f s (attempt %d of %d)",
            url,
            mask(str(why), secrets),
            wait_s,
            state.attempt_number + 1,
            retries + 1,
        )

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=_WaitRetryAfter(backoff_s),
        retry=tenacity.retry_if_exception_type((httpx.TransportError, Retryable)),
        reraise=True,
        sleep=sleep,
        before_sleep=before_sleep,
    )
    count = 0
    try:
        async for state in retrying:
            with state:
                count += 1
                try:
                    result = await attempt(count)
                except Exception as exc:
                    metrics.MODEL_ERRORS.labels(endpoint=endpoint, status=metrics.model_error_status(exc)).inc()
                    raise
            if not state.retry_state.outcome or not state.retry_state.outcome.failed:
                return result
    except Retryable as exc:
        raise ModelUnanswered(
            f"{url}: {mask(exc.reason, secrets)} (after {count} attempt{'s' if count != 1 else ''})",
            status_code=exc.status_code,
        ) from None
    except httpx.TransportError as exc:
        raise ModelUnanswered(
            f"{url}: {type(exc).__name__} after {count} attempt{'s' if count != 1 else ''}: {mask(str(exc), secrets)}"
        ) from exc
    except ModelError:
        raise
    raise AssertionError("unreachable: tenacity ended without a result or an error")
