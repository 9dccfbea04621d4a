"""Helpers for the tests of the shared connections (agentstream.runtime.multiplex)."""

from __future__ import annotations


def count_writes(shared) -> list[int]:
    """Wrap a connected shared connection's write: the sizes of the writes it makes from now on
    (one per turn of the event loop in which commands were queued)."""
    writer = shared._writer
    sizes: list[int] = []
    original = writer.write

    def write(data):
        sizes.append(len(data))
        return original(data)

    writer.write = write
    return sizes
