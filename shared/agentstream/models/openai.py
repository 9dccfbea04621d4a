"""The OpenAI-compatible chat-completions adapter over httpx (async), streaming or not.

Any server that speaks ``POST {base_url}/chat/completions`` (OpenAI, vLLM, Ollama, llama.cpp,
DeepSeek, ...). Streamed replies are server-sent ``chat.completion.chunk`` events ending with
``data: [DONE]``; an error object inside the stream (``data: {"error": ...}``, as servers send
once a stream has started) is converted like an HTTP error. Retries, attempt ids and deltas:
see :mod:`agentstream.models.base`. The key is sent as a Bearer token.
"""

from __future__ import annotations

from typing import Any

from httpx_sse import ServerSentEvent

from agentstream.context.request import ChatRequest
from agentstream.models import openai_format
from agentstream.models.base import HttpChatModel
from agentstream.models.http import stream_error
from agentstream.wire.deltas import Delta
from agentstream.wire.events import ModelOutput


class OpenAIChatModel(HttpChatModel):
    """Calls one OpenAI-compatible endpoint (see :class:`~agentstream.models.base.HttpChatModel`)."""

    provider = "openai"

    @property
    def url(self) -> str:
        return f"{self.endpoint.base_url}/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {**self.endpoint.headers, "content-type": "application/json"}
        key = self.endpoint.api_key
        if key is not None and key.get_secret_value():
            headers["authorization"] = f"Bearer {key.get_secret_value()}"
        return headers

    def _parse(self, payload: dict[str, Any], request: ChatRequest, **fields: Any) -> ModelOutput:
        if "error" in payload and "choices" not in payload:
            raise stream_error(payload["error"], url=self.url, model=self.endpoint.model, secrets=self._secrets())
        return openai_format.parse_response(payload, max_output_tokens=request.max_output_tokens, **fields)

    def _assembler(self) -> openai_format.StreamAssembler:
        return openai_format.StreamAssembler()

    def _feed(self, assembler: openai_format.StreamAssembler, event: ServerSentEvent) -> tuple[list[Delta], bool]:
        if event.data.strip() == "[DONE]":
            assembler.mark_done()
            return [], True
        if not event.data.strip():
            return [], False
        chunk = self._json(event)
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            raise stream_error(chunk["error"], url=self.url, model=self.endpoint.model, secrets=self._secrets())
        if not isinstance(chunk, dict):
            return [], False
        return assembler.feed(chunk), False

    def _stream_output(
        self, assembler: openai_format.StreamAssembler, request: ChatRequest, **fields: Any
    ) -> ModelOutput:
        return assembler.output(max_output_tokens=request.max_output_tokens, **fields)
