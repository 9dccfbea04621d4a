"""Owning pending entries: claim renewal, release, attempt counting and server capabilities.

A consumer that handles an entry owns it in the group's pending entries list (PEL) until it
acknowledges it. These helpers keep that ownership honest without touching Redis's own
delivery counter, which every re-read and claim raises (field case C17):

- :func:`keep_claims` renews the claim on entries this consumer still owns (``XCLAIM ... JUSTID``,
  which resets the idle time without counting a delivery), so a live worker's long job is never
  claimed by another worker; entries another consumer took meanwhile are reported, not stolen back.
- :func:`release_claims` marks owned entries as long idle (``XCLAIM ... IDLE <ms> JUSTID``), so
  any live consumer claims them at its next look instead of after the whole ``min_idle_ms``
  (used on shutdown for work that did not finish within the grace period).
- The attempt counter (:func:`count_attempt`) is agentstream's own: a hash per stream and group,
  ``entry id → handler starts``, raised just before a handler starts (so a process killed in the
  handler still counts) and deleted on acknowledgement. Only real deliveries raise it.

Redis references: XCLAIM (JUSTID, IDLE), XPENDING, XREADGROUP's CLAIM option (Redis ≥ 8.4):
https://redis.io/docs/latest/commands/xclaim/, https://redis.io/docs/latest/commands/xreadgroup/.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

# KEYS: stream. ARGV: group, consumer, idle ms to set, then entry ids.
# For each id still owned by the consumer: XCLAIM it to the same consumer with that idle time
# and JUSTID (no delivery counted). Returns the ids still owned.
_KEEP_LUA = """
local kept = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    table.insert(kept, ARGV[i])
  end
end
return kept
"""

RELEASED_IDLE_MS = 1_000_000_000
"""The idle time a released entry is given (about 11.6 days): longer than any ``min_idle_ms``."""

CLAIM_OPTION_VERSION = (8, 4)
"""The first Redis version whose XREADGROUP has the ``CLAIM min-idle-time`` option."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def keep_claims(redis: aioredis.Redis, stream: str, group: str, consumer: str, entry_ids: Sequence[str]) -> set[str]:
    """Renew this consumer's claim on ``entry_ids`` → the ids it still owns.

    Resets their idle time to 0 without raising Redis's delivery counter (XCLAIM JUSTID).
    Entries that another consumer claimed, or that were acknowledged, are left alone.
    """
    if not entry_ids:
        return set()
    kept = await redis.eval(_KEEP_LUA, 1, stream, group, consumer, 0, *entry_ids)
    return {_text(x) for x in kept}


async def release_claims(redis: aioredis.Redis, stream: str, group: str, consumer: str, entry_ids: Sequence[str]) -> set[str]:
    """Make owned entries claimable at once by any consumer (idle :data:`RELEASED_IDLE_MS`).

    Returns the ids that were still owned (and are now released).
    """
    if not entry_ids:
        return set()
    kept = await redis.eval(_KEEP_LUA, 1, stream, group, consumer, RELEASED_IDLE_MS, *entry_ids)
    return {_text(x) for x in kept}


async def count_attempt(redis: aioredis.Redis, attempts_key: str, entry_id: str, *, refund: int = 0) -> int:
    """Count one real delivery of ``entry_id`` (less ``refund`` earlier ones) → attempts so far."""
    return int(await redis.hincrby(attempts_key, entry_id, 1 - refund))


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` → ``(7, 0, 15)`` (non-numeric parts count as 0)."""
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


async def server_version(redis: aioredis.Redis) -> tuple[int, ...]:
    """The Redis server's version (INFO server → ``redis_version``)."""
    info = await redis.info("server")
    return parse_version(_text(info.get("redis_version", "0")))


def supports_claim_option(version: tuple[int, ...]) -> bool:
    """Whether XREADGROUP takes ``CLAIM min-idle-time`` on a server of this version."""
    return version[:2] >= CLAIM_OPTION_VERSION
