"""How a tool worker talks to an MCP server without trusting it: bounded reads, its own log lines.

What a server sends is bounded before the SDK sees it, so a misbehaving server affects only its
own calls:

- **stdio** (:func:`stdio_transport`): the server's stdout is read in chunks and split into
  messages; a message longer than ``max_message_bytes`` (its line not ended by then) ends the
  session (every call in flight gets its error at once, the server is started again), instead of
  being buffered whole. Its stderr goes through a pipe into the worker's logger
  (:class:`StderrLog`), never straight into the worker's own stderr: one record per line, named
  by the server, escaped (control characters written as ``\\x..``), cut at ``max_line_bytes`` and
  limited to ``lines_per_s`` (a burst of ``burst`` lines; the number dropped is logged).
- **streamable HTTP** (:class:`CappedTransport`): a response body that is not an event stream
  is read up to ``max_body_bytes`` and fails the request past it (an endless body was buffered
  whole); the events of an event stream are capped by the SDK (``max_sse_event_size``).

The process is started in its own process group, with the SDK's inherited environment (its safe
variables) and the declared one, and stopped as the SDK stops its own (stdin closed, then SIGTERM
and SIGKILL to its group) when the session ends.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpx2
import mcp_types
from mcp.client.stdio import _stop_server_process, get_default_environment  # the SDK's own shutdown
from mcp.shared.message import SessionMessage

from agentstream.declarations.mcp_servers import Transport

log = logging.getLogger("agentstream.mcp")
stderr_log = logging.getLogger("agentstream.mcp.stderr")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The longest message (one line of stdout, one HTTP response body) read from a server, in bytes."""
PARSE_INLINE_BYTES = 64 * 1024
"""A stdout message longer than this is parsed in a thread, so the worker's other queues go on."""
MAX_LINE_BYTES = 2048
"""The longest line of a server's stderr logged, in bytes (the rest is cut, and its size said)."""
LINES_PER_S = 20.0
"""Lines of one server's stderr logged per second, after a burst of :data:`BURST_LINES`."""
BURST_LINES = 200


def escaped(data: bytes) -> str:
    """A line as a log may show it: UTF-8 (bad bytes as ``\\x..``), control and invisible
    characters escaped, so the line cannot end a record or forge another one."""
    text = data.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class StderrLog:
    """One server's stderr → the logger ``agentstream.mcp.stderr``, a record per line.

    Args:
        server: the server's name (in every record: ``MCP server 'x' stderr: ...``).
        max_line_bytes: the longest line logged (longer ones are cut, their size noted).
        lines_per_s: the lines logged per second once the burst is spent; the others are
            dropped and counted, and the count logged when lines are logged again.
        burst: the lines that may be logged at once.
        clock: the time in seconds (monotonic).
    """

    def __init__(
        self,
        server: str,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        lines_per_s: float = LINES_PER_S,
        burst: int = BURST_LINES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.max_line_bytes = max_line_bytes
        self.lines_per_s = lines_per_s
        self.burst = burst
        self.clock = clock
        self.tokens = float(burst)
        self.stamp = clock()
        self.dropped = 0
        self.logged = 0
        self._partial = bytearray()
        self._partial_size = 0  # bytes of the current line, counted past what is kept

    def feed(self, chunk: bytes) -> None:
        """Take what the pipe gave; log each line it ends. Keeps at most ``max_line_bytes`` of an
        unfinished line."""
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = self.max_line_bytes - len(self._partial)
            if room > 0:
                self._partial += piece[:room]
            self._partial_size += len(piece)
            if end < 0:
                return
            self._line()
            start = end + 1

    def close(self) -> None:
        """The pipe ended: log an unfinished last line, and what was dropped."""
        if self._partial_size:
            self._line()
        if self.dropped:
            self._emit(
                f"MCP server {self.server!r} stderr: {self.dropped} line(s) dropped (over {self.lines_per_s:g}/s)"
            )
            self.dropped = 0

    def _line(self) -> None:
        data, size = bytes(self._partial).rstrip(b"\r"), self._partial_size
        self._partial.clear()
        self._partial_size = 0
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.lines_per_s)
        self.stamp = now
        if self.tokens < 1:
            self.dropped += 1
            return
        self.tokens -= 1
        if self.dropped:
            self._emit(
                f"MCP server {self.server!r} stderr: {self.dropped} line(s) dropped (over {self.lines_per_s:g}/s)"
            )
            self.dropped = 0
        cut = f" [cut: {size:,} bytes]" if size > self.max_line_bytes else ""
        self._emit(f"MCP server {self.server!r} stderr: {escaped(data)}{cut}")

    def _emit(self, message: str) -> None:
        self.logged += 1
        stderr_log.info("%s", message, extra={"mcp_server": self.server})


