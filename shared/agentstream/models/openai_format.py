"""The OpenAI chat-completions wire format: a ChatRequest → body bytes, a response → ModelOutput.

Pure (no I/O), so the fingerprint of any stored model call can be recomputed from the trace.
Reference: https://platform.openai.com/docs/api-reference/chat/create
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from agentstream.context.request import AssistantMessage, ChatRequest, ToolResultMessage, UserMessage
from agentstream.events import ModelOutput, ToolCall, Usage

PROVIDER = "openai"

# finish_reason (OpenAI and compatible servers) → agentstream StopReason
_FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


def message_dicts(request: ChatRequest, *, provider: str, model: str) -> list[dict[str, Any]]:
    """The request's messages in OpenAI shape (system first).

    An assistant message always carries a ``content`` string (``""`` beside tool calls: some
    servers, llama.cpp among them, answer 500 to a null content). Tool-call arguments are sent
    exactly as stored, never re-parsed. Reasoning is not sent back on this format.
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
    for message in request.messages:
        match message:
            case UserMessage(text=text):
                out.append({"role": "user", "content": text})
            case AssistantMessage():
                entry: dict[str, Any] = {"role": "assistant", "content": message.content}
                if message.tool_calls:
                    entry["tool_calls"] = [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in message.tool_calls
                    ]
                out.append(entry)
            case ToolResultMessage(call_id=call_id, text=text):
                out.append({"role": "tool", "tool_call_id": call_id, "content": text})
    return out


def request_body(request: ChatRequest, *, model: str) -> bytes:
    """A ChatRequest → the exact JSON body bytes sent to ``/chat/completions``.

    ``tool_choice`` ``required`` is sent as OpenAI's ``"required"``; when no tools are offered
    neither ``tools`` nor ``tool_choice`` is sent.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": message_dicts(request, provider=PROVIDER, model=model),
        "temperature": request.temperature,
        "max_tokens": request.max_output_tokens,
    }
    if request.tools:
        body["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools
        ]
        body["tool_choice"] = request.tool_choice
    return msgspec.json.encode(body)


def fingerprint(body: bytes) -> str:
    """Hex sha256 of a request body: the fingerprint recorded in the ModelOutput."""
    return hashlib.sha256(body).hexdigest()


def parse_response(
    payload: dict[str, Any], *, turn_id: str, step: int, request_sha256: str, latency_ms: float, model: str
) -> ModelOutput:
    """A chat-completions response object → a ModelOutput.

    Tool calls without an id get ``call_<turn>_<step>_<index>``; arguments that a server sent as
    an object are kept as its JSON text; a refusal ends with stop reason ``refusal`` and its
    text in ``stop_detail``; an unknown finish reason becomes ``unknown``.

    Raises:
        ValueError: the payload has no choices or no message.
    """
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        raise ValueError("the response has no choices[0].message")
    choice = choices[0]
    message = choice["message"]
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") or {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = msgspec.json.encode(arguments).decode()
        calls.append(
            ToolCall(
                id=str(raw.get("id") or f"call_{turn_id}_{step}_{index}"),
                name=str(function.get("name") or ""),
                arguments=arguments,
            )
        )
    finish = choice.get("finish_reason")
    stop_reason = _FINISH_REASONS.get(finish or "", "unknown") if finish else ("tool_calls" if calls else "stop")
    stop_detail = None if finish in _FINISH_REASONS or finish is None else str(finish)
    refusal = message.get("refusal")
    if refusal:
        stop_reason, stop_detail = "refusal", str(refusal)
    if calls and stop_reason == "stop":
        stop_reason = "tool_calls"
    usage = payload.get("usage") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return ModelOutput(
        turn_id=turn_id,
        step=step,
        content=message.get("content") or "",
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        tool_calls=tuple(calls),
        provider=PROVIDER,
        model=str(payload.get("model") or model),
        stop_reason=stop_reason,
        stop_detail=stop_detail,
        usage=Usage(
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            total_tokens=usage.get("total_tokens"),
        ),
        request_sha256=request_sha256,
        latency_ms=latency_ms,
    )
