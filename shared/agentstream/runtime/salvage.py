"""Reading what can be read of a damaged trace (for the paths that end a turn with a reason).

A trace entry that cannot be decoded (written by hand, by a newer schema, or cut) makes
:meth:`agentstream.runtime.store.TraceStore.read` raise, so every step of that trace fails and its hints
end on the dead-letter stream. The dead-letter hooks must still end the turn with a reason and
publish its reply, without failing again on the same entry: they read the trace here, where an
unreadable entry is skipped (and logged) instead of raised.
"""

from __future__ import annotations

import logging

from agentstream.errors import TraceError
from agentstream.runtime.store import TraceStore
from agentstream.wire import codec
from agentstream.wire.events import Event, UnknownEvent

log = logging.getLogger("agentstream.runtime.salvage")


async def readable_events(store: TraceStore, trace_id: str) -> list[Event | UnknownEvent]:
    """The trace's events that can be decoded, in order; unreadable entries are skipped.

    Tries the normal read first (one bulk decode); only a trace with a bad entry is read entry
    by entry.
    """
    try:
        return [event for _, event in await store.read(trace_id)]
    except TraceError:
        pass
    events: list[Event | UnknownEvent] = []
    skipped = []
    for raw_id, fields in await store.redis.xrange(store.keys.trace(trace_id)):
        entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
        try:
            events.append(codec.decode_entry(fields, trace_id=trace_id, entry_id=entry_id))
        except (TraceError, RecursionError, ValueError):
            skipped.append(entry_id)
    log.warning(
        "trace %s has %d unreadable entries (%s); read without them", trace_id, len(skipped), ", ".join(skipped[:5])
    )
    return events
