"""What every HTTP model adapter does: send the body, stream or not, retry, publish deltas.

An adapter subclass names its URL and headers, and how to read a whole response and a stream
event (its pure format module does the reading). :meth:`HttpChatModel.complete`:

1. builds the body with :func:`agentstream.models.formats.request_body` (what replay rebuilds);
2. sends it, streamed when the endpoint streams (server-sent events parsed by ``httpx-sse``);
3. gives each HTTP attempt a fresh attempt id and, when the answer is streamed, publishes its
   pieces as deltas tagged with it: ``start``, the pieces, then ``end`` or ``abort`` (see
   :mod:`agentstream.runtime.deltas`), so a client drops the partial output of an attempt that
   failed and was retried. An answer that comes whole (not streamed, or a server that answered
   a streamed request with one JSON object) publishes no delta: its ModelOutput in the trace is
   all a follower shows of it, and the delta stream costs no command;
4. retries as :mod:`agentstream.models.http` says;
5. returns one ModelOutput with the request's fingerprint, the attempt id and the endpoint id.
   The API key is sent as a header and never recorded.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import msgspec
import msgspec.structs
from httpx_sse import EventSource, ServerSentEvent

from agentstream.context.request import ChatRequest
from agentstream.errors import ConfigError, InvalidModelOutput, ModelDeadlineExceeded, ModelInputRejected
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint
from agentstream.models.formats import CallOptions
from agentstream.models.http import Retryable, check_status, mask, with_retries
from agentstream.ops.redact import redact_url, url_secrets
from agentstream.wire.deltas import Delta, DeltaSink, new_attempt_id
from agentstream.wire.events import ModelOutput

log = logging.getLogger("agentstream.models")

DEADLINE_SETTING = "AGENTSTREAM_MODEL_DEADLINE_S"


class ChatModel(Protocol):
    """A model the agent loop can call (every adapter, and test doubles)."""

    endpoint: ModelEndpoint

    async def complete(
        self,
        request: ChatRequest,
        *,
        turn_id: str,
        step: int,
        deltas: DeltaSink | None = None,
        options: CallOptions | None = None,
    ) -> ModelOutput:
        """One model call → its ModelOutput."""

    async def aclose(self) -> None:
        """Release what the model holds."""


class _Attempt:
    """One HTTP attempt's identity and delta publishing."""

    def __init__(self, sink: DeltaSink | None, *, turn_id: str, step: int):
        self.id = new_attempt_id()
        self.sink = sink
        self.turn_id = turn_id
        self.step = step
        self.started = False

    async def emit(self, delta: Delta) -> None:
        if self.sink is None:
            return
        if delta.kind == "start":
            self.started = True
        await self.sink.emit(msgspec.structs.replace(delta, turn_id=self.turn_id, step=self.step, attempt=self.id))

    async def abort(self, reason: str) -> None:
        if self.started:
            try:
                await self.emit(Delta(kind="abort", reason=reason))
            except Exception:  # pragma: no cover - a sink must not raise; never mask the real error
                log.debug("could not publish the abort of attempt %s", self.id, exc_info=True)


