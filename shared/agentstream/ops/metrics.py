"""Prometheus metrics of every service, with standard names and units.

Served on ``/metrics`` (with ``/healthz`` and ``/readyz``) by :func:`serve_http` when
``AGENTSTREAM_METRICS_PORT`` is set: the Prometheus text format, or OpenMetrics 1.0 when the
scraper's ``Accept`` header asks for ``application/openmetrics-text``. Durations are seconds,
counters end in ``_total`` (https://prometheus.io/docs/practices/naming/).

The stream gauges (length, pending entries, lag, live consumers) are read from Redis every
``AGENTSTREAM_METRICS_INTERVAL_S`` and again at a scrape when the last reading is older than
:data:`FRESH_S` seconds, so a scrape never shows them older than that (unless Redis does not
answer within :data:`SCRAPE_REFRESH_TIMEOUT_S`); ``agentstream_stream_observed_timestamp_seconds``
says when they were read (:mod:`agentstream.runtime.stream_gauges` reads them).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import platform
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
from prometheus_client import REGISTRY, Info, disable_created_metrics
from prometheus_client.exposition import choose_encoder

from agentstream.wire.events import ModelOutput

log = logging.getLogger("agentstream.ops.metrics")

disable_created_metrics()  # no `*_created` gauge beside every counter

BOUND_CHILDREN_CAP = 1024
"""The most label-value sets a metric keeps bound for :meth:`labels` (more: the cache starts over)."""


class _BoundChildren:
    """A labelled metric whose children are bound once per label values: ``labels(...)`` on the
    hot path is one dict lookup, not prometheus_client's lock, str() of each value and tuple
    build. The cache is bounded (:data:`BOUND_CHILDREN_CAP`) and forgotten by ``remove`` and
    ``clear``; the children themselves are prometheus_client's, so what is exported is unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_position: dict[tuple[Any, ...], Any] = {}
        self._by_name: dict[tuple[tuple[str, Any], ...], Any] = {}

    def labels(self, *values: Any, **named: Any) -> Any:
        if named:
            key: Any = tuple(named.items())
            cache: dict[Any, Any] = self._by_name
        else:
            key, cache = values, self._by_position
        child = cache.get(key)
        if child is None:
            child = super().labels(*values, **named)  # type: ignore[misc]  # the metric class's own
            if len(cache) >= BOUND_CHILDREN_CAP:
                cache.clear()
            cache[key] = child
        return child

    def remove(self, *values: Any) -> None:
        self._forget()
        super().remove(*values)  # type: ignore[misc]

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._forget()
        super().remove_by_labels(labels)  # type: ignore[misc]

    def clear(self) -> None:
        self._forget()
        super().clear()  # type: ignore[misc]

    def _forget(self) -> None:
        self._by_position.clear()
        self._by_name.clear()


class Counter(_BoundChildren, prometheus_client.Counter):
    """A prometheus_client Counter whose children are bound once (see :class:`_BoundChildren`)."""


class Gauge(_BoundChildren, prometheus_client.Gauge):
    """A prometheus_client Gauge whose children are bound once (see :class:`_BoundChildren`)."""


class Histogram(_BoundChildren, prometheus_client.Histogram):
    """A prometheus_client Histogram whose children are bound once (see :class:`_BoundChildren`)."""


LAG_COUNT_CAP = 10_000
"""Where a group's lag is counted from its entries (no lag from Redis), the most counted."""
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

