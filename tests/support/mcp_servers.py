"""A real MCP server for tests, written with the ``mcp`` SDK's own server API (MCPServer).

Run it as the tool worker would: ``python -m tests.support.mcp_servers stdio``, or
``python -m tests.support.mcp_servers http --port P [--token T]`` (streamable HTTP on
``http://127.0.0.1:P/mcp``; with ``--token``, every request must carry
``Authorization: Bearer T`` or gets 401).

Its tools: ``add`` (a calculator), ``picture`` (returns text, an image and an embedded text
resource), ``fail`` (an error result), ``slow`` (sleeps; for cancels and kills), ``grow`` (adds a
tool ``extra`` and tells the client the list changed), ``nested`` (a pydantic model in its
arguments: ``$ref``/``$defs`` in its schema) and ``either`` (``anyOf`` at the top of its schema,
so agentstream refuses it).

With ``MCP_TEST_DIR`` set, the server writes there what a test checks from outside: its pid
(``pid``), each ``slow`` call's start (``slow-started-<tag>``, holding the pid) and the cancel it
saw (``slow-cancelled-<tag>``), and ``calls`` (one line per call: ``<tool> <arguments>``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import pydantic
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import EmbeddedResource, ImageContent, TextContent, TextResourceContents

PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
"""A 1x1 PNG, base64."""


def _dir() -> Path | None:
    value = os.environ.get("MCP_TEST_DIR")
    return Path(value) if value else None


def _note(name: str, text: str = "") -> None:
    folder = _dir()
    if folder is not None:
        (folder / name).write_text(text)


def _log_call(tool: str, arguments: dict) -> None:
    folder = _dir()
    if folder is not None:
        with open(folder / "calls", "a") as fh:
            fh.write(f"{tool} {json.dumps(arguments, sort_keys=True)}\n")


class Point(pydantic.BaseModel):
    x: float
    y: float


def build() -> MCPServer:
    server = MCPServer(name="agentstream-test")

    @server.tool(description="Add two numbers.")
    def add(a: float, b: float) -> str:
        _log_call("add", {"a": a, "b": b})
        return f"{a + b:g}"

    @server.tool(description="Draw a picture (returns an image and a caption resource).")
    def picture(subject: str) -> list:
        _log_call("picture", {"subject": subject})
        return [
            TextContent(type="text", text=f"a picture of {subject}"),
            ImageContent(type="image", data=PNG_1X1, mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="memo://caption", mime_type="text/plain", text=f"Caption: {subject} at dawn"
                ),
            ),
        ]

    @server.tool(description="Always fails.")
    def fail(reason: str) -> str:
        _log_call("fail", {"reason": reason})
        raise ToolError(f"it failed because {reason}")

    @server.tool(description="Sleep for a while.")
    async def slow(seconds: float, tag: str = "x") -> str:
        _log_call("slow", {"seconds": seconds, "tag": tag})
        _note(f"slow-started-{tag}", str(os.getpid()))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            _note(f"slow-cancelled-{tag}", "cancelled")
            raise
        return f"slept {seconds:g} s"

    @server.tool(description="Add a tool named extra to this server.")
    async def grow(ctx: Context) -> str:
        _log_call("grow", {})
        if server._tool_manager.get_tool("extra") is None:

            def extra(word: str) -> str:
                """Echo a word."""
                return f"extra {word}"

            server.add_tool(extra, name="extra", description="Echo a word (added while running).")
        await ctx.notify_tools_changed()  # 2026-07-28 connections (subscriptions/listen)
        try:
            await ctx.session.send_tool_list_changed()  # earlier protocol versions
        except Exception:
            pass
        return "grown"

    @server.tool(description="Distance of a point from the origin.")
    def nested(point: Point) -> str:
        return f"{(point.x**2 + point.y**2) ** 0.5:g}"

    @server.tool(description="A tool whose schema has anyOf at the top.")
    def either(value: str) -> str:
        return value

    listed = server._tool_manager.get_tool("either")
    listed.parameters = {
        "type": "object",
        "anyOf": [{"properties": {"value": {"type": "string"}}, "required": ["value"]}, {"properties": {}}],
    }
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="")
    args = parser.parse_args(argv)
    _note("pid", str(os.getpid()))
    server = build()
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()
    if args.token:
        inner = app

        async def app(scope, receive, send):
            if scope["type"] == "http":
                headers = dict(scope.get("headers") or [])
                if headers.get(b"authorization") != f"Bearer {args.token}".encode():
                    await send(
                        {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                    )
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
            await inner(scope, receive, send)

    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    sys.exit(main())