class HttpChatModel(abc.ABC):
    """The shared machinery of the HTTP adapters (see the module docstring).

    Args:
        endpoint: the endpoint (URL, model, key, quirks).
        client: a shared ``httpx.AsyncClient`` (one per process); made here when None.
        timeout_s: one HTTP request's timeout in seconds (the endpoint's own setting wins);
            for a stream it bounds the wait for each next piece.
        retries: how many times a retryable failure is retried (the endpoint's own setting wins).
        backoff_s: the first backoff in seconds (doubles each retry) when the server sent no
            Retry-After.
        sleep: the coroutine that waits between attempts (tests record the waits with it).
        deadline_s: the most one call may take as a whole — connect, every attempt and its
            retries' waits, to the last byte of the answer — in seconds; None: no deadline
            beyond ``timeout_s`` per read. A server that keeps a stream open (an empty chunk
            every few seconds) cannot hold a call past it.
    """

    provider: str = ""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        deadline_s: float | None = None,
    ):
        if endpoint.provider != self.provider:
            raise ConfigError(f"{type(self).__name__} serves {self.provider!r} endpoints, not {endpoint.provider!r}")
        self.endpoint = endpoint
        self._own_client = client is None
        self._client = client or httpx.AsyncClient()
        self.timeout_s = endpoint.timeout_s if endpoint.timeout_s is not None else timeout_s
        self.retries = endpoint.retries if endpoint.retries is not None else retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.deadline_s = deadline_s

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    # --- what a subclass provides -----------------------------------------------------------

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The endpoint's URL for one call."""

    @abc.abstractmethod
    def _headers(self) -> dict[str, str]:
        """The HTTP headers of a call (the key's header among them)."""

    @abc.abstractmethod
    def _parse(self, payload: dict[str, Any], request: ChatRequest, **fields: Any) -> ModelOutput:
        """A whole response → ModelOutput (raises ValueError when it is not one)."""

    @abc.abstractmethod
    def _assembler(self) -> Any:
        """A new assembler of one streamed reply."""

    @abc.abstractmethod
    def _feed(self, assembler: Any, event: ServerSentEvent) -> tuple[list[Delta], bool]:
        """One server-sent event → (pieces, the stream is complete). Raises for an error event."""

    @abc.abstractmethod
    def _stream_output(self, assembler: Any, request: ChatRequest, **fields: Any) -> ModelOutput:
        """The assembled streamed reply as a ModelOutput."""

    def _fallback_body(
        self, request: ChatRequest, options: CallOptions | None, error: ModelInputRejected, sent: bytes
    ) -> bytes | None:
        """Another body to send once after the server refused ``sent`` (None: give up)."""
        return None

    # --- the call ---------------------------------------------------------------------------

    def body(self, request: ChatRequest, options: CallOptions | None = None) -> bytes:
        """The exact request body for ``request`` (pure; see :mod:`agentstream.models.formats`)."""
        return formats.request_body(request, self.endpoint, options=options)

    def _secrets(self) -> tuple[str, ...]:
        """What is masked in every message: the API key and the credentials inside the base URL."""
        key = self.endpoint.api_key
        secrets = (key.get_secret_value(),) if key is not None and key.get_secret_value() else ()
        return secrets + url_secrets(self.endpoint.base_url)

    @property
    def shown_url(self) -> str:
        """:attr:`url` as messages show it: user-info masked (see :mod:`agentstream.ops.redact`)."""
        return redact_url(self.url)

    async def complete(
        self,
        request: ChatRequest,
        *,
        turn_id: str,
        step: int,
        deltas: DeltaSink | None = None,
        options: CallOptions | None = None,
    ) -> ModelOutput:
        """One model call → its ModelOutput (fingerprint, attempt id, endpoint id and latency set).

        Args:
            request: the provider-neutral request.
            turn_id, step: the model call (they tag the output and the deltas).
            deltas: where the reply's pieces go while it is written (None: nowhere).
            options: per-call settings (seed, response format).

        Raises:
            ModelConfigError: HTTP 401/403/404 (or such an error inside a stream).
            ModelInputRejected: HTTP 400/413/422 (after the one fallback body, where the adapter has one).
            ModelUnanswered: no answer after the retries.
            InvalidModelOutput: the answer is not a response of this API.
            ModelDeadlineExceeded: the call ran past ``deadline_s``.
        """
        body = self.body(request, options)
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._complete(body, request, turn_id=turn_id, step=step, deltas=deltas, options=options)
        except TimeoutError:
            raise ModelDeadlineExceeded(
                f"{self.shown_url}: the model call ran past its deadline of {self.deadline_s:g} s "
                f"({DEADLINE_SETTING}: connect to the last byte of the answer, retries included)",
                deadline_s=self.deadline_s or 0.0,
            ) from None

    async def _complete(
        self, body: bytes, request: ChatRequest, *, turn_id: str, step: int, deltas, options
    ) -> ModelOutput:
        try:
            return await self._send(body, request, turn_id=turn_id, step=step, deltas=deltas)
        except ModelInputRejected as exc:
            fallback = self._fallback_body(request, options, exc, body)
            if fallback is None or fallback == body:
                raise
            log.warning("%s refused the request (%s); sending it once more as the fallback body", self.shown_url, exc)
            return await self._send(fallback, request, turn_id=turn_id, step=step, deltas=deltas)

    async def _send(
        self, body: bytes, request: ChatRequest, *, turn_id: str, step: int, deltas: DeltaSink | None
    ) -> ModelOutput:
        stream = formats.streams(request, self.endpoint)
        started = time.perf_counter()
        sha = formats.fingerprint(body)

        def fields(attempt: _Attempt) -> dict[str, Any]:
            return {
                "turn_id": turn_id,
                "step": step,
                "model": self.endpoint.model,
                "request_sha256": sha,
                "latency_ms": (time.perf_counter() - started) * 1000.0,
                "endpoint": self.endpoint.id,
                "attempt_id": attempt.id,
            }

        async def one(_number: int) -> ModelOutput:
            attempt = _Attempt(deltas, turn_id=turn_id, step=step)
            if stream:
                return await self._stream_once(body, request, attempt, fields)
            response = await self._client.post(self.url, content=body, headers=self._headers(), timeout=self.timeout_s)
            check_status(response, url=self.shown_url, model=self.endpoint.model, secrets=self._secrets())
            return self._read_whole(response.content, request, fields(attempt))  # whole: no delta

        return await with_retries(
            one,
            url=self.shown_url,
            retries=self.retries,
            backoff_s=self.backoff_s,
            sleep=self.sleep,
            secrets=self._secrets(),
            endpoint=self.endpoint.id,
        )

    def _read_whole(self, raw: bytes, request: ChatRequest, fields: dict[str, Any]) -> ModelOutput:
        try:
            payload = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidModelOutput(f"{self.shown_url}: the response is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise InvalidModelOutput(f"{self.shown_url}: the response is not a JSON object")
        try:
            return self._parse(payload, request, **fields)
        except ValueError as exc:
            raise InvalidModelOutput(f"{self.shown_url}: {mask(str(exc), self._secrets())}") from exc

    async def _stream_once(
        self, body: bytes, request: ChatRequest, attempt: _Attempt, fields: Callable[[_Attempt], dict[str, Any]]
    ) -> ModelOutput:
        async with self._client.stream(
            "POST", self.url, content=body, headers=self._headers(), timeout=self.timeout_s
        ) as response:
            if not 200 <= response.status_code < 300:
                await response.aread()
                check_status(response, url=self.shown_url, model=self.endpoint.model, secrets=self._secrets())
            if "text/event-stream" not in response.headers.get("content-type", ""):
                # the server did not stream: a whole answer, published by no delta
                return self._read_whole(await response.aread(), request, fields(attempt))
            assembler = self._assembler()
            await attempt.emit(Delta(kind="start"))
            try:
                complete = False
                async for event in EventSource(response).aiter_sse():
                    pieces, complete = self._feed(assembler, event)
                    for piece in pieces:
                        await attempt.emit(piece)
                    if complete:
                        break
                if not assembler.finished:
                    raise Retryable(
                        "the stream ended before the reply finished (no finish reason"
                        + (
                            ": an end event alone, as a server sends for a stream it interrupted)"
                            if complete
                            else ", no end event)"
                        )
                    )
                output = self._stream_output(assembler, request, **fields(attempt))
            except BaseException as exc:  # a cut stream, an error event, a cancel: drop this attempt's output
                await attempt.abort(f"{type(exc).__name__}: {mask(str(exc), self._secrets())}")
                raise
        await attempt.emit(Delta(kind="end", stop_reason=output.stop_reason))
        return output

    @staticmethod
    def _json(event: ServerSentEvent) -> Any:
        try:
            return msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            raise Retryable(f"a stream event is not JSON: {event.data[:200]!r}") from None
