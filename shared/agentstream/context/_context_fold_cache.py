"""A per-worker cache of folded traces, so each next step's rebuild costs what was added.

The agent loop rebuilds a trace's context at every step. :class:`ContextCache` keeps, per
trace id, the state folded from the events read last time, with the count and the id of the
last event it holds. A trace is append-only, so when the new read still has that id at that
position, only the events after it are folded; otherwise (another worker advanced the trace
in a way this one cannot check, a different agent or settings, a trimmed stream) the state is
rebuilt from the start. A miss is slower, never wrong.

Pure: no I/O, no clock. One cache per worker process; not shared between threads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentstream.context._context_fold import ContextFold
from agentstream.context.builder import (
    BuiltContext,
    build_from_state,
    new_state,
    require_fit,
    settings_of,
    stale_hidden,
)
from agentstream.context.render import EventFilter
from agentstream.context.request import ChatRequest
from agentstream.declarations.agents import Agent


@dataclass
class _Entry:
    state: ContextFold
    last_id: str
    agent: Agent
    settings: tuple[Any, Any]


class ContextCache:
    """Folded trace states by trace id, least recently used dropped first.

    Args:
        max_traces: how many traces to keep (each holds its rendered history in memory).

    Attributes:
        hits: builds that folded only the new events.
        misses: builds that folded the trace from its first event.
    """

    def __init__(self, max_traces: int = 256) -> None:
        if max_traces < 1:
            raise ValueError(f"max_traces must be at least 1, got {max_traces}")
        self.max_traces = max_traces
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self, trace_id: str) -> None:
        """Drop a trace's state (its next build folds from the start)."""
        self._entries.pop(trace_id, None)

    def build(
        self, trace_id: str, entries: Sequence[tuple[str, Any]], agent: Agent, *, turn_id: str, step: int
    ) -> BuiltContext:
        """The context of the next model call of a trace, from its stored entries.

        Args:
            trace_id: the trace's id.
            entries: the trace's ``(entry id, event)`` pairs, oldest first, as the store read them.
            agent: the agent answering the turn.
            turn_id: the turn being answered.
            step: the step within the turn.

        Raises:
            UnrenderedEventError, ShortenError, ValueError: see
                :func:`agentstream.context.builder.build_context`.
        """
        settings = settings_of(agent)
        entry = self._entries.get(trace_id)
        state: ContextFold | None = None
        if entry is not None and self._usable(entry, entries, agent, settings):
            state = entry.state
            try:
                state.feed([event for _, event in entries[state.count :]])
            except BaseException:
                self._entries.pop(trace_id, None)
                raise
            self.hits += 1
            if stale_hidden(state, turn_id):  # a rollback came: fold again without the turn it rolls back
                config, limits = settings
                state = new_state([event for _, event in entries], agent, config, limits, turn_id=turn_id)
        else:
            self._entries.pop(trace_id, None)
            config, limits = settings
            state = new_state([event for _, event in entries], agent, config, limits, turn_id=turn_id)
            self.misses += 1
        if entries and not (settings[0].select is not None and not isinstance(settings[0].select, EventFilter)):
            self._entries[trace_id] = _Entry(state, entries[-1][0], agent, settings)
            self._entries.move_to_end(trace_id)
            while len(self._entries) > self.max_traces:
                self._entries.popitem(last=False)
        return build_from_state(state, turn_id=turn_id, step=step)

    def request(
        self, trace_id: str, entries: Sequence[tuple[str, Any]], agent: Agent, *, turn_id: str, step: int
    ) -> ChatRequest:
        """The request of the next model call (see :meth:`build`).

        Raises:
            ContextFullError: the context does not fit the model's window after every shrink.
        """
        return require_fit(self.build(trace_id, entries, agent, turn_id=turn_id, step=step), trace_id=trace_id)

    @staticmethod
    def _usable(entry: _Entry, entries: Sequence[tuple[str, Any]], agent: Agent, settings: tuple[Any, Any]) -> bool:
        count = entry.state.count
        if entry.agent is not agent or entry.settings[0] is not settings[0] or entry.settings[1] != settings[1]:
            return False
        return 0 < count <= len(entries) and entries[count - 1][0] == entry.last_id
