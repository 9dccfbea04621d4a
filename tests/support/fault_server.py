"""A failure-injecting model server for tests: a real HTTP/1.1 server on a loopback port.

It answers ``POST .../chat/completions`` (OpenAI shape) and ``POST .../messages`` (Anthropic
shape) from a script: each request takes the next :class:`Reply` (or ``rule(request)`` gives
it). A reply is a JSON body with any status and headers, or a server-sent event stream sent
with chunked transfer encoding that may be cut:

- ``cut="reset"`` closes the connection mid-body (the client sees an incomplete chunked body:
  a network error);
- ``cut="eof"`` ends the body cleanly after the events sent so far (no ``[DONE]``, no finish).

Every request is recorded (path, headers, raw body) for assertions.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        status: the HTTP status.
        body: a JSON-able body (for a non-stream answer).
        events: SSE events: a dict (sent as ``data: <json>``), a string (sent as ``data: <it>``)
            or an ``(event name, dict)`` pair (sent with an ``event:`` line).
        headers: extra response headers.
        cut_after: send only this many events, then cut as ``cut`` says.
        cut: ``reset`` (connection closed mid-body) or ``eof`` (body ended early, cleanly).
        content_type: overrides the content type.
    """

    status: int = 200
    body: Any = None
    events: list[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    cut: Literal["reset", "eof"] = "reset"
    content_type: str | None = None


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.raw)


Rule = Callable[[Recorded], Reply]


class FaultServer:
    """Serve scripted replies on ``http://127.0.0.1:<port>`` (see the module docstring).

    Args:
        replies: replies given in order, one per request (the last one repeats when
            ``repeat_last``); or use ``rule``.
        rule: a function of the recorded request → its reply (used when ``replies`` runs out).
    """

    def __init__(self, replies: Iterable[Reply] = (), *, rule: Rule | None = None, repeat_last: bool = False):
        self.script = list(replies)
        self.rule = rule
        self.repeat_last = repeat_last
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._json(200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]}, {})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                recorded = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
                reply = server._next(recorded)
                if reply.events is None:
                    self._json(reply.status, reply.body, reply.headers, reply.content_type)
                else:
                    self._stream(reply)

            def _json(
                self, status: int, payload: Any, headers: dict[str, str], content_type: str | None = None
            ) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", content_type or "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type or "text/event-stream; charset=utf-8")
                self.send_header("transfer-encoding", "chunked")
                self.send_header("cache-control", "no-cache")
                if reply.cut_after is not None:
                    self.send_header("connection", "close")
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                events = reply.events or []
                limit = len(events) if reply.cut_after is None else reply.cut_after
                for event in events[:limit]:
                    self._chunk(_sse(event))
                if reply.cut_after is not None and reply.cut == "reset":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                if reply.cut_after is not None:
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _next(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self.script:
                if len(self.script) == 1 and self.repeat_last:
                    return self.script[0]
                return self.script.pop(0)
        if self.rule is not None:
            return self.rule(recorded)
        return Reply(
            status=500, body={"error": {"message": "the fault server's script ran out", "type": "server_error"}}
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests]

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _sse(event: Any) -> bytes:
    if isinstance(event, tuple):
        name, data = event
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    if isinstance(event, str):
        return f"data: {event}\n\n".encode()
    return f"data: {json.dumps(event)}\n\n".encode()


# --- OpenAI-shaped replies ------------------------------------------------------------------


def chat(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = "stop",
    refusal: str | None = None,
    reasoning: str | None = None,
    usage: dict[str, int] | None = None,
    model: str = "fault-model",
) -> Reply:
    """A whole chat-completions response."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    if refusal is not None:
        message["refusal"] = refusal
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return Reply(
        body={
            "id": "chatcmpl-fault",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
    )


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call of a chat-completions message."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chunk(
    delta: dict[str, Any] | None = None, *, finish: str | None = None, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    """One ``chat.completion.chunk``."""
    out: dict[str, Any] = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "model": "fault-model",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
        out["choices"] = []
    return out


def text_stream(*pieces: str, finish: str = "stop") -> list[Any]:
    """The events of a streamed text reply (ending with usage and ``[DONE]``)."""
    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in pieces]
    events += [
        chunk(finish=finish),
        chunk(usage={"prompt_tokens": 9, "completion_tokens": len(pieces), "total_tokens": 9 + len(pieces)}),
        "[DONE]",
    ]
    return events
