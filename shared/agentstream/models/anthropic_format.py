"""The Anthropic Messages wire format: a ChatRequest → body bytes, a response → ModelOutput.

Pure (no I/O), so replay rebuilds the exact body of any stored call. Reference:
https://docs.anthropic.com/en/api/messages (request and response shapes),
https://docs.anthropic.com/en/api/messages-streaming (server-sent events) and
https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking (thinking blocks).

The rendering rules:

- the system prompt goes in the top-level ``system`` field, never in ``messages``;
- an assistant message is its replayable thinking blocks, then its text, then one
  ``tool_use`` block per call; the results of one assistant message's calls are
  ``tool_result`` blocks in the next user message, in call order and before any text (a user
  message that follows them joins that same message: the API wants roles to alternate);
- thinking and redacted_thinking blocks are opaque :attr:`ModelOutput.replay_blocks`, sent
  back exactly as stored (same text, signature, order and message), and only to the same
  provider and model. A thinking block whose signature is empty or missing (a stream cut
  mid-thinking) or a redacted block without data is never sent; reasoning text of another
  provider never becomes a thinking block or visible text;
- an assistant message that would be empty is left out (the API refuses empty content);
- extended thinking is turned off for a call whose last assistant message, continued with its
  tool results, has no replayable thinking of this model (the API would refuse it), and for a
  call that forces a tool (the API does not allow both); thinking blocks are sent only when
  thinking is on;
- tool-call arguments are stored as text; ``tool_use.input`` must be an object, so stored text
  is parsed for this format only: empty text is ``{}``, and text that is not a JSON object is
  sent as ``{"invalid_arguments": "<the text>"}`` (its tool result already says what was wrong).
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from agentstream.context.request import AssistantMessage, ChatRequest, ToolResultMessage, UserMessage
from agentstream.wire.deltas import Delta
from agentstream.wire.events import ModelOutput, ToolCall, Usage
from agentstream.wire.jsontext import unicode_problem

PROVIDER = "anthropic"

# stop_reason (Messages API) → agentstream StopReason
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "pause_turn": "pause",
    "refusal": "refusal",
}

_TOOL_CHOICES = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}

_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def tool_use_id(call_id: str) -> str:
    """A call id as the Messages API accepts it (``^[a-zA-Z0-9_-]+$``); others' ids are mapped."""
    safe = _ID_UNSAFE.sub("_", call_id)
    return safe or "call"


def replayable(block: Any) -> bool:
    """Whether an opaque block may be sent back: a thinking block with a non-empty signature, or
    a redacted_thinking block with data. An interrupted block (empty or missing signature) is not."""
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind == "thinking":
        signature = block.get("signature")
        return isinstance(signature, str) and bool(signature.strip()) and isinstance(block.get("thinking"), str)
    if kind == "redacted_thinking":
        data = block.get("data")
        return isinstance(data, str) and bool(data)
    return False


def _same_model(message: AssistantMessage, model: str) -> bool:
    return message.provider == PROVIDER and message.model == model


def _thinking_blocks(message: AssistantMessage, model: str) -> list[dict[str, Any]]:
    if not _same_model(message, model):
        return []
    return [block for block in message.replay_blocks if replayable(block)]


def _input(arguments: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    if (
        unicode_problem(arguments) is not None
    ):  # a lone surrogate escape: json.loads makes what no request body can encode
        return {"invalid_arguments": arguments}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"invalid_arguments": arguments}
    return value if isinstance(value, dict) else {"invalid_arguments": arguments}


def _image_block(image: Any) -> dict[str, Any]:
    if image.url:
        return {"type": "image", "source": {"type": "url", "url": image.url}}
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": image.media_type or "image/png", "data": image.data},
    }


def _continued_assistant(request: ChatRequest) -> AssistantMessage | None:
    """The last assistant message when the request continues it with its tool results."""
    for message in reversed(request.messages):
        if isinstance(message, ToolResultMessage):
            continue
        if isinstance(message, AssistantMessage) and message.tool_calls:
            return message
        return None
    return None


def thinking_on(request: ChatRequest, *, model: str, budget_tokens: int | None, replay_thinking: bool = True) -> bool:
    """Whether extended thinking is enabled for this call (see the module docstring)."""
    if budget_tokens is None or (request.tool_choice == "required" and request.tools):
        return False
    continued = _continued_assistant(request)
    if continued is not None and not (replay_thinking and _thinking_blocks(continued, model)):
        return False
    return True


