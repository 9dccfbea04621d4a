"""Publish order of a conversation's turns, with any number of agent-loop processes (issue 36).

Every turn of a conversation goes to one partition of a turns stream (:mod:`agentstream.wire.keys`),
whose entries are in publish order; the agent loops of a consumer group read it, each a few entries
at a time. Two turns published back to back may be read by two processes, whose admissions then run
in any order. So before a process admits turn entry ``B`` of trace ``T``, it looks at the entries of
the same stream before ``B`` that its group has delivered and not acknowledged (the only ones that
may still be unadmitted: an acknowledged entry was handled, and entries are delivered in stream
order, so every entry before ``B`` was delivered before it) and admits the earlier turns of ``T``
first. Admission is idempotent by turn id, so the process that read such an entry finds its turn
admitted when its own handler runs.

The functions here decide, from what was read: which byte strings a payload naming ``T`` must hold
(:func:`trace_marks`, a cheap filter Redis applies before anything is sent back) and which of the
entries read must enter before ``B``, in which order (:func:`earlier_turns`). None reads Redis
(``tests/unit/test_turn_order.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import msgspec

__all__ = ["Earlier", "earlier_turns", "entry_order", "may_name", "trace_marks"]


class _Named(Protocol):
    """What a checked turn says of itself: its trace and turn ids."""

    @property
    def trace_id(self) -> str: ...

    @property
    def turn_id(self) -> str: ...


T = TypeVar("T", bound=_Named)

_ESCAPES = (b"\\u", b"\\/")
"""JSON escapes by which a payload may spell a character of a trace id other than as its
canonical JSON text does: ``\\uXXXX`` (any character) and ``\\/``. The other escapes
(``\\"``, ``\\\\``, ``\\b``...) are the canonical spelling of their character."""


def trace_marks(trace_id: str) -> tuple[bytes, ...]:
    """The byte strings one of which every JSON payload naming ``trace_id`` contains.

    The trace id's text as canonical JSON writes it inside its quotes (UTF-8, ``"`` and ``\\``
    escaped), or an escape that could spell one of its characters otherwise (``\\u``, ``\\/``).
    A payload holding none of them cannot decode to a message whose ``trace_id`` is ``trace_id``;
    one holding one may (it is then decoded and checked).

    Returns:
        A tuple of non-empty byte strings, the trace id's own first.
    """
    own = msgspec.json.encode(trace_id)[1:-1]
    return (own, *_ESCAPES) if own else _ESCAPES


def may_name(payload: bytes, marks: Iterable[bytes]) -> bool:
    """Whether ``payload`` holds one of ``marks`` (:func:`trace_marks`): False means it cannot
    name the trace."""
    return any(mark in payload for mark in marks)


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a key that sorts as Redis orders entries.

    Raises:
        ValueError: ``entry_id`` is not of that form.
    """
    ms, _, seq = entry_id.partition("-")
    if not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream entry id: {entry_id!r} (expected <ms>-<seq>)")
    return int(ms), int(seq)


@dataclass(frozen=True)
class Earlier(Generic[T]):
    """An entry whose turn must enter the trace before the entry in hand.

    Attributes:
        entry_id: its id in the stream.
        turn: the checked turn it carries (what the ``check`` of :func:`earlier_turns` returned).
    """

    entry_id: str
    turn: T


def earlier_turns(
    trace_id: str,
    entry_id: str,
    read: Iterable[tuple[str, Mapping[bytes, bytes]]],
    *,
    field: bytes,
    settled: Container[str],
    check: Callable[[str, Mapping[bytes, bytes]], T | None],
) -> list[Earlier[T]]:
    """The turns of ``trace_id`` that must enter it before entry ``entry_id`` of the same stream.

    Args:
        trace_id: the trace of the turn in hand.
        entry_id: the stream entry in hand (``<ms>-<seq>``).
        read: ``(entry id, fields)`` of entries of the stream read before admitting it (delivered
            and not acknowledged), in any order, any of them possibly not a turn at all.
        field: the field that holds a turn's payload.
        settled: ids of entries whose admission was already decided (by this process): never
            again.
        check: the wire's and the agent's rules for one entry ``(entry id, fields)`` → its
            checked turn, or None when it is refused (malformed, another backend's, an unknown
            agent...): a refused entry is left to its own handler, which refuses it, and orders
            nothing.

    Returns:
        The entries that come before ``entry_id``, whose turn names ``trace_id`` and passes
        ``check``, in stream order; of several entries bringing one turn id, the first (the
        later ones are its copies, whose own handlers absorb them). Entries whose payload cannot
        name the trace (:func:`may_name`) are never checked.
    """
    before = entry_order(entry_id)
    marks = trace_marks(trace_id)
    candidates: dict[str, tuple[tuple[int, int], Mapping[bytes, bytes]]] = {}  # one per entry id
    for other_id, fields in read:
        try:
            order = entry_order(other_id)
        except ValueError:
            continue
        payload = fields.get(field)
        if order >= before or other_id in settled or payload is None or not may_name(payload, marks):
            continue
        candidates[other_id] = (order, fields)
    out: list[Earlier[T]] = []
    seen: set[str] = set()
    for other_id, (_, fields) in sorted(candidates.items(), key=lambda c: c[1][0]):
        turn = check(other_id, fields)
        if turn is None or turn.trace_id != trace_id or turn.turn_id in seen:
            continue
        seen.add(turn.turn_id)
        out.append(Earlier(other_id, turn))
    return out
