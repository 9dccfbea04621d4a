"""Trimming work streams below what every consumer group has acknowledged.

A work stream may only lose entries that no group still needs. :func:`trim_acknowledged`
computes, atomically in one Lua script, the lowest id any group still needs, and trims
below it with ``XTRIM MINID``:

- for each group, the oldest entry in its pending entries list (delivered, not acknowledged);
- and the first entry it has not been delivered yet (just after its ``last-delivered-id``).

A stream with no group is never trimmed (nobody is known to have read it), so dead-letter
streams and the replies stream (read by backends, perhaps without a group) keep everything
until an operator trims them. A group created later at id ``0`` does not see trimmed entries.

Traces are never trimmed by the runtime: retention of whole conversations is the explicit
setting ``AGENTSTREAM_TRACE_RETENTION_S`` (see :mod:`agentstream.ops.settings`).

Why not ``MAXLEN``: it drops the oldest entries whatever their state, so a pending entry loses
its body and its work is lost (field case C18). Redis ≥ 8.2 has an ACK-aware trim mode
(``XTRIM ... ACKED``); this script gives the same guarantee on Redis 6.2 and 7.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from agentstream.runtime.lua import script

_TRIM_LUA = script("trim_acknowledged")  # agentstream/runtime/lua/trim_acknowledged.lua


@dataclass(frozen=True)
class Trimmed:
    """The outcome of one trim.

    Attributes:
        removed: entries removed.
        threshold: the MINID used (every entry below it was acknowledged by every group), or
            None when the stream has no group (and nothing was trimmed).
    """

    removed: int
    threshold: str | None


async def trim_acknowledged(redis: aioredis.Redis, stream: str, *, approximate: bool = False) -> Trimmed:
    """Trim ``stream`` below the oldest entry any of its groups still needs (see the module).

    Args:
        redis: an asyncio Redis client.
        stream: the work stream.
        approximate: trim whole radix-tree nodes only (``MINID ~``): cheaper, removes less.

    Raises:
        redis.exceptions.ResponseError: the key is not a stream.
    """
    removed, threshold = await redis.eval(_TRIM_LUA, 1, stream, "1" if approximate else "0")
    text = threshold.decode() if isinstance(threshold, bytes) else threshold
    return Trimmed(removed=int(removed), threshold=text or None)
