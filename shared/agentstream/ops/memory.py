"""The process's memory limit, and the default bound of a service's caches that follows from it.

A container's memory limit is its cgroup's: ``memory.max`` under cgroup v2 (``max`` when there is
none), ``memory/memory.limit_in_bytes`` under cgroup v1 (a number near 2**63 when there is none).
:func:`cache_bytes_for_limit` turns the limit into the default bound of the caches a service keeps
(the folds of the traces it works on): :data:`CACHE_SHARE` of the limit, so the caches together
with the interpreter, the libraries and the work in flight stay under it, or
:data:`CACHE_BYTES_WITHOUT_LIMIT` when the process has no limit. The caches count what their
contents really cost in memory (:class:`agentstream.steps.trace_fold.FoldCache`), so the share holds.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CACHE_BYTES_WITHOUT_LIMIT",
    "CACHE_SHARE",
    "CGROUP_ROOT",
    "cache_bytes_for_limit",
    "PROCESS_LIMIT_BYTES",
    "default_cache_bytes",
    "memory_limit_bytes",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
CACHE_SHARE = 0.25  # of the memory limit: the agent loop's 512 Mi in the chart → 128 MiB of folds
CACHE_BYTES_WITHOUT_LIMIT = 256 * 1024 * 1024  # no limit: what a laptop or a small VM can spare
NO_LIMIT_ABOVE = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def memory_limit_bytes(root: Path | None = None) -> int | None:
    """The memory limit of this process's cgroup → bytes, or None when it has none (or none can
    be read: not Linux, no cgroup filesystem).

    Reads cgroup v2's ``<root>/memory.max``, then cgroup v1's
    ``<root>/memory/memory.limit_in_bytes``.

    Args:
        root: where the cgroup filesystem is mounted (a container sees its own cgroup there);
            None: :data:`CGROUP_ROOT`.

    Raises:
        ValueError: a limit file holds something other than a number or ``max`` (named in the message).
    """
    root = CGROUP_ROOT if root is None else root
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            limit = int(text)
        except ValueError:
            raise ValueError(f"{path} holds {text[:40]!r}, not a number of bytes or 'max'") from None
        return None if limit >= NO_LIMIT_ABOVE or limit <= 0 else limit
    return None


def cache_bytes_for_limit(limit_bytes: int | None) -> int:
    """The default bound, in bytes, of a service's caches for a process memory limit in bytes
    (None: no limit) → :data:`CACHE_SHARE` of the limit, or :data:`CACHE_BYTES_WITHOUT_LIMIT`.

    Raises:
        ValueError: ``limit_bytes`` is not positive.
    """
    if limit_bytes is None:
        return CACHE_BYTES_WITHOUT_LIMIT
    if limit_bytes <= 0:
        raise ValueError(f"a memory limit must be positive, got {limit_bytes} bytes")
    return int(limit_bytes * CACHE_SHARE)


def default_cache_bytes(root: Path | None = None) -> int:
    """The default bound of a service's caches (:func:`cache_bytes_for_limit` of the limit), in
    bytes: of this process's limit as read when this module was imported
    (:data:`PROCESS_LIMIT_BYTES`; a service builds its caches inside its event loop, where a file
    read would block it), or of the cgroup at ``root`` when given.

    Raises:
        ValueError: see :func:`memory_limit_bytes`.
    """
    return cache_bytes_for_limit(PROCESS_LIMIT_BYTES if root is None else memory_limit_bytes(root))


try:
    PROCESS_LIMIT_BYTES: int | None = memory_limit_bytes()
    """This process's memory limit in bytes, read once at import (None: none)."""
except ValueError:
    PROCESS_LIMIT_BYTES = None  # a cgroup file not understood: as without a limit (256 MiB)
