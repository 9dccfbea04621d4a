"""The errors stream: what could not be handled and had no trace to fail in.

An entry on ``<ns>:errors`` (see :mod:`agentstream.wire.keys`) carries ``error`` (what was wrong),
``payload`` (a bounded excerpt of what arrived, :func:`agentstream.wire.checks.excerpt`) and, where
known, ``source`` and ``entry``. The stream is capped (``MAXLEN ~`` at
``AGENTSTREAM_ERRORS_MAXLEN``): it is a report for operators, not a work stream.
"""

from __future__ import annotations

import asyncio
from typing import cast

from redis import asyncio as aioredis

from agentstream.runtime.entries import StreamsReply, xadd_fields
from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits, error_fields
from agentstream.wire.keys import Keys


async def report_error(
    redis: aioredis.Redis,
    keys: Keys,
    error: str,
    payload: bytes | str | None,
    limits: WireLimits = DEFAULT_LIMITS,
    **extra: str,
) -> None:
    """Append one entry to the errors stream (bounded excerpt, stream capped)."""
    fields = xadd_fields(error_fields(error, payload, limits, **extra))
    await redis.xadd(keys.errors, fields, maxlen=limits.errors_maxlen, approximate=True)


async def refusal_of(
    redis: aioredis.Redis,
    keys: Keys,
    *,
    source: str,
    entry: str,
    after: str,
    stop: asyncio.Event,
    block_ms: int = 500,
) -> str | None:
    """Wait for the errors stream to report entry ``entry`` of stream ``source`` (an entry a client
    published there and a service refused: a malformed or over-limit message, a decision that
    cannot be taken) → the report's ``error`` text, or None once ``stop`` is set.

    Reads ``<ns>:errors`` from ``after`` (its newest id before the entry was published, so no
    older report is taken for this one), ``block_ms`` per read. A client that publishes and then
    waits for an outcome watches this beside its outcome, so a refusal ends its wait at once
    instead of looking like a service that is down."""
    want_entry, want_source = entry.encode(), source.encode()
    last: str | bytes = after
    while not stop.is_set():
        got = cast("StreamsReply | None", await redis.xread({keys.errors: last}, count=100, block=block_ms))
        for _, rows in got or []:
            for entry_id, fields in rows:
                last = entry_id
                if fields.get(b"entry") == want_entry and fields.get(b"source") == want_source:
                    return fields.get(b"error", b"").decode(errors="replace")
    return None