TURNS_STARTED = Counter("agentstream_turns_started_total", "Turns that entered a trace.", ["agent"])
TURNS_ENDED = Counter("agentstream_turns_ended_total", "Turns that ended with an answer.", ["agent"])
TURNS_FAILED = Counter("agentstream_turns_failed_total", "Turns that ended without an answer.", ["agent", "code"])
TURNS_CANCELLED = Counter("agentstream_turns_cancelled_total", "Turns that were cancelled.", ["agent"])
TURNS_REJECTED = Counter("agentstream_turns_rejected_total", "Published turns rejected as malformed.")
STEP_SECONDS = Histogram("agentstream_step_seconds", "Time of one agent-loop step.", buckets=_LATENCY_BUCKETS_S)
MODEL_CALL_SECONDS = Histogram(
    "agentstream_model_call_seconds", "Time of one model call, retries included.", ["model"], buckets=_LATENCY_BUCKETS_S
)
MODEL_TOKENS = Counter("agentstream_model_tokens_total", "Tokens reported by the model.", ["model", "kind"])
TOOL_CALL_SECONDS = Histogram(
    "agentstream_tool_call_seconds", "Time of one tool call.", ["tool"], buckets=_LATENCY_BUCKETS_S
)
TOOL_ERRORS = Counter("agentstream_tool_errors_total", "Tool calls that gave an error result.", ["tool", "error"])
STREAM_LENGTH = Gauge("agentstream_stream_length", "Entries in a work stream.", ["stream"])
PENDING_ENTRIES = Gauge("agentstream_pending_entries", "Pending entries of a consumer group.", ["stream", "group"])
CONSUMER_LAG = Gauge("agentstream_consumer_lag", "Entries not yet delivered to a consumer group.", ["stream", "group"])
RECLAIMS = Counter("agentstream_reclaims_total", "Pending entries claimed from idle consumers.", ["stream"])
DEAD_LETTERS = Counter("agentstream_dead_letters_total", "Entries moved to a dead-letter stream.", ["stream"])
LOST_ENTRIES = Counter(
    "agentstream_lost_entries_total", "Pending entries found without a body (deleted while pending).", ["stream"]
)
TRIMMED_ENTRIES = Counter(
    "agentstream_trimmed_entries_total", "Acknowledged entries trimmed from a work stream.", ["stream"]
)
TOOL_OUTCOMES_UNKNOWN = Counter(
    "agentstream_tool_outcomes_unknown_total",
    "Calls of tools with side effects whose worker died mid-run (not run again).",
    ["tool"],
)
LATE_RESULTS = Counter(
    "agentstream_late_results_total", "Tool results that arrived after their call was answered.", ["tool"]
)
BUILD_INFO = Info("agentstream_build", "The agentstream version and Python of this process (value 1).")
HANDLERS_IN_FLIGHT = Gauge(
    "agentstream_handlers_in_flight",
    "Entries whose handler is running now, per service (as `agentstream serve` names it) and stream.",
    ["service", "stream"],
)


@functools.lru_cache(maxsize=64)
def service_of_group(group: str) -> str:
    """The service a consumer group belongs to, as ``agentstream serve``, ``agentstream_build_info``
    and the chart's ``app.kubernetes.io/component`` name it: the tool workers' group is
    ``tool-workers``, their service ``tool-worker``; the other groups are named as their service."""
    from agentstream.wire.keys import TOOL_WORKER_GROUP

    return "tool-worker" if group == TOOL_WORKER_GROUP else group


MODEL_ERRORS = Counter(
    "agentstream_model_errors_total",
    "Failed model HTTP attempts, retried or not, by endpoint and HTTP status (network, timeout, invalid_output, other).",
    ["endpoint", "status"],
)
MODEL_RETRIES = Counter(
    "agentstream_model_retries_total",
    "Model HTTP attempts retried, by endpoint and the status that caused it.",
    ["endpoint", "status"],
)
MODEL_TEXT_TOOL_CALLS = Counter(
    "agentstream_model_text_tool_calls_total",
    "Replies whose whole text was one call of an offered tool as JSON (a server without a tool-call parser), "
    "by endpoint and whether the call was recovered (quirks.tool_calls_in_text) or the text stayed the answer.",
    ["endpoint", "recovered"],
)
STREAM_CONSUMERS = Gauge(
    "agentstream_stream_consumers",
    "Live consumers of a consumer group (seen within the live idle time); 0 with work waiting: nothing consumes it.",
    ["stream", "group"],
)
STREAM_OBSERVED = Gauge(
    "agentstream_stream_observed_timestamp_seconds", "When the stream gauges were last read from Redis (Unix time)."
)

FRESH_S = 5.0
"""A scrape reads the stream gauges again when the last reading is older than this (seconds)."""
SCRAPE_REFRESH_TIMEOUT_S = 2.0
"""How long a scrape waits for that reading before serving the previous one (seconds)."""
LIVE_IDLE_MS = 60_000
"""A consumer that has not read, claimed or renewed for this long (ms) is not counted live."""


