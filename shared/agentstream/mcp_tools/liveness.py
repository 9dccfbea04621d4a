"""When an unanswered probe means an MCP server is dead (pure: no I/O, no clock of its own).

Many servers answer one request at a time: while one runs a call (or writes a flood of stderr
the worker reads at its own pace), the probe's ``tools/list`` waits behind it. A probe
unanswered for its own timeout is taken as death only when no call is in flight; with calls in
flight, the server is given the longest a call of it may run on top (the calls' own timeouts
cancel them), so a busy server keeps its session and its calls, and a hung one is still found.
"""

from __future__ import annotations


def probe_overdue(*, waited_s: float, answer_within_s: float, calls_in_flight: int, longest_call_s: float) -> bool:
    """Whether a probe unanswered after ``waited_s`` seconds means the server is dead.

    Args:
        waited_s: seconds since the probe was sent (>= 0).
        answer_within_s: how long an idle server may take to answer it, in seconds (> 0).
        calls_in_flight: calls of this session not answered yet (>= 0).
        longest_call_s: the longest timeout of a call of this server, in seconds (>= 0).

    Raises:
        ValueError: a negative duration or count, or ``answer_within_s`` not positive.
    """
    if waited_s < 0 or longest_call_s < 0 or calls_in_flight < 0 or answer_within_s <= 0:
        raise ValueError(
            f"probe_overdue: waited_s={waited_s!r}, answer_within_s={answer_within_s!r}, "
            f"calls_in_flight={calls_in_flight!r}, longest_call_s={longest_call_s!r}: durations and counts "
            "must not be negative, answer_within_s must be positive"
        )
    limit = answer_within_s + (longest_call_s if calls_in_flight else 0.0)
    return waited_s >= limit