class MessageTooLarge(anyio.BrokenResourceError):
    """A server sent a message over the limit: its session ends."""


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # garbage: the session reports it, the connection goes on
        log.warning("MCP server sent a line that is not a JSON-RPC message: %s", escaped(line[:200]))
        return exc


@contextlib.asynccontextmanager
async def stdio_transport(
    transport: Transport,
    server: str,
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    stderr: StderrLog | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start a stdio MCP server and yield the SDK's (read, write) streams of its messages.

    Args:
        transport: its command, environment and working directory.
        server: its name (for logs).
        max_message_bytes: the longest line of its stdout read; a longer one ends the session.
        stderr: where its stderr goes (default: a :class:`StderrLog` of ``server``).

    Raises:
        OSError: the command could not be started.
    """
    errlog = stderr or StderrLog(server)
    process = await anyio.open_process(
        list(transport.command),
        env=get_default_environment() | dict(transport.env),
        cwd=transport.cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async with read_writer:
            try:
                async for chunk in process.stdout:
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        line = bytes(buffer[start:end]).strip()
                        start = end + 1
                        if len(line) > PARSE_INLINE_BYTES:  # a long message is parsed off the event loop
                            await read_writer.send(await anyio.to_thread.run_sync(_parse, line))
                        elif line:
                            await read_writer.send(_parse(line))
                    del buffer[:start]
                    if len(buffer) > max_message_bytes:
                        log.error(
                            "MCP server %r wrote a message of more than %d bytes on stdout: its session ends "
                            "(the calls in flight fail; it is started again)",
                            server,
                            max_message_bytes,
                        )
                        return
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                return

    async def stderr_reader() -> None:
        assert process.stderr is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            async for chunk in process.stderr:
                errlog.feed(chunk)
        errlog.close()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end, not a request waiting for ever

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stderr_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tg.cancel_scope.cancel()


async def _stop(process: anyio.abc.Process) -> None:
    """Stop the server as the SDK's own stdio client does (its shutdown, kept with the SDK it
    belongs to): stdin closed, a grace period, SIGTERM then SIGKILL to the process group, the
    pipes and the subprocess transport closed; then our stderr pipe too."""
    await _stop_server_process(process)
    if process.stderr is not None:
        with contextlib.suppress(Exception):
            await process.stderr.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, url: str) -> None:
        self.inner = inner
        self.limit = limit
        self.url = url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.inner:
            read += len(chunk)
            if read > self.limit:
                reason = (
                    f"the MCP server's response body from {self.url} is over {self.limit:,} bytes; not read further"
                )
                log.error("%s (the call fails, the session ends and is opened again)", reason)
                raise httpx2.ReadError(reason)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """httpx's transport, with every response body that is not an event stream read up to
    ``max_body_bytes`` (past it, the read fails with :class:`httpx2.ReadError`)."""

    def __init__(self, max_body_bytes: int = MAX_MESSAGE_BYTES, inner: httpx2.AsyncBaseTransport | None = None):
        self.max_body_bytes = max_body_bytes
        self.inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response  # the SDK caps each event (max_sse_event_size)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _CappedStream(response.stream, self.max_body_bytes, str(request.url))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