def set_build_info(service: str = "") -> None:
    """Fill ``agentstream_build_info`` (version, Python, and the service this process runs)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("agentstream")
    except PackageNotFoundError:
        ours = "unknown"
    BUILD_INFO.info({"version": ours, "python": platform.python_version(), "service": service})


def model_error_status(exc: BaseException) -> str:
    """The ``status`` label of a failed model attempt: the HTTP status, or what failed instead."""
    import httpx

    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return str(code)
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.TransportError):
        return "network"
    from agentstream.errors import InvalidModelOutput

    if isinstance(exc, InvalidModelOutput):
        return "invalid_output"
    return "other"


MCP_SESSIONS = Counter(
    "agentstream_mcp_sessions_total", "MCP server sessions a tool worker opened (a restart opens another).", ["server"]
)
MCP_SERVER_UP = Gauge(
    "agentstream_mcp_server_up", "1 while this tool worker has a live session with the MCP server.", ["server"]
)
MCP_TOOLS_REFUSED = Gauge(
    "agentstream_mcp_tools_refused",
    "Tools of an MCP server refused at its last listing (schemas the endpoints reject).",
    ["server"],
)
COMPACTIONS = Counter(
    "agentstream_compactions_total", "Compaction outcomes recorded (compacted, or a failure code).", ["outcome"]
)
DELEGATIONS = Counter(
    "agentstream_delegations_total", "Child traces opened by delegation, by the child's agent.", ["agent"]
)


def record_usage(model_id: str, output: ModelOutput) -> None:
    """Count the tokens a model output reports."""
    if output.usage.prompt_tokens:
        MODEL_TOKENS.labels(model=model_id, kind="prompt").inc(output.usage.prompt_tokens)
    if output.usage.completion_tokens:
        MODEL_TOKENS.labels(model=model_id, kind="completion").inc(output.usage.completion_tokens)


def _path_of(target: str) -> str:
    """The path of a request target, without its query string."""
    return target.split("?", 1)[0]


async def serve_http(
    port: int,
    ready: Callable[[], bool | tuple[bool, str]],
    *,
    host: str = "0.0.0.0",
    before_scrape: Callable[[], Awaitable[None]] | None = None,
) -> asyncio.base_events.Server:
    """Serve ``/metrics``, ``/healthz`` (the process's event loop answers) and ``/readyz``
    (``ready()`` is true, or ``(True, reason)``; 503 with the reason otherwise).

    A minimal HTTP/1.0 responder on asyncio streams, so probes and scrapes share the
    service's event loop and see it stall when it stalls. Paths match exactly (a query string
    is ignored); anything else is 404. ``/metrics`` answers in the format the ``Accept`` header
    asks for (prometheus_client's ``choose_encoder``: OpenMetrics or the text format), after
    ``await before_scrape()`` (which refreshes what a scrape must not show stale).
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            accept = ""
            while (line := await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "accept":
                    accept = value.strip()
            parts = request_line.decode("latin-1").split()
            path = _path_of(parts[1]) if len(parts) > 1 else "/"
            if path == "/metrics":
                if before_scrape is not None:
                    await before_scrape()
                encoder, ctype = choose_encoder(accept)
                # off the event loop: the process collector reads /proc files on every scrape
                status, body = "200 OK", await asyncio.to_thread(encoder, REGISTRY)
            elif path == "/healthz":
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path == "/readyz":
                answer = ready()
                ok, why = answer if isinstance(answer, tuple) else (bool(answer), "")
                text = "ready\n" if ok else (f"not ready: {why}\n" if why else "not ready\n")
                status, ctype, body = ("200 OK" if ok else "503 Service Unavailable"), "text/plain", text.encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("metrics and health on :%d", port)
    return server


# --- the HTTP gateway ------------------------------------------------------------------------

GATEWAY_REQUESTS = Counter(
    "agentstream_gateway_requests_total", "HTTP requests answered by the gateway.", ["method", "route", "status"]
)
GATEWAY_REQUEST_SECONDS = Histogram(
    "agentstream_gateway_request_seconds",
    "Time to answer one gateway request (an event stream: to its start).",
    ["route"],
    buckets=_LATENCY_BUCKETS_S,
)
GATEWAY_TURNS = Counter("agentstream_gateway_turns_total", "Turns published through the gateway.", ["key", "agent"])
GATEWAY_UNAUTHORIZED = Counter(
    "agentstream_gateway_unauthorized_total", "Gateway requests refused without a valid API key."
)
GATEWAY_RATE_LIMITED = Counter(
    "agentstream_gateway_rate_limited_total", "Gateway requests refused over a key's rate limit.", ["key"]
)
GATEWAY_STREAMS_OPEN = Gauge("agentstream_gateway_streams_open", "Event streams the gateway is serving now.")
