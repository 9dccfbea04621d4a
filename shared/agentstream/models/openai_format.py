"""The OpenAI chat-completions wire format: a ChatRequest → body bytes, a response → ModelOutput.

Pure (no I/O), so the fingerprint of any stored model call can be recomputed from the trace.
References: https://platform.openai.com/docs/api-reference/chat/create and
https://platform.openai.com/docs/api-reference/chat-streaming (server-sent chunks).

What is kept as data, never repaired (C11, C12, C14 of the field cases):

- tool-call arguments are stored exactly as received (an object a server sent is kept as its
  JSON text) and sent back exactly as stored, never re-parsed;
- streamed tool-call pieces are assembled by call ``id`` first, by ``index`` only where ids are
  absent (see :class:`StreamAssembler`), so the pieces of parallel calls never run together,
  even from a server that numbers every call ``index: 0``;
- ``finish_reason`` ``length``, ``content_filter``, a ``refusal``, and a finish reason this
  module does not know become the stop reasons ``length``, ``content_filter``, ``refusal`` and
  ``unknown``; a reply labelled ``tool_calls`` that used the whole output budget and left
  unparseable arguments is treated as cut off (``length``); a stream that ends without any
  finish reason (``[DONE]`` alone: llama.cpp's server ends a stream it interrupted so) is
  ``interrupted``, never a normal ``stop`` or ``tool_calls`` (the adapters retry it);
- reasoning text (``reasoning_content`` or ``reasoning``) is kept on the output, and sent back
  only where the endpoint's quirks ask for it, and only to the model that wrote it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import msgspec
import msgspec.structs

from agentstream.context.request import AssistantMessage, ChatRequest, Message, ToolResultMessage, UserMessage
from agentstream.models.endpoints import DEFAULT_QUIRKS, Quirks
from agentstream.wire.deltas import Delta
from agentstream.wire.events import Image, ModelOutput, ToolCall, Usage

PROVIDER = "openai"

# finish_reason (OpenAI and compatible servers) → agentstream StopReason
_FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


def _image_url(image: Image) -> str:
    if image.url:
        return image.url
    return f"data:{image.media_type or 'image/png'};base64,{image.data}"


def _user_content(text: str, images: tuple[Image, ...]) -> str | list[dict[str, Any]]:
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.extend({"type": "image_url", "image_url": {"url": _image_url(image)}} for image in images)
    return parts


def message_dicts(
    request: ChatRequest, *, model: str, quirks: Quirks = DEFAULT_QUIRKS, provider: str = PROVIDER
) -> list[dict[str, Any]]:
    """The request's messages in OpenAI shape (the system message first, when there is one).

    Beside tool calls an assistant message carries the content the endpoint's quirks ask for
    (``null`` by default, as the OpenAI API documents; ``""`` for llama.cpp's server). Tool-call arguments
    are sent exactly as stored. Reasoning goes back (in ``quirks.reasoning_field``) on the messages
    the context policy gave it to (``ContextPolicy.reasoning``, the one switch), and only on
    messages of this provider and model; opaque
    replay blocks of other providers are never sent. A tool message carries text only, so the
    images of a run of tool results follow it in one user message (:data:`TOOL_IMAGES_NOTE`).
    """
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for position, message in enumerate(request.messages):
        match message:
            case UserMessage(text=text):
                out.append({"role": "user", "content": _user_content(text, getattr(message, "images", ()))})
            case AssistantMessage():
                entry: dict[str, Any] = {"role": "assistant"}
                if not message.tool_calls:
                    entry["content"] = message.content
                elif message.content:
                    entry["content"] = message.content
                elif quirks.tool_call_content == "empty":
                    entry["content"] = ""
                elif quirks.tool_call_content == "null":
                    entry["content"] = None
                if message.reasoning and message.provider == provider and message.model == model:
                    # the context policy chose which reasoning goes back (ContextPolicy.reasoning)
                    entry[quirks.reasoning_field] = message.reasoning
                if message.tool_calls:
                    entry["tool_calls"] = [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in message.tool_calls
                    ]
                out.append(entry)
            case ToolResultMessage(call_id=call_id, text=text):
                out.append({"role": "tool", "tool_call_id": call_id, "content": text or EMPTY_TOOL_RESULT})
                following = request.messages[position + 1] if position + 1 < len(request.messages) else None
                if not isinstance(following, ToolResultMessage):
                    images = _run_images(request.messages, position)
                    if quirks.tool_results_as_user:
                        restated = _restated_results(request.messages, position, quirks)
                        out.append({"role": "user", "content": _user_content(restated, images)})
                    elif images:
                        out.append({"role": "user", "content": _user_content(TOOL_IMAGES_NOTE, images)})
    return out


EMPTY_TOOL_RESULT = "(the tool returned no output)"
"""The content of a tool message whose result is empty: several OpenAI-compatible servers refuse an
empty tool message (the Anthropic format leaves ``content`` out instead, as its API documents)."""

TOOL_IMAGES_NOTE = "The images that the tool results above returned:"
"""The text of the user message that carries tool results' images (a tool message carries text only)."""


def _run_images(messages: Sequence[Message], last: int) -> tuple[Any, ...]:
    """The images of the run of tool results ending at ``messages[last]``, in order."""
    first = last
    while first > 0 and isinstance(messages[first - 1], ToolResultMessage):
        first -= 1
    return tuple(image for m in messages[first : last + 1] for image in getattr(m, "images", ()))


def _restated_results(messages: Sequence[Message], last: int, quirks: Quirks) -> str:
    """The user message that restates a run of tool results ending at ``messages[last]``."""
    first = last
    while first > 0 and isinstance(messages[first - 1], ToolResultMessage):
        first -= 1
    lines = [
        f"Result of {m.name}: {m.text or EMPTY_TOOL_RESULT}"
        for m in messages[first : last + 1]
        if isinstance(m, ToolResultMessage)
    ]
    return "\n".join([*lines, quirks.tool_results_note])


def tool_choice_value(request: ChatRequest, quirks: Quirks = DEFAULT_QUIRKS) -> str | dict[str, Any] | None:
    """The ``tool_choice`` sent for the request (None when no tools are offered).

    ``required`` is sent as the quirks say: as is, as the one offered tool by name, or as ``auto``.
    """
    if not request.tools:
        return None
    choice = request.tool_choice
    if choice == "required":
        if quirks.required_tool_choice == "auto":
            return "auto"
        if quirks.required_tool_choice == "named":
            if len(request.tools) == 1:
                return {"type": "function", "function": {"name": request.tools[0].name}}
            return "auto"
    return choice


def streams(request: ChatRequest, *, stream: bool, quirks: Quirks = DEFAULT_QUIRKS) -> bool:
    """Whether this request is sent streamed, on an endpoint whose ``stream`` setting is ``stream``."""
    if not stream:
        return False
    if not request.tools or quirks.stream_tools == "always":
        return True
    if quirks.stream_tools == "forced":
        return isinstance(tool_choice_value(request, quirks), dict)
    return False


def request_body(
    request: ChatRequest,
    *,
    model: str,
    quirks: Quirks = DEFAULT_QUIRKS,
    stream: bool = False,
    extra_body: dict[str, Any] | None = None,
    seed: int | None = None,
    response_format: dict[str, Any] | None = None,
) -> bytes:
    """A ChatRequest → the exact JSON body bytes sent to ``/chat/completions``.

    The body is ``extra_body``'s fields, then the model, messages, temperature and output
    limit, then tools and tool choice (only when tools are offered), ``seed`` and
    ``response_format`` when given, and ``stream`` (with ``stream_options`` when the quirks ask
    for usage) when ``stream`` is true (see :func:`streams`).
    """
    body: dict[str, Any] = dict(extra_body or {})
    body["model"] = model
    body["messages"] = message_dicts(request, model=model, quirks=quirks)
    body["temperature"] = request.temperature
    body[quirks.max_tokens_field] = request.max_output_tokens
    choice = tool_choice_value(request, quirks)
    if choice is not None:
        body["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools
        ]
        body["tool_choice"] = choice
    if seed is not None:
        body["seed"] = seed
    if response_format is not None:
        body["response_format"] = response_format
    if stream:
        body["stream"] = True
        if quirks.stream_usage:
            body["stream_options"] = {"include_usage": True}
    return msgspec.json.encode(body)


def fingerprint(body: bytes) -> str:
    """Hex sha256 of a request body: the fingerprint recorded in the ModelOutput."""
    return hashlib.sha256(body).hexdigest()


def _parses(arguments: str) -> bool:
    if not arguments.strip():
        return True
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


def _arguments_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def build_output(
    *,
    content: str,
    reasoning: str | None,
    calls: list[tuple[str | None, str, str]],
    finish: str | None,
    refusal: str | None,
    usage: dict[str, Any],
    turn_id: str,
    step: int,
    model: str,
    request_sha256: str,
    latency_ms: float,
    max_output_tokens: int | None = None,
    endpoint: str = "",
    attempt_id: str = "",
) -> ModelOutput:
    """The ModelOutput of a reply's parts (used for whole responses and assembled streams).

    Args:
        calls: ``(id or None, name, raw arguments)`` per tool call, in order.
        finish: the server's ``finish_reason`` (None when it sent none).
        max_output_tokens: the output limit the request sent; with it, a ``tool_calls`` reply
            that used the whole budget and left unparseable arguments is treated as cut off.
    """
    tool_calls = tuple(
        ToolCall(id=str(call_id or f"call_{turn_id}_{step}_{index}"), name=name, arguments=arguments)
        for index, (call_id, name, arguments) in enumerate(calls)
    )
    if finish:
        stop_reason = _FINISH_REASONS.get(finish, "unknown")
        stop_detail = None if finish in _FINISH_REASONS else str(finish)
    else:
        stop_reason, stop_detail = ("tool_calls" if tool_calls else "stop"), None
    if refusal:
        stop_reason, stop_detail = "refusal", refusal
    if tool_calls and stop_reason == "stop":
        stop_reason = "tool_calls"
    completion_tokens = usage.get("completion_tokens")
    if (
        stop_reason == "tool_calls"
        and max_output_tokens
        and isinstance(completion_tokens, int)
        and completion_tokens >= max_output_tokens
        and not all(_parses(c.arguments) for c in tool_calls)
    ):
        stop_reason = "length"
        stop_detail = (
            f"finish_reason {finish or 'none'}, but the reply used the whole output budget "
            f"({completion_tokens} tokens) and left unparseable tool-call arguments"
        )
    return ModelOutput(
        turn_id=turn_id,
        step=step,
        content=content,
        reasoning=reasoning or None,
        tool_calls=tool_calls,
        provider=PROVIDER,
        model=model,
        stop_reason=stop_reason,
        stop_detail=stop_detail,
        usage=Usage(
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=completion_tokens,
            total_tokens=usage.get("total_tokens"),
        ),
        request_sha256=request_sha256,
        latency_ms=latency_ms,
        attempt_id=attempt_id,
        endpoint=endpoint,
    )


def _refuse_other_call_types(raw: Any) -> None:
    """Refuse a tool call of a type other than ``function`` (a ``custom`` tool call, say).

    agentstream offers function tools only, so such a call answers a tool it never offered and
    has no name or JSON arguments to run; it is refused with the reason (the peer frameworks
    refuse it too), not run under an empty name.

    Raises:
        ValueError: ``raw`` is a call of another type.
    """
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "function"):
        name = (raw.get(str(kind)) or {}).get("name") if isinstance(raw.get(str(kind)), dict) else None
        raise ValueError(
            f"the reply holds a tool call of type {kind!r}"
            + (f" (tool {name!r})" if name else "")
            + ", but only function tools were offered; a call of another type cannot be run"
        )


