"""A scripted OpenAI-compatible chat-completions server for tests (a real HTTP server).

It answers by a rule of the conversation so far (a "function model"): each request's JSON is
passed to ``rule(body) -> response message dict`` and the reply is wrapped as a
chat-completions response (a ``usage`` key in the rule's dict replaces the usage reported).
Every request body is kept for assertions.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Rule = Callable[[dict[str, Any]], dict[str, Any]]


def calculator_rule(body: dict[str, Any]) -> dict[str, Any]:
    """Call ``calculator`` on the first pass; then answer with the tool's result.

    The expression is the arithmetic found in the last user message.
    """
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "user":
        match = re.search(r"[\d\s\.\+\-\*/\(\)]{3,}", last["content"])
        expression = (match.group(0) if match else "1+1").strip()
        n = sum(1 for m in messages if m["role"] == "assistant")
        return {
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}_{abs(hash(expression)) % 10**8}",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    if last["role"] == "tool":
        return {
            "message": {"role": "assistant", "content": f"The answer is {last['content']}."},
            "finish_reason": "stop",
        }
    return {"message": {"role": "assistant", "content": "I am not sure."}, "finish_reason": "stop"}


_PLAN = re.compile(r"(\w+)\(([^)]*)\)")


def parallel_rule(body: dict[str, Any]) -> dict[str, Any]:
    """Call every tool named in the user's message at once (parallel tool calls); then answer.

    The user's message holds a plan such as ``"do: work(20) work(5) record(a)"``: one call per
    ``name(argument)``, all in one reply, in that order. ``work`` gets ``{"ms": <int>}``, every
    other tool ``{"key": <text>}``. Call ids are derived from the message and the position, so
    the same request always gets the same reply (a retried step writes the same calls). Once
    every call has a result, the answer lists the results in call order. A message containing
    ``SLOW`` makes the model take 60 s (for cancel tests).
    """
    messages = body["messages"]
    users = [m for m in messages if m["role"] == "user"]
    text = users[-1]["content"] if users else ""
    if isinstance(text, list):
        text = " ".join(part.get("text", "") for part in text)
    if "SLOW" in text:
        _interruptible_sleep(60.0)
    last = messages[-1]
    if last["role"] == "user":
        calls = []
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        for i, (name, arg) in enumerate(_PLAN.findall(text)):
            arguments = {"ms": int(arg or 0)} if name == "work" else {"key": arg}
            calls.append(
                {
                    "id": f"call_{digest}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        if calls:
            return {
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
                "finish_reason": "tool_calls",
            }
        return {"message": {"role": "assistant", "content": "Nothing to do."}, "finish_reason": "stop"}
    results = []
    for m in reversed(messages):
        if m["role"] != "tool":
            break
        results.append(m["content"] if isinstance(m["content"], str) else json.dumps(m["content"]))
    return {
        "message": {"role": "assistant", "content": "Results: " + " | ".join(reversed(results))},
        "finish_reason": "stop",
    }


_stopping = threading.Event()


def _interruptible_sleep(seconds: float) -> None:
    _stopping.wait(seconds)


class ScriptedModelServer:
    """Serve ``rule`` on ``http://127.0.0.1:<port>/v1`` in a background thread."""

    def __init__(self, rule: Rule = calculator_rule, *, model: str = "scripted-model"):
        self.rule = rule
        self.model = model
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                with server._lock:
                    server.requests.append(raw)
                body = json.loads(raw)
                result = server.rule(body)
                if "status" in result:
                    self._send(result["status"], result.get("body", {}), result.get("headers"))
                    return
                n = len(server.requests)
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "message": result["message"], "finish_reason": result["finish_reason"]}
                        ],
                        "usage": result.get("usage")
                        or {"prompt_tokens": len(raw) // 4, "completion_tokens": 7, "total_tokens": len(raw) // 4 + 7},
                    },
                )

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModelServer:
        _stopping.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        _stopping.set()  # wake slow replies
        self._server.shutdown()
        self._server.server_close()
