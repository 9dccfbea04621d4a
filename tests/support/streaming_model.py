"""A scripted OpenAI-compatible model that streams its replies slowly (a real HTTP server).

For the gateway's and console's tests: a person must see tokens arrive, and a cancel must land
while the model writes. Each request is answered by :func:`tests.support.scripted_model.calculator_rule`
(a calculator tool call, then the answer), except that a user message ``WRITE <n> <ms>`` is
answered with ``n`` words, one every ``ms`` milliseconds, and one holding ``SLOWARGS`` gets its
calculator call's arguments streamed two characters every :data:`SLOW_ARGS_S` seconds. A request
asking for ``stream`` gets server-sent ``chat.completion.chunk`` events (text in words, a tool
call in one piece unless SLOWARGS); else a whole JSON response. A client that goes away (a
cancelled call) ends the stream quietly.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.scripted_model import calculator_rule

_WRITE = re.compile(r"WRITE (\d+) (\d+)")
SLOW_ARGS_S = 0.3


def _rule(body: dict[str, Any]) -> tuple[dict[str, Any], str, float]:
    """→ (message, finish reason, seconds between words)."""
    messages = body["messages"]
    last = messages[-1]
    content = last.get("content") if last["role"] == "user" else None
    text = content if isinstance(content, str) else ""
    match = _WRITE.search(text)
    if match:
        n, ms = int(match.group(1)), int(match.group(2))
        words = " ".join(f"word{i}" for i in range(1, n + 1))
        return {"role": "assistant", "content": words}, "stop", ms / 1000
    result = calculator_rule(body)
    return result["message"], result["finish_reason"], SLOW_ARGS_S if "SLOWARGS" in text else 0.005


class StreamingModelServer:
    """Serve on ``http://127.0.0.1:<port>/v1`` in a background thread; ``requests`` counts them."""

    def __init__(self, *, model: str = "scripted-model"):
        self.model = model
        self.requests = 0
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._json({"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                server.requests += 1
                message, finish, pause_s = _rule(body)
                if not body.get("stream"):
                    self._json(
                        {
                            "id": "chatcmpl-s",
                            "object": "chat.completion",
                            "model": body.get("model"),
                            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
                        }
                    )
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    self._event(_chunk({"role": "assistant", "content": ""}))
                    if message.get("tool_calls") and pause_s >= SLOW_ARGS_S:  # the arguments in pieces
                        call = message["tool_calls"][0]
                        name, arguments = call["function"]["name"], call["function"]["arguments"]
                        head = {"index": 0, "id": call["id"], "type": "function"}
                        self._event(_chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
                        for at in range(0, len(arguments), 2):
                            if server._stopping.wait(pause_s):
                                return
                            piece = {"index": 0, "function": {"arguments": arguments[at : at + 2]}}
                            self._event(_chunk({"tool_calls": [piece]}))
                    elif message.get("tool_calls"):
                        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
                        self._event(_chunk({"tool_calls": calls}))
                    else:
                        words = (message.get("content") or "").split(" ")
                        for i, word in enumerate(words):
                            if server._stopping.wait(pause_s):
                                return
                            self._event(_chunk({"content": word if i == 0 else " " + word}))
                    self._event(_chunk({}, finish=finish))
                    self._event(
                        {
                            "id": "chatcmpl-s",
                            "object": "chat.completion.chunk",
                            "choices": [],
                            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
                        }
                    )
                    self._raw(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client went away (a cancelled call)

            def _json(self, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _event(self, payload: dict[str, Any]) -> None:
                self._raw(f"data: {json.dumps(payload)}\n\n".encode())

            def _raw(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> StreamingModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        time.sleep(0.05)
        self._server.shutdown()
        self._server.server_close()


def _chunk(delta: dict[str, Any], *, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "model": "scripted-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