def message_list(request: ChatRequest, *, model: str, replay_thinking: bool = True) -> list[dict[str, Any]]:
    """The request's messages in Messages API shape (see the module docstring for the rules)."""
    out: list[dict[str, Any]] = []
    user_blocks: list[dict[str, Any]] = []

    def flush_user() -> None:
        if user_blocks:
            out.append({"role": "user", "content": list(user_blocks)})
            user_blocks.clear()

    for message in request.messages:
        match message:
            case UserMessage(text=text):
                if text:
                    user_blocks.append({"type": "text", "text": text})
                user_blocks.extend(_image_block(image) for image in getattr(message, "images", ()))
            case ToolResultMessage(call_id=call_id, text=text, is_error=is_error):
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id(call_id)}
                images = getattr(message, "images", ())
                if images:
                    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
                    parts.extend(_image_block(image) for image in images)
                    block["content"] = parts
                elif text:
                    block["content"] = text
                if is_error:
                    block["is_error"] = True
                user_blocks.append(block)
            case AssistantMessage():
                blocks: list[dict[str, Any]] = list(_thinking_blocks(message, model)) if replay_thinking else []
                if message.content.strip():
                    blocks.append({"type": "text", "text": message.content})
                for call in message.tool_calls:
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": tool_use_id(call.id),
                            "name": call.name,
                            "input": _input(call.arguments),
                        }
                    )
                if not blocks:
                    continue  # never an empty assistant message; what follows joins the user message
                flush_user()
                out.append({"role": "assistant", "content": blocks})
    flush_user()
    return out


