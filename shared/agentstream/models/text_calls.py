"""A tool call the server left as JSON text in the reply's ``content`` (pure).

A server without a tool-call parser for the model passes the model's call through as text, with
no ``tool_calls`` and finish reason ``stop``: vLLM started without ``--enable-auto-tool-choice``
and ``--tool-call-parser``, llama.cpp's server without ``--jinja`` (or with a chat template that
has no tool format), Ollama and LM Studio with a model whose template has no tool section, and a
LiteLLM proxy in front of any of these. The user would get the raw JSON as the answer.

The endpoint setting ``quirks.tool_calls_in_text: true`` makes the OpenAI-compatible adapter
recover such a reply, and only a reply whose whole text (inside one ``` fence or one
``<tool_call>`` tag, as Hermes-style templates write it, at most) is one call of a tool the
request offered, with arguments that validate against that tool's schema. The recovered output
has the call, no text, stop reason ``tool_calls`` and a ``stop_detail`` saying it was recovered
from text (:data:`RECOVERED`), so the trace records it. Without the setting such a reply stays a
text answer, and the adapter logs a warning and counts it in
``agentstream_model_text_tool_calls_total{recovered="false"}`` so an operator sees the server
needs the setting (or its parser).

The shapes read (the ones the servers' templates write)::

    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    {"name": "get_weather", "parameters": {"city": "Oslo"}}
    {"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}}
    {"tool_calls": [{...one of the above...}]}
    [{...one of the above...}]
    <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>
    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]          (Mistral's marker)
    <|python_tag|>{"type": "function", "name": "get_weather", "parameters": {...}}  (Llama 3.1's)

A text of several calls, or of one whose arguments do not validate, is never run; it is counted
and logged as above, with the setting on or off.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import msgspec
import msgspec.structs

from agentstream.context.request import ToolDefinition
from agentstream.wire.events import ModelOutput, ToolCall

RECOVERED = "tool call recovered from the reply's text (quirks.tool_calls_in_text)"
"""The start of the ``stop_detail`` of an output whose call was recovered from its text."""

_FENCE = re.compile(r"\A```[a-zA-Z0-9_-]*\s*\n(.*)\n\s*```\Z", re.S)
_TAG = re.compile(r"\A<tool_call>\s*(.*?)\s*</tool_call>\Z", re.S)
_PREFIXES = ("[TOOL_CALLS]", "<|python_tag|>")  # Mistral's and Llama 3.1's call markers, left as text


def _unwrapped(text: str) -> str:
    text = text.strip()
    for pattern in (_FENCE, _TAG):
        match = pattern.match(text)
        if match:
            text = match.group(1).strip()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :].strip()
    return text


def _calls(value: Any) -> list[tuple[str, Any]] | None:
    """``[(name, arguments), ...]`` of a value that is nothing but calls in known shapes, else None."""
    if isinstance(value, list):
        found = [_calls(item) for item in value]
        if not value or any(f is None or len(f) != 1 for f in found):
            return None
        return [f[0] for f in found if f]
    if not isinstance(value, dict):
        return None
    if set(value) == {"tool_calls"}:
        return _calls(value["tool_calls"])
    if isinstance(value.get("function"), dict) and set(value) <= {"type", "function", "id"}:
        return _calls(value["function"])
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    keys = set(value) - {"name", "type", "id"}  # Llama's {"type": "function", "name", "parameters"}
    if keys in ({"arguments"}, {"parameters"}, set()):
        return [(name, value.get("arguments", value.get("parameters", {})))]
    return None


def _written_calls(content: str) -> list[tuple[str, Any]] | None:
    """The calls a reply's whole text is (JSON, possibly fenced, tagged or marked), or None."""
    text = _unwrapped(content)
    if not text or text[0] not in "{[":
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return _calls(value)


def _valid_arguments(arguments: Any, tool: ToolDefinition) -> dict[str, Any] | None:
    if isinstance(arguments, str):  # the OpenAI shape: arguments as JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    try:
        jsonschema.validate(arguments, tool.parameters or {"type": "object"})
    except (jsonschema.ValidationError, jsonschema.SchemaError, RecursionError):
        return None
    return arguments


def text_call(content: str, tools: tuple[ToolDefinition, ...]) -> tuple[str, str] | None:
    """``(tool name, arguments as JSON text)`` when ``content`` is wholly one call of an offered
    tool whose arguments validate against its schema; None otherwise (never raises)."""
    calls = _written_calls(content)
    if calls is None or len(calls) != 1:
        return None
    name, arguments = calls[0]
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        return None
    valid = _valid_arguments(arguments, tool)
    if valid is None:
        return None
    return name, msgspec.json.encode(valid).decode()


def looks_like_text_call(output: ModelOutput, tools: tuple[ToolDefinition, ...]) -> bool:
    """Whether ``output`` is a text reply (no calls) whose whole text is calls of offered tools
    (one or more, valid arguments or not): what a server without a tool-call parser sends."""
    if not tools or output.tool_calls:
        return False
    calls = _written_calls(output.content)
    if not calls:
        return False
    names = {t.name for t in tools}
    return all(name in names for name, _ in calls)


def recover(output: ModelOutput, tools: tuple[ToolDefinition, ...]) -> ModelOutput:
    """``output`` with its text made the one call it holds (see the module docstring), or
    ``output`` itself when it is not such a reply.

    The call's id is ``call_<turn>_<step>_0``; its arguments are the validated object as compact
    JSON; the reply's text is dropped (it was the call); the stop reason is ``tool_calls``, and
    ``stop_detail`` starts with :data:`RECOVERED`.
    """
    if output.tool_calls or output.stop_reason not in ("stop", "tool_calls") or not tools:
        return output
    found = text_call(output.content, tools)
    if found is None:
        return output
    name, arguments = found
    call = ToolCall(id=f"call_{output.turn_id}_{output.step}_0", name=name, arguments=arguments)
    return msgspec.structs.replace(
        output,
        content="",
        tool_calls=(call,),
        stop_reason="tool_calls",
        stop_detail=f"{RECOVERED}: the reply's whole text was one call of {name!r}",
    )
