"""Following one turn for a person: its steps from the trace, its tokens as the model writes them.

Used by ``agentstream ask`` and ``agentstream run``. One blocking read follows the trace and
its delta stream together (:func:`agentstream.runtime.deltas.follow`); the reply's text is printed as it
arrives, each step's summary line when its event is in the trace. When an attempt fails and is
retried, a line says so and the partial text printed above it no longer counts: the next
attempt starts over (the record is the trace's ModelOutput, never the printed tokens).
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Callable
from typing import Any

from agentstream.runtime.connection import RedisClient
from agentstream.runtime.deltas import Dropped, PartialReplies, follow, last_entry_id
from agentstream.wire.events import Event, TurnEnded, TurnFailed
from agentstream.wire.keys import Keys

TOKEN_PREFIX = "  ▸ "
"""Starts the line on which a reply's text is printed as it arrives."""

REASONING_PREFIX = "  ⋯ "
"""Starts the line on which reasoning text is printed as it arrives."""


_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``,
    ``\\u202e``): C0 and C1 control characters (ESC, so CSI and OSC sequences that would move the
    cursor, recolour or retitle the terminal; BEL, NUL, DEL) and the Unicode bidirectional
    controls (a reordered line, as in "Trojan Source", CVE-2021-42574). Newlines and tabs stay.
    What a client published is shown, never run by the reader's terminal."""
    if text.isprintable() and not _BIDI_CONTROLS.intersection(text):
        return text
    out = []
    for char in text:
        if char in "\n\t" or (unicodedata.category(char) != "Cc" and char not in _BIDI_CONTROLS):
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
    return "".join(out)


class TurnPrinter:
    """Prints the events and token deltas of one turn through ``echo`` (``typer.echo``-like),
    every text made :func:`terminal_safe` (the turn's text and the model's output are a client's
    and a model's, not the CLI's)."""

    def __init__(self, turn_id: str, echo: Callable[..., Any], describe: Callable[[Event], str]):
        self.turn_id = turn_id
        self.echo = lambda text="", **options: echo(terminal_safe(str(text)), **options)
        self.describe = describe
        self.partials = PartialReplies()
        self._line: str | None = None  # the kind of the open token line, if one is open

    def _close_line(self) -> None:
        if self._line is not None:
            self.echo("")
            self._line = None

    def _write(self, kind: str, text: str) -> None:
        if self._line != kind:
            self._close_line()
            self.echo(TOKEN_PREFIX if kind == "text" else REASONING_PREFIX, nl=False)
            self._line = kind
        self.echo(text.replace("\n", "\n    "), nl=False)

    def on_delta(self, delta: Any) -> None:
        """Print a delta of this turn (other turns' deltas are ignored)."""
        if delta.turn_id != self.turn_id:
            return
        changed = self.partials.feed(delta)
        if changed is None:
            return
        if isinstance(changed, Dropped):
            self._close_line()
            self.echo(
                f"  ↺ attempt {changed.attempt} of model call {changed.step} failed ({changed.reason}); "
                "its partial output above is dropped, retrying"
            )
            return
        if delta.kind in ("text", "reasoning") and delta.text:
            self._write(delta.kind, delta.text)
        elif delta.kind == "end":
            self._close_line()

    def on_event(self, event: Event) -> bool:
        """Print an event of this turn → True when the turn has ended."""
        if getattr(event, "turn_id", None) != self.turn_id:
            return False
        self._close_line()
        self.echo(self.describe(event))
        return isinstance(event, (TurnEnded, TurnFailed))


async def watch_turn(
    redis: RedisClient,
    keys: Keys,
    trace_id: str,
    turn_id: str,
    *,
    after: str,
    deltas_after: str | None = None,
    stop: asyncio.Event | None = None,
    echo: Callable[..., Any],
    describe: Callable[[Event], str],
    block_ms: int = 500,
    outage_s: float = 0.0,
) -> TurnEnded | TurnFailed | None:
    """Print a turn's steps and tokens until it ends → its ending (None when ``stop`` was set).

    Args:
        after: the trace entry id to follow from (the trace's last id before the turn was published).
        deltas_after: the delta stream id to follow from (default: its newest entry now).
        outage_s: how long Redis may stay unreachable (a restart) while the turn is followed;
            the follow is retried with backoff meanwhile (see :func:`agentstream.runtime.deltas.follow`).
    """
    printer = TurnPrinter(turn_id, echo, describe)
    if deltas_after is None:
        deltas_after = await last_entry_id(redis, keys.deltas(trace_id))
    async for item in follow(
        redis, keys, trace_id, after=after, deltas_after=deltas_after, block_ms=block_ms, stop=stop, outage_s=outage_s
    ):
        if item.delta is not None:
            printer.on_delta(item.delta)
        elif item.event is not None and printer.on_event(item.event):
            return item.event  # type: ignore[return-value]
    printer._close_line()
    return None
