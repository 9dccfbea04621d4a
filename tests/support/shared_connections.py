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


BUSY_LUA = (
    "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
    "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > tonumber(ARGV[1]) return ARGV[2]"
)
"""A script that keeps its Redis server busy ``ARGV[1]`` microseconds, then returns ``ARGV[2]``
(``EVAL BUSY_LUA <numkeys> <keys...> <µs> <reply>``): a reply that comes late."""
