"""The MCP servers one tool worker keeps: sessions, restarts, catalogs and calls (the ``mcp`` SDK).

For each MCP server whose queue the worker serves, an :class:`McpConnection` holds one client
session of the official SDK (:class:`mcp.Client`, protocol version negotiated by the SDK):

- **Start.** stdio: the command is started (with the declared and inherited environment), its
  stdout read with a cap and its stderr logged line by line (:mod:`~agentstream.mcp_tools.transports`);
  streamable HTTP: the URL, with headers read from the environment (kept in memory only), its
  response bodies read with a cap. The first listing must come within the server's ``connect_timeout_s``.
- **Listing.** Every tool the server lists (every page) that the allow-list lets through gets its
  input schema normalised (:func:`~agentstream.mcp_tools.schemas.normalise_input_schema`: bounded
  work, in a thread, within :data:`SCHEMA_DEADLINE_S`, so no listing stalls the worker's loop); a
  tool that cannot be offered is logged at ERROR naming the tool and the keyword, and recorded
  among the catalog's refusals. The catalog goes to Redis for the agent loops. The listing is
  read again on the server's list-changed notification (``notifications/tools/list_changed``,
  or a ``subscriptions/listen`` event on 2026-07-28 connections), and at every probe.
- **Probe.** Every ``probe_interval_s`` (5 s for stdio, 30 s for HTTP by default) the session
  lists the tools again: a session that no longer answers is taken as dead. A server busy with
  calls (it may serve one request at a time) is given their timeout on top before that
  (:func:`~agentstream.mcp_tools.liveness.probe_overdue`).
- **Calls.** A call waits for a live session (within its timeout), runs ``tools/call`` and maps
  the result (:mod:`~agentstream.mcp_tools.results`). A call cancelled (the turn was cancelled,
  or its timeout passed) cancels the MCP request: the SDK sends ``notifications/cancelled``.
- **Death.** When the session ends (the process exited, the connection closed, a probe failed)
  every call in flight gets an error result at once, never a hang, and the server is started
  again after a backoff (0.5 s after a session that had opened, then doubling to 30 s while it
  cannot be started).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx2
import jsonschema
import pydantic
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, Implementation, ToolListChangedNotification

from agentstream.declarations.mcp_servers import McpServer, Transport
from agentstream.declarations.tool_context import current_call
from agentstream.declarations.tools import Tool, ToolResult
from agentstream.errors import ConfigError, ToolArgumentsError
from agentstream.mcp_tools.liveness import probe_overdue
from agentstream.mcp_tools.results import result_value
from agentstream.mcp_tools.schemas import SchemaRefused, normalise_input_schema
from agentstream.mcp_tools.transports import CappedTransport, stdio_transport
from agentstream.ops import metrics
from agentstream.runtime.connection import RedisClient
from agentstream.runtime.mcp_catalogs import publish_catalog
from agentstream.steps.offers import Catalog, Refusal, offer_digest
from agentstream.wire.events import OfferedTool
from agentstream.wire.jsontext import arguments_unicode_refusal
from agentstream.wire.keys import Keys

log = logging.getLogger("agentstream.mcp")

SERVER_STOPPED = "server_stopped"
"""Error code of a call whose MCP server stopped (or could not be reached) while it ran."""
SERVER_ERROR = "server_error"
"""Error code of a call the MCP server answered with a protocol error (not a tool result)."""

_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
_MAX_PAGES = 100
_TOOL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _check_name(name: str) -> None:
    """Refuse a tool name the endpoints reject (OpenAI and Anthropic: ``^[a-zA-Z0-9_-]{1,64}$``)."""
    if not (1 <= len(name) <= 64) or not set(name) <= _TOOL_NAME_CHARS:
        raise SchemaRefused(name, "name", "belongs to a tool whose name is not 1-64 letters, digits, '_' or '-'")


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an error, of the first error inside an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _closed(client: Client) -> bool:
    """Whether the session's connection is known closed (the SDK's dispatcher saw the end of its
    stream); False when the SDK does not say."""
    dispatcher = getattr(client.session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _argument_problems(validator: Any, value: dict[str, Any]) -> list[str]:
    problems = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in error.absolute_path) or "(arguments)"
        problems.append(f"{where}: {error.message}")
    return problems[:5]


SCHEMA_DEADLINE_S = 10.0
"""The longest the checks of one listing's input schemas may take (in a thread), in seconds; past
it the listing fails as a session that stopped answering does."""


class McpListingError(RuntimeError):
    """A server's tool listing could not be taken in (the reason says why): its session ends."""


