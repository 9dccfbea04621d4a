"""Reading the dead-letter streams (runtime: Redis commands).

A work stream's entry that failed ``AGENTSTREAM_MAX_DELIVERIES`` times is moved to
``<ns>:dead:<stream>`` (see :mod:`agentstream.runtime.consumer`) with its own fields and ``dead_*``
fields saying where it came from and why. :func:`read` gives them back, newest first, for the
HTTP gateway and its console.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from agentstream.wire.keys import Keys

PAYLOAD_EXCERPT_CHARS = 4000
"""How much of each payload field a dead letter carries back (the rest is cut, and says so)."""

_DEAD_PREFIX = b"dead_"


@dataclass(frozen=True)
class DeadLetter:
    """One entry of a dead-letter stream.

    Attributes:
        stream: the dead-letter stream.
        entry_id: its entry id there (its time, Unix ms, is the id's first part).
        source_stream: the work stream the entry came from.
        source_id: its entry id on that stream.
        group: the consumer group that gave up on it.
        deliveries: handler starts counted by agentstream (0 when lost before any).
        error: the last error, or why it was lost.
        trace_id: the trace its payload names, when it names one.
        payload: the entry's own fields (each cut at :data:`PAYLOAD_EXCERPT_CHARS`).
    """

    stream: str
    entry_id: str
    source_stream: str
    source_id: str
    group: str
    deliveries: int
    error: str
    trace_id: str | None = None
    payload: dict[str, str] = field(default_factory=dict)


async def read(
    redis, keys: Keys, streams: Sequence[str], *, count: int = 50, before: str | None = None
) -> list[DeadLetter]:
    """The newest dead letters of the work ``streams`` (at most ``count``), newest first.

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        keys: the key names.
        streams: the work streams whose dead-letter streams to read (``Keys.work_streams``).
        count: the most dead letters returned.
        before: only entries older than this entry id (paging).
    """
    pipe = redis.pipeline(transaction=False)
    for stream in streams:
        pipe.xrevrange(keys.dead(stream), max=f"({before}" if before else "+", min="-", count=count)
    replies = await pipe.execute()
    letters = [
        _letter(keys.dead(stream), entry_id, fields)
        for stream, entries in zip(streams, replies, strict=True)
        for entry_id, fields in entries
    ]
    letters.sort(key=lambda d: _order(d.entry_id), reverse=True)
    return letters[:count]


def _letter(stream: str, raw_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
    def text(name: bytes) -> str:
        return fields.get(name, b"").decode(errors="replace")

    payload = {
        k.decode(errors="replace"): _excerpt(v.decode(errors="replace"))
        for k, v in fields.items()
        if not k.startswith(_DEAD_PREFIX)
    }
    deliveries = text(b"dead_deliveries")
    return DeadLetter(
        stream=stream,
        entry_id=raw_id.decode() if isinstance(raw_id, bytes) else raw_id,
        source_stream=text(b"dead_source_stream"),
        source_id=text(b"dead_source_id"),
        group=text(b"dead_group"),
        deliveries=int(deliveries) if deliveries.isdigit() else 0,
        error=_excerpt(text(b"dead_error")),
        trace_id=_trace_id(fields),
        payload=payload,
    )


def _trace_id(fields: dict[bytes, bytes]) -> str | None:
    """The ``trace_id`` of the first field holding a JSON object that names one."""
    for name, value in fields.items():
        if name.startswith(_DEAD_PREFIX):
            continue
        try:
            obj = msgspec.json.decode(value)
        except msgspec.DecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("trace_id"), str):
            return obj["trace_id"]
    return None


def _excerpt(text: str) -> str:
    if len(text) <= PAYLOAD_EXCERPT_CHARS:
        return text
    return text[:PAYLOAD_EXCERPT_CHARS] + f"… ({len(text) - PAYLOAD_EXCERPT_CHARS} more characters)"


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return (int(ms) if ms.isdigit() else 0, int(seq) if seq.isdigit() else 0)
