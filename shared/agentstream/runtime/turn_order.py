"""The read behind the publish order of a conversation's turns across agent-loop processes
(:mod:`agentstream.steps.turn_order` decides from it).

One script on the turns stream's own slot (lua/earlier_turns.lua): the entries before the one in
hand that the group delivered and has not acknowledged, whose turn may name the trace. It never
touches a trace's keys, so it runs on a Redis Cluster where the stream and the trace sit in other
slots. Cost: one round trip per admission when no more than :data:`PAGE` entries are pending
before the one in hand (entries in flight across the group's consumers); a page more per
:data:`PAGE` pending entries, up to :data:`MOST_PENDING`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from agentstream.runtime.entries import entry_fields
from agentstream.runtime.lua import script

__all__ = ["MOST_PENDING", "PAGE", "EarlierTurns", "Pending"]

_EARLIER_LUA = script("earlier_turns")  # agentstream/runtime/lua/earlier_turns.lua

PAGE = 256
"""Pending entries one round trip looks at (XPENDING's COUNT)."""

MOST_PENDING = 4096
"""Pending entries an admission looks at in all, at most; beyond them it goes on unordered (and
says so: :attr:`Pending.whole` is False)."""


@dataclass(frozen=True)
class Pending:
    """What :meth:`EarlierTurns.read` found.

    Attributes:
        entries: ``(entry id, fields)`` of the pending entries before the one in hand whose turn
            field holds one of the marks, oldest first (fields as :func:`entry_fields` reads them:
            a field given twice shows).
        whole: every pending entry before the one in hand was looked at (False: more than
            ``most`` were pending).
        trips: the round trips it took.
    """

    entries: list[tuple[str, dict]]
    whole: bool
    trips: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class EarlierTurns:
    """Reads a turns stream's pending entries before an entry (one registered script)."""

    def __init__(self, redis: Redis):
        self._script = redis.register_script(_EARLIER_LUA)

    async def read(
        self,
        stream: str,
        group: str,
        entry_id: str,
        marks: Sequence[bytes],
        *,
        field: bytes,
        page: int = PAGE,
        most: int = MOST_PENDING,
    ) -> Pending:
        """The entries of ``stream`` before ``entry_id`` that ``group`` delivered and has not
        acknowledged, whose ``field`` holds one of ``marks``.

        Args:
            stream: the turns stream (one partition's).
            group: the consumer group that reads it.
            entry_id: the entry in hand (``<ms>-<seq>``), itself pending.
            marks: non-empty byte strings (:func:`agentstream.steps.turn_order.trace_marks`).
            field: the field that holds a turn's payload.
            page: pending entries looked at per round trip (at least 2).
            most: pending entries looked at in all.

        Raises:
            redis.exceptions.ResponseError: the group does not exist (NOGROUP).
        """
        if page < 2:
            raise ValueError(f"page must be at least 2, got {page!r}")
        start = "-"
        found: dict[str, dict] = {}
        looked = trips = 0
        while True:
            raw = await self._script(keys=[stream], args=[group, entry_id, start, page, field, *marks])
            trips += 1
            for entry in raw[1]:
                found.setdefault(_text(entry[0]), entry_fields(entry[1]))
            looked += page
            start = _text(raw[0])
            if not start:
                return Pending(list(found.items()), True, trips)
            if looked >= most:
                return Pending(list(found.items()), False, trips)
