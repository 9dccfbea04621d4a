"""The errors stream: what could not be handled and had no trace to fail in.

An entry on ``<ns>:errors`` (see :mod:`agentstream.wire.keys`) carries ``error`` (what was wrong),
``payload`` (a bounded excerpt of what arrived, :func:`agentstream.wire.checks.excerpt`) and, where
known, ``source`` and ``entry``. The stream is capped (``MAXLEN ~`` at
``AGENTSTREAM_ERRORS_MAXLEN``): it is a report for operators, not a work stream.
"""

from __future__ import annotations

from redis import asyncio as aioredis

from agentstream.runtime.entries import xadd_fields
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
