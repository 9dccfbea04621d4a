"""A malicious MCP server for tests (issue 33): JSON-RPC written by hand, no SDK, so it can send
what no well-behaved server would.

``python -m tests.support.mcp_hostile stdio`` or ``... http --port P`` (streamable HTTP on
``http://127.0.0.1:P/mcp``, answering with JSON bodies). Its tools:

- ``ok``: answers ``ok`` (the call a test makes after an attack, to see the server still serves).
- ``bomb``: listed with a schema of about 2 KB whose definitions each name the next one twice
  (2^17 values inlined); it never runs.
- ``flood_stderr``: writes ``lines`` lines to stderr (one very long line, then forged JSON log
  records and control characters) in one go, then answers.
- ``garbage``: writes lines that are not JSON-RPC on stdout, then answers.
- ``huge``: answers with one line of ``mb`` megabytes on stdout (http: a body of that size).
- ``endless``: (http) a chunked body that never ends; (stdio) a line that never ends.
- ``die``: exits in the middle of the call.
- ``busy``: blocks for ``s`` seconds (reading nothing, answering nothing, as a server that serves
  one request at a time does while it works), then answers ``done``.

With ``MCP_TEST_DIR`` set, it writes its pid there (``pid``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

BOMB_DEPTH = 17
FORGED = '{"level": "ERROR", "logger": "agentstream.tool_worker", "message": "forged by the server"}'


def _bomb_schema() -> dict:
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(BOMB_DEPTH)
    }
    defs[f"d{BOMB_DEPTH}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def _tool(name: str, properties: dict | None = None) -> dict:
    return {"name": name, "description": name, "inputSchema": {"type": "object", "properties": properties or {}}}


TOOLS = [
    _tool("ok"),
    {"name": "bomb", "description": "a schema bomb", "inputSchema": _bomb_schema()},
    _tool("flood_stderr", {"lines": {"type": "integer"}}),
    _tool("garbage"),
    _tool("huge", {"mb": {"type": "number"}}),
    _tool("endless"),
    _tool("die"),
    _tool("busy", {"s": {"type": "number"}}),
]


def _result(request_id, text: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}}


def _answer(message: dict) -> dict | None:
    """The answer to an ordinary request (None for a notification)."""
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        return None
    if method == "initialize":
        version = message.get("params", {}).get("protocolVersion", "2025-06-18")
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {
                "protocolVersion": version if version <= "2025-06-18" else "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            },
        }
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": request_id, "result": {}}
    if method == "tools/call" and message["params"]["name"] == "ok":
        return _result(request_id, "ok")
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}}


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def stdio() -> None:
    for raw in sys.stdin.buffer:
        message = json.loads(raw)
        if message.get("method") == "tools/call":
            name, arguments, request_id = (
                message["params"]["name"],
                message["params"].get("arguments") or {},
                message["id"],
            )
            if name == "flood_stderr":
                lines = int(arguments.get("lines", 1000))
                # one very long line, then short ones (a long line in every cycle was 0.7 GB for 20,000)
                out = [FORGED, "bell \x07 escape \x1b[31m red \r carriage"]
                sys.stderr.write("\n".join(["x" * 100_000, *(out * (lines // len(out) + 1))[: lines - 1]]) + "\n")
                sys.stderr.flush()
                _write(json.dumps(_result(request_id, "flooded")).encode() + b"\n")
                continue
            if name == "garbage":
                _write(b'this is not json\n\xff\xfe\n{"jsonrpc": "2.0", "id": "nobody"}\n[1, 2\n')
                _write(json.dumps(_result(request_id, "after garbage")).encode() + b"\n")
                continue
            if name == "huge":
                size = int(float(arguments.get("mb", 64)) * 1024 * 1024)
                _write(json.dumps(_result(request_id, "h" * size)).encode() + b"\n")
                continue
            if name == "endless":
                head = json.dumps(_result(request_id, ""))[:-4].encode()
                _write(head)
                while True:
                    _write(b"e" * 65_536)
            if name == "die":
                os._exit(3)
            if name == "busy":
                time.sleep(float(arguments.get("s", 1)))
                _write(json.dumps(_result(request_id, "done")).encode() + b"\n")
                continue
        answer = _answer(message)
        if answer is not None:
            _write(json.dumps(answer).encode() + b"\n")


async def http(port: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ")[0]
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method != "POST":
                    writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                message = json.loads(body)
                name = message.get("params", {}).get("name") if message.get("method") == "tools/call" else None
                if name in ("endless", "huge"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    chunk = b"h" * 65_536
                    sent, total = 0, (1 << 62) if name == "endless" else 64 * 1024 * 1024
                    while sent < total:
                        writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                        await writer.drain()
                        sent += len(chunk)
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    continue
                answer = _answer(message)
                if answer is None:
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                else:
                    data = json.dumps(answer).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data)
                        + data
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    folder = os.environ.get("MCP_TEST_DIR")
    if folder:
        with open(os.path.join(folder, "pid"), "w") as fh:
            fh.write(str(os.getpid()))
    if args.mode == "stdio":
        stdio()
    else:
        asyncio.run(http(args.port))


if __name__ == "__main__":
    main()
