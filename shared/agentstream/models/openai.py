"""The OpenAI-compatible chat-completions adapter over httpx (async).

Retries (tenacity) network errors, timeouts and HTTP 408/409/429/5xx with exponential backoff,
honouring ``Retry-After`` (RFC 9110 §10.2.3: seconds or an HTTP date). HTTP 401/403/404 is a
configuration error (wrong key, model or URL) and 400/413/422 an input the server refuses;
neither is retried. The API key is sent as a Bearer token and never logged or recorded.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx
import msgspec
import tenacity

from agentstream.context.request import ChatRequest
from agentstream.errors import InvalidModelOutput, ModelConfigError, ModelUnanswered
from agentstream.events import ModelOutput
from agentstream.models import openai_format
from agentstream.models.endpoints import ModelEndpoint

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
CONFIG_STATUSES = frozenset({401, 403, 404})
MAX_RETRY_AFTER_S = 60.0


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
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
            if isinstance(exc, _RetryableStatus):
                after = _retry_after_s(exc.response)
                if after is not None:
                    return after
        return self._exp(retry_state)


class OpenAIChatModel:
    """Calls one OpenAI-compatible endpoint.

    Args:
        endpoint: the endpoint (base URL, model, key).
        client: a shared ``httpx.AsyncClient`` (one per process); made here when None.
        timeout_s: one HTTP request's timeout, in seconds.
        retries: how many times a retryable failure is retried.
        backoff_s: the first backoff in seconds (doubles each retry).
    """

    def __init__(
        self,
        endpoint: ModelEndpoint,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
    ):
        self.endpoint = endpoint
        self._own_client = client is None
        self._client = client or httpx.AsyncClient()
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    def body(self, request: ChatRequest) -> bytes:
        """The exact request body for ``request`` (pure; see :mod:`openai_format`)."""
        return openai_format.request_body(request, model=self.endpoint.model)

    async def complete(self, request: ChatRequest, *, turn_id: str, step: int) -> ModelOutput:
        """One model call → its ModelOutput (fingerprint and latency set).

        Raises:
            ModelConfigError: HTTP 401/403/404.
            ModelUnanswered: no answer after the retries, or HTTP 400/413/422.
            InvalidModelOutput: the answer is not a chat-completions response.
        """
        body = self.body(request)
        started = time.perf_counter()
        payload = await self._post(body)
        try:
            return openai_format.parse_response(
                payload,
                turn_id=turn_id,
                step=step,
                request_sha256=openai_format.fingerprint(body),
                latency_ms=(time.perf_counter() - started) * 1000.0,
                model=self.endpoint.model,
            )
        except ValueError as exc:
            raise InvalidModelOutput(f"{self.endpoint.base_url}: {exc}") from exc

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.endpoint.api_key is not None and self.endpoint.api_key.get_secret_value():
            headers["authorization"] = f"Bearer {self.endpoint.api_key.get_secret_value()}"
        return headers

    async def _post(self, body: bytes) -> dict[str, Any]:
        url = f"{self.endpoint.base_url}/chat/completions"
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=_WaitRetryAfter(self.backoff_s),
            retry=tenacity.retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._client.post(url, content=body, headers=self._headers(), timeout=self.timeout_s)
                    if response.status_code in RETRY_STATUSES:
                        raise _RetryableStatus(response)
        except _RetryableStatus as exc:
            raise ModelUnanswered(
                f"{url}: HTTP {exc.response.status_code} after {self.retries + 1} attempts: {_excerpt(exc.response)}",
                status_code=exc.response.status_code,
            ) from None
        except httpx.TransportError as exc:
            raise ModelUnanswered(f"{url}: {type(exc).__name__} after {self.retries + 1} attempts: {exc}") from exc
        if response.status_code in CONFIG_STATUSES:
            raise ModelConfigError(
                f"{url}: HTTP {response.status_code} (check the model endpoint's URL, model name "
                f"{self.endpoint.model!r} and API key): {_excerpt(response)}"
            )
        if response.status_code >= 400:
            raise ModelUnanswered(
                f"{url}: HTTP {response.status_code}, the server refused this request: {_excerpt(response)}",
                status_code=response.status_code,
            )
        try:
            payload = msgspec.json.decode(response.content)
        except msgspec.DecodeError as exc:
            raise InvalidModelOutput(f"{url}: the response is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise InvalidModelOutput(f"{url}: the response is not a JSON object")
        return payload


def _excerpt(response: httpx.Response, limit: int = 300) -> str:
    text = response.text
    return text if len(text) <= limit else text[:limit] + "…"
