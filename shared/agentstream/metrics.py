"""Prometheus metrics of every service, with standard names and units.

Served on ``/metrics`` (with ``/healthz`` and ``/readyz``) by :func:`serve_http` when
``AGENTSTREAM_METRICS_PORT`` is set. Durations are seconds, counters end in ``_total``
(https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from agentstream.events import ModelOutput

log = logging.getLogger("agentstream.metrics")

disable_created_metrics()  # no `*_created` gauge beside every counter

_LAG_COUNT_CAP = 10_000
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
TOOL_CALL_SECONDS = Histogram("agentstream_tool_call_seconds", "Time of one tool call.", ["tool"], buckets=_LATENCY_BUCKETS_S)
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
LATE_RESULTS = Counter("agentstream_late_results_total", "Tool results that arrived after their call was answered.", ["tool"])
COMPACTIONS = Counter("agentstream_compactions_total", "Compaction outcomes recorded (compacted, or a failure code).", ["outcome"])
DELEGATIONS = Counter("agentstream_delegations_total", "Child traces opened by delegation, by the child's agent.", ["agent"])


def record_usage(model_id: str, output: ModelOutput) -> None:
    """Count the tokens a model output reports."""
    if output.usage.prompt_tokens:
        MODEL_TOKENS.labels(model=model_id, kind="prompt").inc(output.usage.prompt_tokens)
    if output.usage.completion_tokens:
        MODEL_TOKENS.labels(model=model_id, kind="completion").inc(output.usage.completion_tokens)


async def serve_http(port: int, ready: Callable[[], bool], *, host: str = "0.0.0.0") -> asyncio.base_events.Server:
    """Serve ``/metrics``, ``/healthz`` (the process runs) and ``/readyz`` (``ready()`` is true).

    A minimal HTTP/1.0 responder on asyncio streams, so probes and scrapes share the
    service's event loop and see it stall when it stalls.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path.startswith("/metrics"):
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest()
            elif path.startswith("/healthz"):
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path.startswith("/readyz"):
                ok = ready()
                status, ctype, body = ("200 OK" if ok else "503 Service Unavailable"), "text/plain", (b"ready\n" if ok else b"not ready\n")
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("metrics and health on :%d", port)
    return server


async def observe_streams(redis, streams: list[str], *, interval_s: float = 15.0, stop: asyncio.Event) -> None:
    """Every ``interval_s`` seconds, set the length, pending entries and consumer lag gauges of
    each stream's consumer groups (XLEN, XINFO GROUPS; ``lag`` needs Redis ≥ 7.0)."""
    while not stop.is_set():
        try:
            await observe_streams_once(redis, streams)
        except Exception as exc:  # metrics never take a service down
            log.debug("stream metrics failed: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            pass


async def observe_streams_once(redis, streams: list[str]) -> None:
    """One observation of :func:`observe_streams`."""
    for stream in streams:
        STREAM_LENGTH.labels(stream=stream).set(await redis.xlen(stream))
        try:
            groups = await redis.xinfo_groups(stream)
        except Exception:  # the stream does not exist yet
            continue
        for info in groups:
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            PENDING_ENTRIES.labels(stream=stream, group=name).set(info.get("pending", 0) or 0)
            lag = info.get("lag")
            if lag is None:
                # Redis < 7 has no lag, and 7.x reports none when the group's read counter is
                # unknown (a group made at an id with entries already in the stream): count the
                # entries after the last delivered id instead, up to a cap.
                last = info.get("last-delivered-id") or b"0-0"
                last = last.decode() if isinstance(last, bytes) else last
                lag = len(await redis.xrange(stream, min=f"({last}", max="+", count=_LAG_COUNT_CAP))
            CONSUMER_LAG.labels(stream=stream, group=name).set(lag)
