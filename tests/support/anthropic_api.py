"""A stand-in for the Anthropic Messages API in tests: documented shapes, and the API's checks.

Responses are built in the shapes the public documentation gives
(https://docs.anthropic.com/en/api/messages, .../messages-streaming, and the extended-thinking
guide): a ``message`` object with ``content`` blocks (``thinking`` with a ``signature``,
``redacted_thinking``, ``text``, ``tool_use``), ``stop_reason`` and ``usage``; streams as
``message_start``, ``content_block_start`` / ``content_block_delta`` (``thinking_delta``,
``signature_delta``, ``text_delta``, ``input_json_delta``) / ``content_block_stop``,
``message_delta`` and ``message_stop`` events; errors as ``{"type": "error", "error": {...}}``.

:func:`validate` refuses a request the way the API does for the faults this project must not
make (HTTP 400 ``invalid_request_error``): a system message inside ``messages``, roles that do
not alternate, empty content, a ``tool_use`` not answered by ``tool_result`` blocks at the start
of the next user message, a ``tool_result`` for an unknown id, a thinking block that is edited,
moved after other blocks, unsigned, or signed for another model ("Invalid signature"), and a
tool turn continued with thinking enabled whose assistant message does not start with thinking.
Signatures here are ``sig_`` + a hash of (model, thinking text): opaque, and checkable.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tests.support.fault_server import Recorded, Reply

API_KEY = "sk-ant-test-0123456789abcdef"
ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


def sign(model: str, thinking: str) -> str:
    """The signature this stand-in gives (and checks) for a thinking text of a model."""
    return "sig_" + hashlib.sha256(f"{model}\0{thinking}".encode()).hexdigest()[:40]


def thinking(model: str, text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": sign(model, text)}


def message(
    model: str, content: list[dict[str, Any]], stop_reason: str = "end_turn", *, msg_id: str = "msg_01Xfake"
) -> dict[str, Any]:
    """A Messages API response object."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 120,
            "output_tokens": 48,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def error(kind: str, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": text}}


def stream_events(
    model: str, content: list[dict[str, Any]], stop_reason: str = "end_turn", *, piece: int = 6
) -> list[Any]:
    """The documented event sequence of a streamed response with these content blocks."""
    events: list[Any] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01Xstream",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 120, "output_tokens": 1},
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(content):
        kind = block["type"]
        if kind == "thinking":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    },
                )
            )
            text = block["thinking"]
            for i in range(0, len(text), piece):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "thinking_delta", "thinking": text[i : i + piece]},
                        },
                    )
                )
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    },
                )
            )
        elif kind == "redacted_thinking":
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
            )
        elif kind == "text":
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            text = block["text"]
            for i in range(0, len(text), piece):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": text[i : i + piece]},
                        },
                    )
                )
        elif kind == "tool_use":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                    },
                )
            )
            raw = json.dumps(block["input"])
            for i in range(0, len(raw), piece):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": raw[i : i + piece]},
                        },
                    )
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 48},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _text_ok(block: dict[str, Any]) -> bool:
    return isinstance(block.get("text"), str) and bool(block["text"].strip())


def validate(body: dict[str, Any], headers: dict[str, str]) -> str | None:  # noqa: C901 (an outlier from before the complexity limit; issue 32 splits it)
    """The API's refusal message for this request, or None when it would be accepted."""
    if headers.get("x-api-key") != API_KEY:
        return "auth"
    if not headers.get("anthropic-version"):
        return "anthropic-version header is required"
    model = body.get("model")
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    thinking_on = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled"
    if thinking_on:
        budget = body["thinking"].get("budget_tokens", 0)
        if budget < 1024 or budget >= body["max_tokens"]:
            return "thinking.budget_tokens: must be >= 1024 and less than max_tokens"
        if body.get("temperature") not in (None, 1):
            return "temperature may only be set to 1 when thinking is enabled"
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            return "Thinking may not be enabled when tool_choice forces tool use."
    expected_role = "user"
    pending: set[str] = set()
    for n, msg in enumerate(messages):
        role = msg.get("role")
        if role == "system":
            return f"messages.{n}.role: system messages go in the top-level system parameter"
        if role != expected_role:
            return (
                f"messages.{n}: roles must alternate between user and assistant (got {role} after "
                f"{messages[n - 1].get('role') if n else None})"
            )
        expected_role = "assistant" if role == "user" else "user"
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not content:
            return f"messages.{n}: all messages must have non-empty content except for the optional final assistant message"
        if role == "user":
            results = []
            seen_other = False
            for m, block in enumerate(content):
                if block.get("type") == "tool_result":
                    if seen_other:
                        return f"messages.{n}.content.{m}: tool_result blocks must come before other content"
                    results.append(block.get("tool_use_id"))
                else:
                    seen_other = True
                    if block.get("type") == "text" and not _text_ok(block):
                        return f"messages.{n}.content.{m}.text: text content blocks must be non-empty"
            for tool_id in results:
                if tool_id not in pending:
                    return f"messages.{n}: unexpected `tool_use_id` found in `tool_result` blocks: {tool_id}"
            missing = pending - set(results)
            if missing:
                return (
                    f"messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {sorted(missing)}"
                )
            pending = set()
        else:
            if pending:
                return f"messages.{n}: tool_use without tool_result"
            seen_other = False
            for m, block in enumerate(content):
                kind = block.get("type")
                if kind in ("thinking", "redacted_thinking"):
                    if seen_other:
                        return f"messages.{n}.content.{m}: thinking blocks must come first in an assistant message"
                    if kind == "thinking" and block.get("signature") != sign(model, block.get("thinking", "")):
                        return f"messages.{n}.content.{m}: Invalid `signature` in `thinking` block"
                    continue
                seen_other = True
                if kind == "text" and not _text_ok(block):
                    return f"messages.{n}.content.{m}.text: text content blocks must be non-empty"
                if kind == "tool_use":
                    if not ID_RE.match(str(block.get("id"))):
                        return f"messages.{n}.content.{m}.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                    if not isinstance(block.get("input"), dict):
                        return f"messages.{n}.content.{m}.input: Input should be a valid dictionary"
                    pending.add(block["id"])
    if messages[-1]["role"] != "user":
        return None
    if thinking_on and len(messages) >= 2:
        last_assistant = messages[-2]
        first_user_block = (messages[-1]["content"] or [{}])[0]
        continued = (
            any(b.get("type") == "tool_use" for b in last_assistant["content"])
            and first_user_block.get("type") == "tool_result"
        )
        if continued and last_assistant["content"][0].get("type") not in ("thinking", "redacted_thinking"):
            kind = last_assistant["content"][0].get("type")
            return (
                f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{kind}`. "
                "When `thinking` is enabled, a final `assistant` message must start with a thinking block."
            )
    return None


class FakeMessagesAPI:
    """A rule for :class:`FaultServer`: validate each request, then give the next scripted reply.

    ``replies`` are Reply objects; a request the API would refuse gets HTTP 400 with the
    documented error shape instead (and does not consume a scripted reply).
    """

    def __init__(self, replies: list[Reply]):
        self.replies = list(replies)
        self.refusals: list[str] = []

    def __call__(self, recorded: Recorded) -> Reply:
        if recorded.headers.get("x-api-key") != API_KEY:
            return Reply(status=401, body=error("authentication_error", "invalid x-api-key"))
        problem = validate(recorded.json, recorded.headers)
        if problem is not None:
            self.refusals.append(problem)
            return Reply(status=400, body=error("invalid_request_error", problem))
        if not self.replies:
            return Reply(status=500, body=error("api_error", "the fake API's script ran out"))
        return self.replies.pop(0)