def _audio_transcript(message: dict[str, Any]) -> str | None:
    audio = message.get("audio")
    transcript = audio.get("transcript") if isinstance(audio, dict) else None
    return transcript if isinstance(transcript, str) else None


AUDIO_NOTE = "the reply came as audio; its text is the audio's transcript"
"""The ``stop_detail`` of an output whose text is the transcript of an audio reply."""


def parse_response(
    payload: dict[str, Any],
    *,
    turn_id: str,
    step: int,
    request_sha256: str,
    latency_ms: float,
    model: str,
    max_output_tokens: int | None = None,
    endpoint: str = "",
    attempt_id: str = "",
) -> ModelOutput:
    """A chat-completions response object → a ModelOutput.

    ``model`` is the model name the request asked for; it is what the output records (an alias
    the server resolved stays the alias, so "same model" checks for replay stay stable). Tool
    calls without an id get ``call_<turn>_<step>_<index>``. See :func:`build_output`.

    Raises:
        ValueError: the payload has no choices or no message.
    """
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        raise ValueError("the response has no choices[0].message")
    choice = choices[0]
    message = choice["message"]
    calls = []
    for raw in message.get("tool_calls") or []:
        _refuse_other_call_types(raw)
        function = raw.get("function") or {}
        calls.append((raw.get("id"), str(function.get("name") or ""), _arguments_text(function.get("arguments"))))
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    content = message.get("content")
    transcript = _audio_transcript(message) if not (isinstance(content, str) and content) else None
    output = build_output(
        content=content if isinstance(content, str) and content else (transcript or ""),
        reasoning=reasoning if isinstance(reasoning, str) else None,
        calls=calls,
        finish=choice.get("finish_reason"),
        refusal=str(message["refusal"]) if message.get("refusal") else None,
        usage=payload.get("usage") or {},
        turn_id=turn_id,
        step=step,
        model=model,
        request_sha256=request_sha256,
        latency_ms=latency_ms,
        max_output_tokens=max_output_tokens,
        endpoint=endpoint,
        attempt_id=attempt_id,
    )
    if transcript is not None and output.stop_detail is None:
        output = msgspec.structs.replace(output, stop_detail=AUDIO_NOTE)
    return output