@dataclasses.dataclass(frozen=True)
class PreparedTool:
    """A listed tool that can be offered: its normalised parameters and its arguments' validator
    (None when its schema is not valid JSON Schema: its arguments are not checked then)."""

    name: str
    description: str
    parameters: dict[str, Any]
    validator: Any


def prepare_listing(server: str, listed: Sequence[Any]) -> tuple[list[PreparedTool], list[Refusal]]:
    """The tools of a listing (``name``, ``description``, ``title``, ``input_schema`` each) that can
    be offered, and the refusals of the others (a bad name, a schema refused by
    :func:`~agentstream.mcp_tools.schemas.normalise_input_schema`), first occurrence of a name
    only. CPU work bounded by the schemas' limits; no I/O, so it may run in a thread."""
    prepared: list[PreparedTool] = []
    refused: list[Refusal] = []
    seen: set[str] = set()
    for entry in listed:
        if entry.name in seen:
            continue
        seen.add(entry.name)
        try:
            _check_name(entry.name)
            parameters = normalise_input_schema(entry.name, entry.input_schema)
        except SchemaRefused as exc:
            refused.append(Refusal(tool=exc.tool, keyword=exc.keyword, reason=exc.reason))
            continue
        validator = None
        try:
            cls = jsonschema.validators.validator_for(entry.input_schema)
            cls.check_schema(entry.input_schema)
            validator = cls(entry.input_schema)
        except jsonschema.SchemaError as exc:
            log.warning(
                "MCP server %r: the input schema of tool %r is not valid JSON Schema (%s); its arguments "
                "are not checked before the call",
                server,
                entry.name,
                exc.message,
            )
        prepared.append(PreparedTool(entry.name, entry.description or entry.title or "", parameters, validator))
    return prepared, refused


