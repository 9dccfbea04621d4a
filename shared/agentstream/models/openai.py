"""The OpenAI-compatible chat-completions adapter over httpx (async), streaming or not.

Any server that speaks ``POST {base_url}/chat/completions`` (OpenAI, vLLM, Ollama, llama.cpp,
DeepSeek, ...). Streamed replies are server-sent ``chat.completion.chunk`` events ending with
``data: [DONE]``; an error object inside the stream (``data: {"error": ...}``, as servers send
once a stream has started) is converted like an HTTP error. Retries, attempt ids and deltas:
see :mod:`agentstream.models.base`. The key is sent as a Bearer token.
"""

from __future__ import annotations

import logging
from typing import Any

from httpx_sse import ServerSentEvent

from agentstream.context.request import ChatRequest
from agentstream.errors import InvalidModelOutput
from agentstream.models import openai_format, text_calls
from agentstream.models.base import HttpChatModel
from agentstream.models.http import stream_error
from agentstream.ops import metrics
from agentstream.wire.deltas import Delta
from agentstream.wire.events import ModelOutput

log = logging.getLogger("agentstream.models")


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
        output = openai_format.parse_response(payload, max_output_tokens=request.max_output_tokens, **fields)
        return self._calls_in_text(output, request)

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
        try:
            return assembler.feed(chunk), False
        except ValueError as exc:  # a piece that is no reply of this API (a call of another type)
            raise InvalidModelOutput(f"{self.shown_url}: {exc}") from None

    def _stream_output(
        self, assembler: openai_format.StreamAssembler, request: ChatRequest, **fields: Any
    ) -> ModelOutput:
        output = assembler.output(max_output_tokens=request.max_output_tokens, **fields)
        return self._calls_in_text(output, request)

    def _calls_in_text(self, output: ModelOutput, request: ChatRequest) -> ModelOutput:
        """A reply whose whole text is one call of an offered tool: recovered as that call when
        the endpoint says so (``quirks.tool_calls_in_text``), else kept, with a warning and a count
        (see :mod:`agentstream.models.text_calls`)."""
        if output.tool_calls or not request.tools or not output.content.lstrip().startswith(("{", "[", "<", "`")):
            return output
        endpoint = self.endpoint.id
        if self.endpoint.quirks.tool_calls_in_text:
            recovered = text_calls.recover(output, request.tools)
            if recovered is not output:
                metrics.MODEL_TEXT_TOOL_CALLS.labels(endpoint=endpoint, recovered="true").inc()
                log.info("endpoint %s: %s", endpoint, recovered.stop_detail)
                return recovered
        if text_calls.looks_like_text_call(output, request.tools):
            metrics.MODEL_TEXT_TOOL_CALLS.labels(endpoint=endpoint, recovered="false").inc()
            if self.endpoint.quirks.tool_calls_in_text:
                why = "it is not one call with valid arguments, so it was not run and stays the answer"
            else:
                why = (
                    "it stays the answer. Start the server with its tool-call parser, or set "
                    "quirks.tool_calls_in_text: true on the endpoint to run such calls"
                )
            log.warning(
                "endpoint %s: the reply's whole text is tool calls as JSON (the server has no tool-call parser "
                "for this model); %s",
                endpoint,
                why,
            )
        return output
