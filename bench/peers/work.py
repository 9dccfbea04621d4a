"""The work every peer runs, the same bytes as ``bench/throughput.py``'s model double and tool.

A turn is two model calls: the first answers with ~2 KB of text and one call of the no-op tool
(~1 KB result), the second with a ~400-byte answer. Pure constants and helpers; no framework.
"""

from __future__ import annotations

import json
import os

_WORDS = "the agent calls tool with args result file search python context stream redis event model output".split()
THINKING = " ".join(_WORDS[i % len(_WORDS)] for i in range(300))[:2000]
RESULT = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(150))[:900]
ANSWER = " ".join(_WORDS[(i * 3) % len(_WORDS)] for i in range(60))[:400]
ARGUMENTS = json.dumps({"path": "/repo/src/module_0/file.py", "pattern": "def .*handler\\(", "max_results": 50})


def proc_cpu_s(pid: int) -> float:
    """CPU time of every thread of a process, in seconds (schedstat, in ns: finer than the clock
    ticks of /proc/<pid>/stat); 0.0 once it has exited."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total / 1e9


def children(pid: int) -> list[int]:
    """The direct children of a process (a postmaster's backends and workers)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


class CpuMeter:
    """CPU seconds of a set of processes between two reads; a postmaster counts its children,
    read again at the end (a backend that exited in between loses its share: the pools keep them)."""

    def __init__(self, pids: dict[str, int], trees: frozenset[str] = frozenset()):
        self.pids = pids
        self.trees = trees
        self.start = self._read()

    def _read(self) -> dict[str, dict[int, float]]:
        out = {}
        for name, pid in self.pids.items():
            group = [pid, *children(pid)] if name in self.trees else [pid]
            out[name] = {p: proc_cpu_s(p) for p in group}
        return out

    def used_s(self) -> dict[str, float]:
        end = self._read()
        return {name: sum(cpu - self.start[name].get(p, 0.0) for p, cpu in end[name].items()) for name in self.pids}


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))]