class _StreamedCall:
    __slots__ = ("call_id", "index", "name", "arguments")

    def __init__(self, index: int | None) -> None:
        self.call_id: str | None = None
        self.index = index
        self.name = ""
        self.arguments: list[str] = []

    def complete(self) -> bool:
        """Whether the arguments so far are one whole JSON value (a next name starts a new call)."""
        text = "".join(self.arguments)
        return bool(text.strip()) and _parses(text)


def _piece_name(raw: dict[str, Any]) -> str:
    function = raw.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def _piece_has_arguments(raw: dict[str, Any]) -> bool:
    function = raw.get("function")
    piece = function.get("arguments") if isinstance(function, dict) else None
    return isinstance(piece, (dict, list)) or (isinstance(piece, str) and bool(piece))


class StreamAssembler:
    """Folds streamed ``chat.completion.chunk`` objects into one reply (pure).

    Feed each chunk's JSON object to :meth:`feed`, which returns the pieces to publish as
    deltas; call :meth:`mark_done` on ``data: [DONE]``; then :meth:`output`.

    Tool-call pieces are assembled by call id first, by ``index`` only where ids are absent:

    - a piece with an id seen before continues that call (llama.cpp repeats id and name in
      every piece); a new id starts a new call, even under an index already used (Ollama
      numbers every streamed call ``index: 0``), unless the call at that index has no id yet
      and no whole arguments (a server that sends the id late);
    - a piece without an id continues the last call under its ``index`` (the last call when it
      has no index), unless it names a tool after that call's arguments are whole JSON: then
      it starts a new call (a name merely repeated with no arguments is kept once).

    Each call is published (its delta ``index``) and returned in the order it started.
    """

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._refusal: list[str] = []
        self._transcript: list[str] = []
        self._calls: list[_StreamedCall] = []
        self.finish_reason: str | None = None
        self.saw_finish = False
        self.saw_done = False
        self.usage: dict[str, Any] = {}

    @property
    def finished(self) -> bool:
        """Whether the server said the reply is complete: a finish reason.

        ``[DONE]`` alone is not enough: llama.cpp's server (``interrupt_requests``) ends a stream
        it cut off for another request with ``[DONE]`` and no finish reason. Such a stream is
        ``interrupted`` (see :meth:`output`), never a normal ``stop``.
        """
        return self.saw_finish

    def mark_done(self) -> None:
        """The server sent ``data: [DONE]``."""
        self.saw_done = True

    def _new_call(self, index: int | None) -> tuple[int, _StreamedCall]:
        self._calls.append(_StreamedCall(index))
        return len(self._calls) - 1, self._calls[-1]

    def _last_at(self, index: int | None) -> tuple[int, _StreamedCall] | None:
        """The last call under ``index`` (the last call of all when ``index`` is None)."""
        for position in range(len(self._calls) - 1, -1, -1):
            if index is None or self._calls[position].index == index:
                return position, self._calls[position]
        return None

    def _call_for(self, raw: dict[str, Any]) -> tuple[int, _StreamedCall]:
        index = raw.get("index") if isinstance(raw.get("index"), int) else None
        call_id = str(raw.get("id") or "")
        if call_id:
            for position, call in enumerate(self._calls):
                if call.call_id == call_id:
                    return position, call
            last = self._last_at(index)
            if last is not None and last[1].call_id is None and not last[1].complete():
                return last
            return self._new_call(index)
        last = self._last_at(index)
        if last is None:
            return self._new_call(index)
        name = _piece_name(raw)
        if name and last[1].name and last[1].complete() and (name != last[1].name or _piece_has_arguments(raw)):
            return self._new_call(index)
        return last

    @staticmethod
    def _argument_piece(call: _StreamedCall, piece: str) -> str:
        """Add a text piece of a call's arguments → what it adds (``""``: nothing new).

        Pieces are deltas; two other forms servers send are read too: the whole arguments sent
        again once they are complete (kept once), and cumulative pieces, each the arguments so
        far plus more (the arguments become the piece; what it adds is the new end).
        """
        so_far = "".join(call.arguments)
        if so_far and piece == so_far and call.complete():
            return ""
        if len(so_far) > 1 and len(piece) > len(so_far) and piece.startswith(so_far):
            call.arguments = [piece]
            return piece[len(so_far) :]
        call.arguments.append(piece)
        return piece

    def _call_piece(self, raw: dict[str, Any]) -> Delta | None:
        """One streamed tool-call piece → the delta that publishes what it adds (None: nothing)."""
        _refuse_other_call_types(raw)
        index, call = self._call_for(raw)
        new_id = ""
        if raw.get("id") and call.call_id is None:
            call.call_id = new_id = str(raw["id"])
        function = raw.get("function") or {}
        new_name = ""
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = new_name = name
        piece = function.get("arguments")
        if isinstance(piece, (dict, list)):  # a whole object instead of text pieces
            call.arguments = [_arguments_text(piece)]
            piece = call.arguments[0]
        elif isinstance(piece, str) and piece:
            piece = self._argument_piece(call, piece)
        else:
            piece = ""
        if not (new_id or new_name or piece):
            return None
        return Delta(kind="tool_call", index=index, call_id=new_id, name=new_name, text=piece)

    def feed(self, chunk: dict[str, Any]) -> list[Delta]:
        """One chunk → the pieces it adds (text, reasoning, tool-call pieces)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        out: list[Delta] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                self._content.append(text)
                out.append(Delta(kind="text", text=text))
            transcript = _audio_transcript(delta)
            if transcript:  # an audio reply: its transcript is the text (AUDIO_NOTE)
                self._transcript.append(transcript)
                out.append(Delta(kind="text", text=transcript))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._reasoning.append(reasoning)
                out.append(Delta(kind="reasoning", text=reasoning))
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                self._refusal.append(refusal)
            raw_calls = delta.get("tool_calls")
            if not raw_calls and isinstance(delta.get("function_call"), dict):
                raw_calls = [{"index": 0, "function": delta["function_call"]}]  # the legacy form
            for raw in raw_calls or []:
                piece = self._call_piece(raw) if isinstance(raw, dict) else None
                if piece is not None:
                    out.append(piece)
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = str(finish)
                self.saw_finish = True
        return out

    def output(
        self,
        *,
        turn_id: str,
        step: int,
        model: str,
        request_sha256: str,
        latency_ms: float,
        max_output_tokens: int | None = None,
        endpoint: str = "",
        attempt_id: str = "",
    ) -> ModelOutput:
        """The assembled reply as a ModelOutput (see :func:`build_output`).

        A stream that ended without a finish reason (``[DONE]`` alone, or cut) is stopped
        ``interrupted``, whatever it holds: it is never taken as a complete answer (C14).
        """
        calls = [(c.call_id, c.name, "".join(c.arguments)) for c in self._calls]
        transcript = "".join(self._transcript) if not self._content else ""
        output = build_output(
            content="".join(self._content) or transcript,
            reasoning="".join(self._reasoning) or None,
            calls=calls,
            finish=self.finish_reason,
            refusal="".join(self._refusal) or None,
            usage=self.usage,
            turn_id=turn_id,
            step=step,
            model=model,
            request_sha256=request_sha256,
            latency_ms=latency_ms,
            max_output_tokens=max_output_tokens,
            endpoint=endpoint,
            attempt_id=attempt_id,
        )
        if transcript and output.stop_detail is None:
            output = msgspec.structs.replace(output, stop_detail=AUDIO_NOTE)
        if not self.saw_finish:
            detail = (
                "the stream ended with [DONE] but no finish reason "
                "(the server cut the reply off, e.g. for another request)"
                if self.saw_done
                else "the stream ended without a finish reason"
            )
            output = msgspec.structs.replace(output, stop_reason="interrupted", stop_detail=detail)
        return output