class McpTool(Tool):
    """One tool of an MCP server, as the tool worker runs it (a :class:`~agentstream.Tool`).

    Its settings (timeout, side effects, queue) come from the server's declaration; its
    arguments are checked against the input schema the server listed (JSON Schema, with the
    ``jsonschema`` library: ``validator``, made by :func:`prepare_listing`) before the call goes out.
    """

    def __init__(
        self,
        connection: McpConnection,
        name: str,
        *,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        validator: Any = None,
    ):
        server = connection.server
        # no Python function and no pydantic model: an MCP tool overrides every method that reads them
        self.fn = None  # type: ignore[assignment]
        self.name = name
        self.description = description
        self.parameters = dict(parameters or {"type": "object", "properties": {}})
        self.timeout_s = server.timeout_for(name)
        self.queue = server.queue
        self.side_effects = server.has_side_effects(name)
        self.retry_safe = server.is_retry_safe(name)
        self.is_async = True
        self.arguments_model = None  # type: ignore[assignment]  # (see fn above)
        self.connection = connection
        self._validator = validator

    def __repr__(self) -> str:
        return f"McpTool({self.name!r}, server={self.connection.server.name!r}, side_effects={self.side_effects!r})"

    def parse_arguments(self, raw: str) -> dict[str, Any]:
        """Raw argument text → the arguments object (empty text means ``{}``).

        Raises:
            ToolArgumentsError: not a JSON object, not Unicode (a lone surrogate escape), or it
                does not match the tool's input schema (the message names each place, for the
                model to correct).
        """
        text = raw.strip()
        refusal = arguments_unicode_refusal(self.name, text)  # the SDK's transport cannot write it: the session died
        if refusal is not None:
            raise ToolArgumentsError(refusal)
        try:
            value: Any = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"arguments for tool {self.name!r} are not valid JSON ({exc.msg} at character {exc.pos}); "
                "send one JSON object matching the tool's parameters"
            ) from None
        if not isinstance(value, dict):
            raise ToolArgumentsError(
                f"arguments for tool {self.name!r} must be a JSON object, got {type(value).__name__}"
            )
        if self._validator is not None:
            problems = _argument_problems(self._validator, value)
            if problems:
                raise ToolArgumentsError(f"invalid arguments for tool {self.name!r}: {'; '.join(problems)}")
        return value

    async def invoke(self, raw_arguments: str, *, timeout_s: float | None = None) -> ToolResult:
        """Call the tool on its server; never raises for the call's own failures.

        Bad arguments, an error the server reports, a server that stops or cannot be reached and
        a timeout (after which the MCP request is cancelled) each give an error result.
        """
        try:
            arguments = self.parse_arguments(raw_arguments)
        except ToolArgumentsError as exc:
            return ToolResult(text=f"Error: {exc}", error="invalid_arguments")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            call_id = current_call().call_id
        except LookupError:
            call_id = "call"
        was_ready = self.connection.ready.is_set()
        try:
            return await asyncio.wait_for(self.connection.call(self.name, arguments, call_id=call_id), timeout=limit)
        except TimeoutError:
            if not was_ready and not self.connection.ready.is_set():
                why = self.connection.last_error or "it has not started yet"
                return ToolResult(
                    text=f"Error: tool {self.name!r} could not be run: MCP server {self.connection.server.name!r} was not "
                    f"available within {limit:g} s ({why}). Try again later.",
                    error=SERVER_STOPPED,
                )
            return ToolResult(
                text=f"Error: tool {self.name!r} did not finish within {limit:g} s; its MCP request "
                "was cancelled. It may have partly run.",
                error="timeout",
            )


