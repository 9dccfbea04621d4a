"""Conversations on the wire (runtime: Redis commands): publishing a turn, the index of recent
conversations, reading their state and their child traces.

The agent loop notes each root turn that enters a trace in ``<ns>:conversations`` (a sorted set:
trace id → the time the turn entered, Unix ms, to within :data:`NOTE_INTERVAL_S`; capped at
:data:`KEEP` entries), so the HTTP
gateway can list what is running without scanning the keyspace. The index is a courtesy, never
the truth: a trace deleted by retention is dropped from the list when it is read.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from agentstream.runtime.lua import script
from agentstream.runtime.store import TraceStore
from agentstream.steps.timeline import ConversationFilter, ConversationState, conversation_state
from agentstream.wire import codec
from agentstream.wire.events import Event, TurnMessage
from agentstream.wire.keys import TURN_FIELD

KEEP = 10_000
"""The most conversations the index keeps (the oldest are dropped)."""

NOTE_INTERVAL_S = 1.0
"""The agent loop notes a conversation in the index at most this often per process, in seconds
(a conversation's time in the index may lag its newest turn by this much)."""

TAIL_EVENTS = 200
"""How many of a trace's newest events are read to tell its state (more when the newest turn started earlier)."""


async def publish_turn(store: TraceStore, turn: TurnMessage) -> str:
    """Publish a (validated) turn on its trace's partition of the turns stream, as any backend
    does → its entry id."""
    entry_id = await store.redis.xadd(store.keys.turns_for(turn.trace_id), {TURN_FIELD: codec.encode(turn)})
    return _s(entry_id)


async def nearest_trace(store: TraceStore, trace_ids: Sequence[str]) -> str | None:
    """The first of ``trace_ids`` that exists, or None: one pipeline of EXISTS (no transaction:
    the traces are in different hash slots)."""
    if not trace_ids:
        return None
    pipe = store.redis.pipeline(transaction=False)
    for trace_id in trace_ids:
        pipe.exists(store.keys.trace(trace_id))
    found = await pipe.execute()
    return next((t for t, n in zip(trace_ids, found, strict=True) if n), None)


async def children(store: TraceStore, trace_id: str, root_trace_id: str) -> list[str]:
    """The child traces opened directly by calls of ``trace_id`` (ids ``<trace id>/<call id>``), sorted."""
    members = await store.redis.smembers(store.keys.descendants(root_trace_id))
    prefix = trace_id + "/"
    ids = (_s(m) for m in members)
    return sorted(c for c in ids if c.startswith(prefix) and "/" not in c[len(prefix) :])


_NOTE_LUA = script("note_conversation")  # agentstream/runtime/lua/note_conversation.lua


async def note_turn(store: TraceStore, trace_id: str, *, at_ms: int | None = None, keep: int = KEEP) -> None:
    """Record that a root turn of ``trace_id`` entered now (or at ``at_ms``, Unix ms): one command."""
    at_ms = int(time.time() * 1000) if at_ms is None else at_ms
    await store.redis.register_script(_NOTE_LUA)(keys=[store.keys.conversations], args=[at_ms, trace_id, keep])


async def recent_ids(
    store: TraceStore, *, limit: int, before_ms: int | None = None, after_ms: int | None = None
) -> list[tuple[str, int]]:
    """The newest conversations ``[(trace id, newest turn's time in Unix ms)]``, newest first.

    Args:
        limit: how many.
        before_ms: only conversations whose newest turn entered before this time (paging).
        after_ms: only conversations whose newest turn entered at or after this time.
    """
    high = f"({before_ms}" if before_ms is not None else "+inf"
    low = str(after_ms) if after_ms is not None else "-inf"
    raw = await store.redis.zrevrangebyscore(store.keys.conversations, high, low, start=0, num=limit, withscores=True)
    return [(_s(member), int(score)) for member, score in raw]


SCAN_MAX = 2000
"""The most index entries one :func:`find` reads before it answers with what it found."""


async def find(
    store: TraceStore,
    *,
    limit: int,
    keep: Callable[[ConversationState], Awaitable[bool]],
    where: ConversationFilter | None = None,
    before_ms: int | None = None,
    after_ms: int | None = None,
    scan_max: int = SCAN_MAX,
) -> tuple[list[ConversationState], int | None]:
    """The newest conversations that match ``where`` and that ``keep`` keeps, newest first.

    Reads the index a batch at a time from ``before_ms`` down to ``after_ms`` until ``limit``
    match, the index ends, or ``scan_max`` entries were read (a rare filter over a large index
    answers a short page then, with the place to go on from).

    Returns:
        ``(states, next_before_ms)``: at most ``limit`` states, and the ``before_ms`` of the next
        (older) page, or None when the range holds no more.
    """
    out: list[ConversationState] = []
    cursor = before_ms
    scanned = 0
    batch = min(max(limit * 2, 50), scan_max)
    while scanned < scan_max:
        ids = await recent_ids(store, limit=batch, before_ms=cursor, after_ms=after_ms)
        if not ids:
            return out, None
        found = await states(store, [t for t, _ in ids])
        for trace_id, score in ids:
            scanned += 1
            cursor = score
            state = found.get(trace_id)
            if state is not None and (where is None or where.matches(state)) and await keep(state):
                out.append(state)
                if len(out) == limit:
                    return out, score
        if len(ids) < batch:
            return out, None
    return out, cursor


async def tail(store: TraceStore, trace_id: str, *, count: int = TAIL_EVENTS) -> list[tuple[str, Event]]:
    """The newest ``count`` events of a trace ``[(entry id, event)]``, oldest first.

    Raises:
        SchemaVersionError, EventDecodeError: an entry cannot be read.
    """
    entries = await store.redis.xrevrange(store.keys.trace(trace_id), count=count)
    return codec.decode_entries(reversed(entries), trace_id=trace_id)


async def states(store: TraceStore, trace_ids: Sequence[str]) -> dict[str, ConversationState]:
    """The state of each trace's newest turn (traces that no longer exist are left out).

    Each trace's tail is read first (one pipeline for all); a trace whose newest turn started
    before its tail is read whole.
    """
    pipe = store.redis.pipeline(transaction=False)
    for trace_id in trace_ids:
        pipe.xrevrange(store.keys.trace(trace_id), count=TAIL_EVENTS)
    replies = await pipe.execute()
    out: dict[str, ConversationState] = {}
    for trace_id, entries in zip(trace_ids, replies, strict=True):
        if not entries:
            continue
        events = codec.decode_entries(reversed(entries), trace_id=trace_id)
        state = conversation_state(trace_id, events)
        if state is None and len(entries) >= TAIL_EVENTS:
            state = conversation_state(trace_id, await store.read(trace_id))
        if state is not None:
            out[trace_id] = state
    return out


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
