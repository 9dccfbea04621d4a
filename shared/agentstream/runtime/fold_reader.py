"""Folds of traces kept current by reading only what was appended (runtime: Redis reads).

A service that looks at the same traces again and again (the agent loop at every step, the
gateway at every request about a conversation, the delegation service at every delegation call
of a parent) keeps a :class:`agentstream.steps.trace_fold.TraceFold` per trace in a
:class:`agentstream.steps.trace_fold.FoldCache` (bounded by bytes, ``AGENTSTREAM_FOLD_CACHE_BYTES``) and
reads only the entries after the fold's last id, so a look costs what was added since the last
one, not the whole trace. A trace deleted (retention) and started again under the same id has
another first entry id: its fold is dropped and the trace folded again from its first entry.
"""

from __future__ import annotations

import logging

from agentstream.runtime.store import Read, TraceStore
from agentstream.steps.trace_fold import FoldCache, TraceFold

log = logging.getLogger("agentstream.runtime.fold_reader")

__all__ = ["FoldReader"]


class FoldReader:
    """Up-to-date folds of the traces one process looks at.

    Args:
        store: the trace store.
        folds: the cache of folds (shared with the caller, who may feed folds itself).
    """

    def __init__(self, store: TraceStore, folds: FoldCache):
        self.store = store
        self.folds = folds

    async def current(self, trace_id: str) -> TraceFold:
        """The trace's fold with everything appended so far: one read of what is new (a trace
        only grows; no lease is needed to read it).

        Raises:
            SchemaVersionError, EventDecodeError: an entry cannot be read.
        """
        fold = self.folds.get(trace_id)
        read = await self.store.read_after(trace_id, fold.last_id if fold is not None else None)
        return await self.fold_with(trace_id, fold, read)

    async def fold_with(self, trace_id: str, fold: TraceFold | None, read: Read) -> TraceFold:
        """Feed ``read`` (the entries after ``fold``'s last id, or the whole trace without a fold)
        → the fold, kept in the cache; a trace started again since it was folded is folded anew."""
        if fold is not None and not fold.same_trace(read.first_id):
            log.info(
                "trace %s was deleted and started again since it was folded; folding it from its first entry", trace_id
            )
            self.folds.forget(trace_id)
            fold = None
            read = await self.store.read_after(trace_id, None)
        read = await self.store.complete(trace_id, read)
        if fold is None:
            fold = TraceFold(trace_id)
        fold.feed(read.entries, read.sizes)
        self.folds.put(fold)
        return fold
