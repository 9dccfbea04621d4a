"""The Anthropic Messages adapter over httpx (async), streaming or not.

``POST {base_url}/v1/messages`` with the ``x-api-key`` and ``anthropic-version`` headers.
Streamed replies are the documented server-sent events (``message_start`` …
``message_stop``); an ``error`` event is converted like an HTTP error (``overloaded_error`` is
retried). When the API refuses a request because of a thinking block's signature (HTTP 400),
the identical body is never sent again: the adapter sends once more without any thinking block
(and so with thinking off for a call that continues a tool turn), as field case C06 asks.
Rendering rules: :mod:`agentstream.models.anthropic_format`.
"""

from __future__ import annotations

from typing import Any

from httpx_sse import ServerSentEvent

from agentstream.context.request import ChatRequest
from agentstream.errors import ModelInputRejected
from agentstream.models import anthropic_format, formats
from agentstream.models.base import HttpChatModel
from agentstream.models.formats import CallOptions
from agentstream.models.http import stream_error
from agentstream.wire.deltas import Delta
from agentstream.wire.events import ModelOutput


class AnthropicMessagesModel(HttpChatModel):
    """Calls one Anthropic Messages endpoint (see :class:`~agentstream.models.base.HttpChatModel`)."""

    provider = "anthropic"

    @property
    def url(self) -> str:
        base = self.endpoint.base_url
        return f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {
            **self.endpoint.headers,
            "content-type": "application/json",
            "anthropic-version": self.endpoint.anthropic_version,
        }
        key = self.endpoint.api_key
        if key is not None and key.get_secret_value():
            headers["x-api-key"] = key.get_secret_value()
        return headers

    def _parse(self, payload: dict[str, Any], request: ChatRequest, **fields: Any) -> ModelOutput:
        if payload.get("type") == "error":
            raise stream_error(payload.get("error"), url=self.url, model=self.endpoint.model, secrets=self._secrets())
        return anthropic_format.parse_response(payload, **fields)

    def _assembler(self) -> anthropic_format.StreamAssembler:
        return anthropic_format.StreamAssembler()

    def _feed(self, assembler: anthropic_format.StreamAssembler, event: ServerSentEvent) -> tuple[list[Delta], bool]:
        if not event.data.strip():
            return [], False
        data = self._json(event)
        if not isinstance(data, dict):
            return [], False
        if data.get("type") == "error" or event.event == "error":
            raise stream_error(
                data.get("error", data), url=self.url, model=self.endpoint.model, secrets=self._secrets()
            )
        pieces = assembler.feed(data)
        return pieces, assembler.finished

    def _stream_output(
        self, assembler: anthropic_format.StreamAssembler, request: ChatRequest, **fields: Any
    ) -> ModelOutput:
        return assembler.output(**fields)

    def _fallback_body(
        self, request: ChatRequest, options: CallOptions | None, error: ModelInputRejected, sent: bytes
    ) -> bytes | None:
        if "signature" not in str(error).lower():
            return None
        return formats.request_body(request, self.endpoint, options=options, replay_thinking=False)
