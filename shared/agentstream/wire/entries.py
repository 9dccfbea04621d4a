"""A stream entry's fields as Redis stored them, including a field given more than once.

Redis keeps every field/value pair an ``XADD`` names, in order, so
``XADD agentstream:turns * trace_id t1 turn '{...}' turn '{...}'`` stores two ``turn`` fields.
A mapping of field → value (what redis-py makes of an entry) keeps only the last, so a reader
would silently act on one of two payloads while another reader (in another language) acts on
the first. The services refuse such an entry instead, naming the field and how often it was
given.

The runtime (:mod:`agentstream.runtime.entries`) reads stream entries into a plain ``dict``
when no field repeats, and into an :class:`EntryFields` (a ``dict`` too, last value per field,
so every reader works unchanged) that also holds every pair when one does. Pure: no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["EntryFields", "doubled_fields", "doubled_refusal"]


class EntryFields(dict[bytes, bytes]):
    """The fields of a stream entry that names a field more than once.

    As a mapping it holds the last value of each field (redis-py's reading); :attr:`pairs` holds
    every ``(field, value)`` pair in the order stored, :attr:`doubled` each repeated field and
    how many times it was given.
    """

    __slots__ = ("pairs", "doubled")

    def __init__(self, pairs: Sequence[tuple[bytes, bytes]]):
        super().__init__(pairs)
        self.pairs: tuple[tuple[bytes, bytes], ...] = tuple(pairs)
        counts: dict[bytes, int] = {}
        for name, _ in self.pairs:
            counts[name] = counts.get(name, 0) + 1
        self.doubled: dict[bytes, int] = {name: n for name, n in counts.items() if n > 1}

    @classmethod
    def from_flat(cls, flat: Sequence[bytes]) -> EntryFields:
        """``[f1, v1, f2, v2, ...]`` (the reply of XRANGE, XREADGROUP...) → the entry's fields."""
        it = iter(flat)
        return cls(list(zip(it, it, strict=True)))

    def values_of(self, name: bytes) -> list[bytes]:
        """Every value given for ``name``, in the order stored."""
        return [value for field, value in self.pairs if field == name]


def doubled_fields(fields: Mapping[bytes, bytes]) -> dict[bytes, int]:
    """The fields an entry gives more than once → how many times each (empty: none repeats)."""
    return getattr(fields, "doubled", None) or {}


def doubled_refusal(fields: Mapping[bytes, bytes]) -> str | None:
    """Why an entry that repeats a field is refused (``"field 'turn' given 2 times"``, every
    repeated field named in the order stored), or None when no field repeats."""
    doubled = doubled_fields(fields)
    if not doubled:
        return None
    said = "; ".join(f"field {name.decode(errors='replace')!r} given {n} times" for name, n in doubled.items())
    return (
        f"{said} (an entry names each field once: Redis keeps every pair, readers disagree on which one counts, "
        "so the entry is not read)"
    )
