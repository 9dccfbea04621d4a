"""The garbage collector of a service process, tuned for what a service keeps in memory.

A service keeps long-lived objects (the loaded app, its libraries, folded traces) and allocates
many short-lived ones per step. With CPython's default thresholds (700, 10, 10) the cyclic
collector ran about every 700 allocations and took a quarter of the agent loop's CPU under
load (measured with ``gc.callbacks`` in ``bench/throughput.py``'s 64-conversation run: ~260 µs
a step; ~26 µs with :func:`tune_for_service`). Only collection timing changes: reference
counting still frees acyclic garbage at once, and cycles are still collected.

Reference: https://docs.python.org/3/library/gc.html (``freeze``, ``set_threshold``).
"""

from __future__ import annotations

import gc

SERVICE_THRESHOLDS = (10_000, 10, 10)
"""The collector's thresholds in a service process (allocations before a young collection,
then young collections per middle one, middle ones per old one; CPython's default is
``(700, 10, 10)``)."""


def tune_for_service(thresholds: tuple[int, int, int] = SERVICE_THRESHOLDS) -> None:
    """Set the collector of a service process once it has started (the app loaded, the
    services built): what exists now moves to the permanent generation (``gc.freeze``: never
    scanned again), and the thresholds become ``thresholds``."""
    gc.collect()  # what the start left as garbage goes first, not into the permanent generation
    gc.freeze()
    gc.set_threshold(*thresholds)
