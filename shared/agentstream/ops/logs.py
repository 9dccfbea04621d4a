"""Structured logs: one JSON object per line, carrying the trace, turn and call ids.

Handlers set the ids of what they work on with :func:`bind`; every log record made inside
carries them (contextvars, so concurrent asyncio tasks keep their own). A
:class:`~agentstream.runtime.consumer.StreamConsumer` binds the ids an entry's payload names
(:func:`ids_of`) around everything done for that entry, its own lines included, so every line
about an entry of a trace says which trace, whatever the service. A record made while an
OpenTelemetry span is recording also carries ``otel_trace_id`` and ``otel_span_id`` (hex), so a
log line can be found from a trace and the other way round (see :mod:`agentstream.ops.tracing`).
JSON formatting is python-json-logger's. ``AGENTSTREAM_LOG_FORMAT=text`` gives plain lines for a
terminal. Both stamp each line with its time in ISO 8601, UTC, to the millisecond
(``2026-12-01T09:30:00.123Z``, RFC 3339), whatever the host's time zone.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import IO

import msgspec
from pythonjsonlogger.json import JsonFormatter

from agentstream.ops import tracing

_FIELDS = ("trace_id", "turn_id", "call_id")
# An immutable default: the bound mappings are never changed in place, each binding makes a new one.
_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "agentstream_log_context", default=MappingProxyType({})
)


class bind:
    """Attach ids (``trace_id``, ``turn_id``, ``call_id``) to every log record in the block.

    Use as ``with logs.bind(trace_id=...):``; ids that are None or empty are left out. (A class
    rather than a generator context manager: every step enters a few of these.)
    """

    __slots__ = ("_ids", "_token")

    def __init__(self, **ids: str | None) -> None:
        self._ids = ids

    def __enter__(self) -> None:
        current = _context.get()
        added = {k: v for k, v in self._ids.items() if v}
        self._token = _context.set({**current, **added} if added else current)  # the bound dicts are never changed

    def __exit__(self, *exc: object) -> None:
        _context.reset(self._token)


class _Ids(msgspec.Struct):
    trace_id: str | None = None
    turn_id: str | None = None
    call_id: str | None = None


_decode_ids = msgspec.json.Decoder(_Ids).decode


def ids_of(fields: Mapping[bytes, bytes] | None) -> dict[str, str]:
    """The trace, turn and call ids that the JSON payloads of a stream entry name (for :func:`bind`).

    Every agentstream message (turn, wake-up, cancel, tool job, delegation and compaction jobs)
    is a JSON object with some of ``trace_id``, ``turn_id`` and ``call_id``; other fields and
    anything that is not such an object are passed over.
    """
    ids: dict[str, str] = {}
    for value in (fields or {}).values():
        if not isinstance(value, (bytes, str)) or value[:1] not in (b"{", "{"):
            continue
        try:
            found = _decode_ids(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        for name in _FIELDS:
            got = getattr(found, name)
            if got and name not in ids:
                ids[name] = got
    return ids


def current() -> dict[str, str]:
    """The ids bound now."""
    return dict(_context.get())


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ids = _context.get()
        for name in _FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ids.get(name))
        if not hasattr(record, "otel_trace_id"):
            otel = tracing.current_ids()
            if otel is not None:  # extra fields: the JSON has them only while a span records
                record.otel_trace_id, record.otel_span_id = otel
        return True


def iso_utc(created: float) -> str:
    """A Unix time as ISO 8601 in UTC with milliseconds and a ``Z``: ``2026-12-01T09:30:00.123Z``."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _UtcJsonFormatter(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_utc(record.created)


class _UtcTextFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_utc(record.created)


LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
"""The log levels ``setup`` accepts (any case)."""


def setup(level: str = "INFO", *, fmt: str = "json", stream: IO[str] | None = None) -> None:
    """Configure the root logger: JSON lines (default) or plain text, on stderr (or ``stream``).

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    if level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_ContextFilter())
    if fmt == "json":
        handler.setFormatter(
            _UtcJsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s %(trace_id)s %(turn_id)s %(call_id)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(_UtcTextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the mcp SDK's HTTP client: a line per request
