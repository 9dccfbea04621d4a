"""What an object graph really costs in memory: the bytes a cache counts for what it keeps.

A fold's stored event bytes say little about its memory: decoded events, per-turn records and
the context folds (rendered messages, indexes) cost 4-11 times those bytes, depending on the
events' shape. :func:`deep_size_bytes` walks the objects reachable from a root and adds up what
each takes (``sys.getsizeof``), each object once, without walking into what the root shares with
the rest of the process (classes, modules, functions, and the instances of the ``shared`` types,
such as agents and their settings, which a dropped fold does not free).

Pure: no Redis, no asyncio, no clock.
"""

from __future__ import annotations

import gc
import sys
import types

__all__ = ["deep_size_bytes"]

_NOT_OWNED: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
)


def deep_size_bytes(root: object, shared: tuple[type, ...] = ()) -> int:
    """The bytes of the objects reachable from ``root`` that it owns → an int, in bytes.

    Each object is counted once (``sys.getsizeof``, which includes the garbage collector's
    header); classes, modules, functions and instances of ``shared`` are neither counted nor
    walked into. The walk is iterative (no recursion limit) and costs time linear in the graph.

    Args:
        root: the object whose graph is measured.
        shared: types whose instances the root references but does not own.
    """
    skip = _NOT_OWNED + shared
    seen: set[int] = set()
    stack: list[object] = [root]
    total = 0
    while stack:
        obj = stack.pop()
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        if isinstance(obj, skip):
            continue
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total