class McpConnection:
    """One MCP server kept by this tool worker: its session, its listing and its calls in flight.

    Args:
        server: the declaration.
        transport: where it is (resolved from the declaration and the environment).
        redis: where the catalog goes.
        keys: the key names.
        worker_name: this process's consumer name (written in the catalog).
        probe_interval_s: how often a live session is asked for its tools again, in seconds
            (the server's own ``probe_interval_s`` wins; None: 5 s for stdio, 30 s for HTTP).
    """

    def __init__(
        self,
        server: McpServer,
        transport: Transport,
        redis: RedisClient,
        keys: Keys,
        *,
        worker_name: str = "",
        probe_interval_s: float | None = None,
    ):
        self.server = server
        self.transport = transport
        self.redis = redis
        self.keys = keys
        self.worker_name = worker_name
        self.probe_interval_s = server.probe_interval_s or probe_interval_s or (5.0 if transport.command else 30.0)
        self.ready = asyncio.Event()
        self.tools: dict[str, McpTool] = {}
        self.catalog: Catalog | None = None
        self.in_flight = 0
        self.sessions = 0
        self.last_error = ""
        self._client: Client | None = None
        self._lost = asyncio.Event()
        self._relist = asyncio.Event()

    # --- the session, kept alive ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a session open until ``stop`` is set (and no call is in flight), restarting it with backoff."""
        backoff = _FIRST_BACKOFF_S
        while not stop.is_set():
            opened = self.sessions
            session = asyncio.create_task(self._session(), name=f"mcp:{self.server.name}")
            stopping = asyncio.create_task(self._until_stopped(stop))
            connect_deadline = asyncio.create_task(self._connect_deadline())
            try:
                await asyncio.wait({session, stopping, connect_deadline}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (stopping, connect_deadline):
                    task.cancel()
                self._end_session()
                if not session.done():
                    session.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    try:
                        await session
                    except Exception as exc:  # the SDK's or the transport's: logged, then restarted
                        self.last_error = _describe(exc)
            if stop.is_set():
                return
            if connect_deadline.done() and not connect_deadline.cancelled() and not self.last_error:
                self.last_error = f"no tool list within {self.server.connect_timeout_s:g} s"
            if opened != self.sessions:  # it had connected: the first retry comes soon
                backoff = _FIRST_BACKOFF_S
            log.warning(
                "MCP server %r (%s) is not available (%s); starting it again in %.1f s",
                self.server.name,
                self.transport.describe(),
                self.last_error or "its session ended",
                backoff,
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _until_stopped(self, stop: asyncio.Event) -> None:
        await stop.wait()
        while self.in_flight:  # the worker drains its calls first (its grace period bounds this)
            await asyncio.sleep(0.05)

    async def _connect_deadline(self) -> None:
        await asyncio.sleep(self.server.connect_timeout_s)
        if self.ready.is_set():
            await asyncio.Event().wait()  # connected in time: never fires

    def _end_session(self) -> None:
        """The session is over: calls in flight are told at once; new calls wait for the next one."""
        metrics.MCP_SERVER_UP.labels(server=self.server.name).set(0)
        self.ready.clear()
        self._lost.set()
        self._client = None

    def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        t = self.transport
        if t.command:  # its stdout read with a cap, its stderr into the logger (never the worker's stderr)
            return stdio_transport(t, self.server.name)
        http = httpx2.AsyncClient(
            headers=dict(t.headers), timeout=httpx2.Timeout(30.0, read=300.0), transport=CappedTransport()
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(t.url, http_client=http)

    async def _session(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            client = Client(
                self._target(stack),
                message_handler=self._on_message,
                cache=None,
                client_info=Implementation(name="agentstream", version="0.1.0"),
            )
            await stack.enter_async_context(client)
            self._lost = asyncio.Event()
            await self._list(client)
            self._client = client
            self.sessions += 1
            self.last_error = ""
            self.ready.set()
            metrics.MCP_SESSIONS.labels(server=self.server.name).inc()
            metrics.MCP_SERVER_UP.labels(server=self.server.name).set(1)
            log.info(
                "MCP server %r (%s): session %d open, %d tool(s) listed",
                self.server.name,
                self.transport.describe(),
                self.sessions,
                len(self.tools),
            )
            listener = asyncio.create_task(self._listen(client))
            try:
                await self._watch(client)
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener

    async def _watch(self, client: Client) -> None:
        """Return when the session is lost; list the tools again on a change and at every probe."""
        lost = self._lost
        while not lost.is_set():
            waiters = {asyncio.create_task(lost.wait()), asyncio.create_task(self._relist.wait())}
            try:
                await asyncio.wait(waiters, timeout=self.probe_interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if lost.is_set():
                return
            self._relist.clear()
            if not await self._probe(client, lost):
                return

    async def _probe(self, client: Client, lost: asyncio.Event) -> bool:
        """List the tools again; False when the session is gone (``last_error`` says why).

        A server that is busy with a call may answer late (many serve one request at a time):
        only :func:`~agentstream.mcp_tools.liveness.probe_overdue` decides when waiting ends."""
        answer_within_s = max(self.probe_interval_s, 5.0)
        longest_call_s = max([self.server.timeout_s, *self.server.tool_timeouts_s.values()])
        probe = asyncio.ensure_future(self._list(client))
        gone = asyncio.ensure_future(lost.wait())
        started = time.monotonic()
        try:
            while not probe.done() and not lost.is_set():
                waited_s = time.monotonic() - started
                if probe_overdue(
                    waited_s=waited_s,
                    answer_within_s=answer_within_s,
                    calls_in_flight=self.in_flight,
                    longest_call_s=longest_call_s,
                ):
                    self.last_error = f"it stopped answering (no tool list within {waited_s:.0f} s)"
                    return False
                # looked at again at least every second: calls in flight come and go meanwhile
                await asyncio.wait(
                    {probe, gone}, timeout=min(1.0, answer_within_s), return_when=asyncio.FIRST_COMPLETED
                )
            if not probe.done():
                return False  # the session was lost meanwhile
            probe.result()
        except Exception as exc:  # closed connection, transport error, a listing refused: the session is gone
            self.last_error = f"it stopped answering ({_describe(exc)})"
            return False
        finally:
            gone.cancel()
            if not probe.done():
                probe.cancel()
        return True

    async def _listen(self, client: Client) -> None:
        """On a 2026-07-28 connection, list again on each ``subscriptions/listen`` tools event."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._relist.set()
        except ListenNotSupportedError:
            return  # an earlier protocol version: notifications/tools/list_changed comes to _on_message
        except Exception as exc:  # a lost subscription: the probe decides whether the session is
            log.debug("MCP server %r: the list-changed subscription ended (%s)", self.server.name, exc)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._relist.set()

    async def _list(self, client: Client) -> None:
        """Read every page of the server's tools; when they changed, publish the catalog."""
        listed = []
        cursor = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        wanted = [entry for entry in listed if self.server.allows(entry.name)]
        try:  # the schema work is bounded (prepare_listing), and runs off the event loop with a deadline
            prepared, refused = await asyncio.wait_for(
                asyncio.to_thread(prepare_listing, self.server.name, wanted), timeout=SCHEMA_DEADLINE_S
            )
        except TimeoutError:
            raise McpListingError(
                f"checking the input schemas of its {len(wanted)} tool(s) took more than {SCHEMA_DEADLINE_S:g} s"
            ) from None
        tools: dict[str, McpTool] = {}
        offered: list[OfferedTool] = []
        for tool in prepared:
            tools[tool.name] = McpTool(
                self, tool.name, description=tool.description, parameters=tool.parameters, validator=tool.validator
            )
            offered.append(
                OfferedTool(
                    name=tool.name, description=tool.description, parameters=tool.parameters, server=self.server.name
                )
            )
        digest = offer_digest(offered)
        refusals = tuple(refused)
        self.tools = tools
        if self.catalog is not None and self.catalog.digest == digest and self.catalog.refused == refusals:
            return
        metrics.MCP_TOOLS_REFUSED.labels(server=self.server.name).set(len(refusals))
        for refusal in refusals:
            log.error(
                "MCP server %r: tool %r is refused and not offered: its input schema %s (keyword %r)",
                self.server.name,
                refusal.tool,
                refusal.reason,
                refusal.keyword,
            )
        self._check_prompts(tools)
        catalog = Catalog(
            server=self.server.name,
            tools=tuple(offered),
            refused=refusals,
            digest=digest,
            listed_at_ms=int(time.time() * 1000),
            worker=self.worker_name,
        )
        await publish_catalog(self.redis, self.keys, catalog)
        if self.catalog is not None:
            log.info("MCP server %r: its tool list changed (%d tool(s) now); published", self.server.name, len(offered))
        self.catalog = catalog

    def _check_prompts(self, tools: Mapping[str, McpTool]) -> None:
        texts = getattr(self.server.prompts, "tools", None) or {}
        for name, entry in texts.items():
            if name not in tools:
                continue
            properties = tools[name].parameters.get("properties", {})
            unknown = sorted(set(entry.arguments) - set(properties))
            if unknown:
                log.warning(
                    "MCP server %r: the prompt file describes arguments tool %r does not take: %s",
                    self.server.name,
                    name,
                    unknown,
                )

    # --- calls ---------------------------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any], *, call_id: str) -> ToolResult:
        """Run ``tools/call`` on the live session (waiting for one) → the result for the model.

        Cancelling the awaiting task cancels the MCP request. Never raises for the server's or
        the connection's failures: they are error results.
        """
        while True:
            await self.ready.wait()
            client, lost = self._client, self._lost
            if client is not None and not _closed(client):
                break
            self.ready.clear()  # it died and nobody noticed yet: wait for the next session
            self._lost.set()
        if name not in self.tools:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(
                text=f"Error: MCP server {self.server.name!r} does not list a tool named {name!r} (it lists: {known}).",
                error="unknown_tool",
            )
        self.in_flight += 1
        request = asyncio.ensure_future(client.call_tool(name, arguments))
        gone = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({request, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.in_flight -= 1
            gone.cancel()
            if not request.done():
                request.cancel()  # the SDK tells the server (notifications/cancelled)
        if not request.done():
            return self._stopped(name, self.last_error or "its session ended")
        try:
            result = request.result()
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost.set()
                return self._stopped(name, "the connection closed")
            return ToolResult(
                text=f"Error: MCP server {self.server.name!r} refused the call of tool {name!r}: "
                f"{exc} (error code {exc.code})",
                error=SERVER_ERROR,
            )
        except pydantic.ValidationError as exc:
            return ToolResult(
                text=f"Error: MCP server {self.server.name!r} answered the call of tool {name!r} with "
                f"a result that is not valid: {exc.error_count()} problem(s)",
                error=SERVER_ERROR,
            )
        except (OSError, httpx2.HTTPError, RuntimeError) as exc:
            self._lost.set()
            return self._stopped(name, f"{type(exc).__name__}: {exc}")
        return result_value(result, server=self.server.name, tool=name, call_id=call_id)

    def _stopped(self, name: str, why: str) -> ToolResult:
        return ToolResult(
            text=f"Error: tool {name!r} did not return: MCP server {self.server.name!r} stopped while the call ran "
            f"({why}); it is being started again. The call may have partly run; check before you call it again.",
            error=SERVER_STOPPED,
        )


class McpHost:
    """Every MCP server one tool worker keeps, as one runner of the service.

    Args:
        servers: the servers whose queues this worker serves.
        redis: where catalogs go.
        keys: the key names.
        worker_name: this process's consumer name.
        environ: the environment transports are read from (default ``os.environ``).
        probe_interval_s: see :class:`McpConnection`.

    Raises:
        ConfigError: a server's transport is incomplete (see :meth:`McpServer.transport`).
    """

    def __init__(
        self,
        servers: Sequence[McpServer],
        redis: RedisClient,
        keys: Keys,
        *,
        worker_name: str = "",
        environ: Mapping[str, str] | None = None,
        probe_interval_s: float | None = None,
    ):
        if not servers:
            raise ConfigError("an MCP host needs at least one MCP server")
        self.redis = redis
        self.stream = keys.tools(servers[0].queue)
        self.connections = [
            McpConnection(
                s, s.transport(environ), redis, keys, worker_name=worker_name, probe_interval_s=probe_interval_s
            )
            for s in servers
        ]

    def tool(self, name: str) -> Tool | None:
        """The tool of that name of a live server; else, while a server allowing it has not listed
        yet, one that waits for that server; else None."""
        for connection in self.connections:
            tool = connection.tools.get(name)
            if tool is not None:
                return tool
        for connection in self.connections:
            if connection.catalog is None and connection.server.allows(name):
                return McpTool(connection, name)
        return None

    def tool_names(self) -> list[str]:
        return sorted({name for c in self.connections for name in c.tools})

    async def run(self, stop: asyncio.Event) -> None:
        """Keep every server's session until ``stop`` (and the worker's calls drained)."""
        tasks = [asyncio.create_task(c.run(stop), name=f"mcp:{c.server.name}") for c in self.connections]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
