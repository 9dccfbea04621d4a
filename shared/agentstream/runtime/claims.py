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
- :func:`delete_idle_consumers` removes consumers that are idle and own nothing (the names of
  dead or rescaled pods), atomically with the check.
- The attempt counter (:func:`count_attempt`) is agentstream's own: a hash per stream and group,
  ``entry id → handler starts``, raised just before a handler starts (so a process killed in the
  handler still counts) and deleted on acknowledgement. Only real deliveries raise it.

Redis references: XCLAIM (JUSTID, IDLE), XPENDING, XREADGROUP's CLAIM option (Redis ≥ 8.4):
https://redis.io/docs/latest/commands/xclaim/, https://redis.io/docs/latest/commands/xreadgroup/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from agentstream.runtime.lua import script

_KEEP_LUA = script("keep_claims")  # agentstream/runtime/lua/keep_claims.lua

_PRUNE_LUA = script("prune_consumers")  # agentstream/runtime/lua/prune_consumers.lua

RELEASED_IDLE_MS = 1_000_000_000
"""The idle time a released entry is given (about 11.6 days): longer than any ``min_idle_ms``."""

CLAIM_OPTION_VERSION = (8, 4)
"""The first Redis version whose XREADGROUP has the ``CLAIM min-idle-time`` option."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def keep_claims(
    redis: aioredis.Redis, stream: str, group: str, consumer: str, entry_ids: Sequence[str]
) -> set[str]:
    """Renew this consumer's claim on ``entry_ids`` → the ids it still owns.

    Resets their idle time to 0 without raising Redis's delivery counter (XCLAIM JUSTID).
    Entries that another consumer claimed, or that were acknowledged, are left alone.
    """
    if not entry_ids:
        return set()
    kept = await redis.eval(_KEEP_LUA, 1, stream, group, consumer, 0, *entry_ids)
    return {_text(x) for x in kept}


async def release_claims(
    redis: aioredis.Redis, stream: str, group: str, consumer: str, entry_ids: Sequence[str]
) -> set[str]:
    """Make owned entries claimable at once by any consumer (idle :data:`RELEASED_IDLE_MS`).

    Returns the ids that were still owned (and are now released).
    """
    if not entry_ids:
        return set()
    kept = await redis.eval(_KEEP_LUA, 1, stream, group, consumer, RELEASED_IDLE_MS, *entry_ids)
    return {_text(x) for x in kept}


_COUNT_LUA = script("count_attempts")  # agentstream/runtime/lua/count_attempts.lua

_START_LUA = script("start_attempt")  # agentstream/runtime/lua/start_attempt.lua


async def count_attempt(redis: aioredis.Redis, attempts_key: str, entry_id: str, *, refund: int = 0) -> int:
    """Count one real delivery of ``entry_id`` (less ``refund`` earlier ones) → attempts so far.

    An entry without a count has started once (its first start, right after it was read new, is
    not written down): see :func:`start_attempt`.
    """
    return int(await redis.eval(_COUNT_LUA, 1, attempts_key, entry_id, 1 - refund))


async def set_attempts(redis: aioredis.Redis, attempts_key: str, counts: dict[str, int]) -> None:
    """Write the starts of entries given back (an entry read but never started has 0)."""
    if counts:
        # redis-py types the mapping's keys as its own union, and a Mapping's keys are invariant
        await redis.hset(attempts_key, mapping=cast("Mapping[FieldT, EncodableT]", counts))


async def start_attempt(
    redis: aioredis.Redis, stream: str, attempts_key: str, group: str, consumer: str, entry_id: str, *, refund: int = 0
) -> int:
    """Just before a handler starts: confirm this consumer still owns ``entry_id`` (renewing its
    claim) and count the start, in one script → the starts so far, or 0 when another consumer
    claimed the entry meanwhile (or it was acknowledged): then nothing is counted.

    ``attempts_key`` must share ``stream``'s hash slot (:func:`agentstream.wire.keys.attempts_key` does).
    """
    return int(await redis.eval(_START_LUA, 2, stream, attempts_key, group, consumer, entry_id, refund))


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


async def delete_idle_consumers(
    redis: aioredis.Redis, stream: str, group: str, *, idle_ms: int, keep: str = ""
) -> list[str]:
    """Delete the consumers of ``group`` idle at least ``idle_ms`` that own no pending entries
    (XINFO CONSUMERS, then XGROUP DELCONSUMER, in one script) → their names.

    A consumer that owns entries is never deleted (DELCONSUMER would drop its pending entries);
    ``keep`` (the caller's own name) is never deleted either. Idle is Redis's ``idle`` field: the
    time since the consumer last read or claimed.
    """
    deleted = await redis.eval(_PRUNE_LUA, 1, stream, group, idle_ms, keep)
    return [_text(name) for name in deleted]