def request_body(
    request: ChatRequest,
    *,
    model: str,
    thinking_budget_tokens: int | None = None,
    stream: bool = False,
    extra_body: dict[str, Any] | None = None,
    replay_thinking: bool = True,
) -> bytes:
    """A ChatRequest → the exact JSON body bytes sent to ``/v1/messages``.

    The body is ``extra_body``'s fields, then ``model``, ``max_tokens`` (the request's output
    limit, plus the thinking budget when thinking is on), ``system`` (when not empty),
    ``messages``, ``tools`` and ``tool_choice`` (only when tools are offered), ``temperature``
    (not with thinking: the API allows only its default then), ``thinking`` and ``stream``.

    Args:
        replay_thinking: False sends no thinking block at all (the fallback after the API
            refused a signature, C06); thinking is then off for a call that continues a tool turn.
    """
    on = thinking_on(request, model=model, budget_tokens=thinking_budget_tokens, replay_thinking=replay_thinking)
    body: dict[str, Any] = dict(extra_body or {})
    body["model"] = model
    body["max_tokens"] = request.max_output_tokens + ((thinking_budget_tokens or 0) if on else 0)
    if request.system:
        body["system"] = request.system
    body["messages"] = message_list(request, model=model, replay_thinking=replay_thinking and on)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
        ]
        body["tool_choice"] = _TOOL_CHOICES.get(request.tool_choice, {"type": "auto"})
    if on:
        body["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget_tokens}
    else:
        body["temperature"] = request.temperature
    if stream:
        body["stream"] = True
    return msgspec.json.encode(body)


def _usage(usage: dict[str, Any]) -> Usage:
    prompt = usage.get("input_tokens")
    if isinstance(prompt, int):
        prompt += int(usage.get("cache_creation_input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0)
    completion = usage.get("output_tokens")
    total = prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def build_output(
    blocks: list[dict[str, Any]],
    *,
    stop_reason: str | None,
    usage: dict[str, Any],
    turn_id: str,
    step: int,
    model: str,
    request_sha256: str,
    latency_ms: float,
    endpoint: str = "",
    attempt_id: str = "",
) -> ModelOutput:
    """The ModelOutput of a reply's content blocks.

    Text blocks make the content; thinking blocks give the reasoning text and, with
    redacted_thinking blocks, the opaque replay blocks (exactly as received, in order);
    tool_use blocks become tool calls whose arguments are the input's JSON text.
    """
    texts: list[str] = []
    thoughts: list[str] = []
    replay: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind in ("thinking", "redacted_thinking"):
            replay.append(block)
            if kind == "thinking" and block.get("thinking"):
                thoughts.append(str(block["thinking"]))
        elif kind == "tool_use":
            raw = block.get("input")
            if isinstance(raw, str):
                arguments = raw
            else:
                try:
                    arguments = msgspec.json.encode(raw if raw is not None else {}).decode()
                except (UnicodeEncodeError, msgspec.EncodeError):  # a lone surrogate: kept escaped, refused by the tool
                    arguments = json.dumps(raw, ensure_ascii=True)
            calls.append(
                ToolCall(
                    id=str(block.get("id") or f"toolu_{turn_id}_{step}_{len(calls)}"),
                    name=str(block.get("name") or ""),
                    arguments=arguments,
                )
            )
    content = "".join(texts)
    mapped = _STOP_REASONS.get(stop_reason or "", "unknown") if stop_reason else ("tool_calls" if calls else "stop")
    detail: str | None = None
    if stop_reason and (stop_reason not in _STOP_REASONS or stop_reason == "model_context_window_exceeded"):
        detail = stop_reason
    if mapped == "refusal":
        detail = content or None
    return ModelOutput(
        turn_id=turn_id,
        step=step,
        content=content,
        reasoning="\n".join(thoughts) or None,
        tool_calls=tuple(calls),
        provider=PROVIDER,
        model=model,
        replay_blocks=tuple(replay),
        stop_reason=mapped,
        stop_detail=detail,
        usage=_usage(usage),
        request_sha256=request_sha256,
        latency_ms=latency_ms,
        attempt_id=attempt_id,
        endpoint=endpoint,
    )


def parse_response(
    payload: dict[str, Any],
    *,
    turn_id: str,
    step: int,
    request_sha256: str,
    latency_ms: float,
    model: str,
    endpoint: str = "",
    attempt_id: str = "",
) -> ModelOutput:
    """A Messages API response (``"type": "message"``) → a ModelOutput (see :func:`build_output`).

    Raises:
        ValueError: the payload is not a message object.
    """
    if payload.get("type") != "message" or not isinstance(payload.get("content"), list):
        raise ValueError("the response is not a Messages API message (no type 'message' with a content list)")
    blocks = [b for b in payload["content"] if isinstance(b, dict)]
    return build_output(
        blocks,
        stop_reason=payload.get("stop_reason"),
        usage=payload.get("usage") or {},
        turn_id=turn_id,
        step=step,
        model=model,
        request_sha256=request_sha256,
        latency_ms=latency_ms,
        endpoint=endpoint,
        attempt_id=attempt_id,
    )


class StreamAssembler:
    """Folds Messages API stream events into one reply (pure).

    Feed each event's JSON object to :meth:`feed` (``message_start``, ``content_block_start``,
    ``content_block_delta`` with ``text_delta``, ``thinking_delta``, ``signature_delta`` or
    ``input_json_delta``, ``content_block_stop``, ``message_delta``, ``message_stop``, ``ping``;
    unknown events are ignored as the API's versioning policy asks). The reply is complete only
    after ``message_stop``; a block's signature is whatever its ``signature_delta`` events
    carried, so a stream cut mid-thinking leaves it empty (and such a block is never replayed).
    """

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._tool_index: dict[int, int] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.finished = False

    def feed(self, event: dict[str, Any]) -> list[Delta]:
        """One event → the pieces it adds (text, reasoning, tool-call pieces)."""
        kind = event.get("type")
        out: list[Delta] = []
        if kind == "message_start":
            message = event.get("message") or {}
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            index = int(event.get("index", len(self._blocks)))
            block = dict(event.get("content_block") or {})
            self._blocks[index] = block
            if block.get("type") == "tool_use":
                position = self._tool_index[index] = len(self._tool_index)
                self._json[index] = []
                out.append(
                    Delta(
                        kind="tool_call",
                        index=position,
                        call_id=str(block.get("id") or ""),
                        name=str(block.get("name") or ""),
                    )
                )
            elif block.get("type") == "text" and block.get("text"):
                out.append(Delta(kind="text", text=str(block["text"])))
        elif kind == "content_block_delta":
            index = int(event.get("index", 0))
            block = self._blocks.setdefault(index, {"type": "text", "text": ""})
            delta = event.get("delta") or {}
            match delta.get("type"):
                case "text_delta":
                    piece = str(delta.get("text") or "")
                    block["text"] = str(block.get("text") or "") + piece
                    out.append(Delta(kind="text", text=piece))
                case "thinking_delta":
                    piece = str(delta.get("thinking") or "")
                    block["thinking"] = str(block.get("thinking") or "") + piece
                    out.append(Delta(kind="reasoning", text=piece))
                case "signature_delta":
                    block["signature"] = str(block.get("signature") or "") + str(delta.get("signature") or "")
                case "input_json_delta":
                    piece = str(delta.get("partial_json") or "")
                    self._json.setdefault(index, []).append(piece)
                    out.append(Delta(kind="tool_call", index=self._tool_index.get(index, 0), text=piece))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = str(delta["stop_reason"])
            self.usage.update(event.get("usage") or {})
        elif kind == "message_stop":
            self.finished = True
        return out

    def blocks(self) -> list[dict[str, Any]]:
        """The content blocks so far, in index order (tool inputs parsed when their JSON parses)."""
        out = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use" and self._json.get(index):
                text = "".join(self._json[index])
                try:
                    if (
                        unicode_problem(text) is not None
                    ):  # a lone surrogate escape: kept as written, refused by the tool
                        raise ValueError(text)
                    block = {**block, "input": json.loads(text)}
                except ValueError:
                    block = {**block, "input": text}  # kept as the raw text (malformed is data)
            out.append(block)
        return out

    def output(
        self,
        *,
        turn_id: str,
        step: int,
        model: str,
        request_sha256: str,
        latency_ms: float,
        endpoint: str = "",
        attempt_id: str = "",
    ) -> ModelOutput:
        """The assembled reply as a ModelOutput (see :func:`build_output`)."""
        return build_output(
            self.blocks(),
            stop_reason=self.stop_reason,
            usage=self.usage,
            turn_id=turn_id,
            step=step,
            model=model,
            request_sha256=request_sha256,
            latency_ms=latency_ms,
            endpoint=endpoint,
            attempt_id=attempt_id,
        )
