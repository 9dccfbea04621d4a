"""Sticky wake-ups: where a conversation's wake-up goes, and when its owner counts as gone (pure).

An agent-loop process keeps the fold of every conversation it serves (what the next step needs,
:class:`agentstream.steps.trace_fold.FoldCache`); a step taken by another process reads and folds
what this one already holds. So a tool job names the agent-loop consumer that published it, its
*owner* (:attr:`agentstream.wire.events.ToolJob.wake_to`), and the wake-up of its result goes to
that owner's own wake-up stream of the trace's partition while the owner is alive, else to the
partition's shared wake-up stream, which every agent loop reads. A wake-up is a hint, never
state: sent to the other stream it costs a fold, never a step.

The rules, decided here and carried out by one Lua script each on the partition's hash slot
(``agentstream/runtime/lua/``: ``route_wake``, ``beat_wake_owner``, ``hand_over_wakes``):

- **Which stream** (:func:`route`): the owner's when the owner's name has the allowed shape
  (:func:`agentstream.wire.keys.owner_problem`) and the partition's owners set holds it with an
  expiry after now (Redis's clock, Unix ms); otherwise the shared one. A name nobody registered
  (a job forged with any owner) therefore only ever reaches the shared stream.
- **Liveness** (:func:`liveness`): each owner refreshes its expiry every ``beat_ms`` to now +
  ``ttl_ms``; ``ttl_ms`` is the shorter of the claim idle time and the trace lease, so a dead
  owner's wake-ups wait no longer than a dead consumer's pending entries or lease would.
- **Who is stale** (:func:`stale_owners`): an owner whose expiry is at or before now, other than
  the one looking.
- **What a hand-over moves** (:func:`to_move`): the entries of the owner's stream that its group
  has not acknowledged (pending, or never delivered), in order, each added anew to the shared
  stream; then the owner's stream and its entry in the set are deleted. Entries acknowledged
  (handled) are not moved again. A live agent loop hands over every stale owner's stream at its
  beat; an owner that stops gracefully leaves the set first (no new wake-ups come), finishes what
  it holds, then hands over the rest itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentstream.wire.keys import owner_problem

OWNER = "owner"
"""The wake-up goes to its owner's own stream."""
SHARED = "shared"
"""The wake-up goes to the partition's shared stream."""


def route(owner: str, expiry_ms: int | None, now_ms: int) -> str:
    """Where a wake-up sent for ``owner`` goes → :data:`OWNER` or :data:`SHARED`. Pure.

    Args:
        owner: the job's ``wake_to`` (``""``: none).
        expiry_ms: the owner's expiry in the partition's owners set (Unix ms), None when it is
            not there.
        now_ms: now (Redis's clock, Unix ms).
    """
    if not owner or owner_problem(owner) is not None or expiry_ms is None:
        return SHARED
    return OWNER if expiry_ms > now_ms else SHARED


@dataclass(frozen=True)
class Liveness:
    """How an owner keeps itself alive in its partitions' owners sets.

    Attributes:
        ttl_ms: how long one beat keeps it alive, in ms.
        beat_ms: how often it beats (and looks for stale owners to hand over), in ms.
    """

    ttl_ms: int
    beat_ms: int


MIN_TTL_MS = 300
"""The shortest liveness an owner gives itself (ms), whatever the settings."""


def liveness(min_idle_ms: int, lease_ttl_ms: int) -> Liveness:
    """An owner's liveness from the consumer's claim idle time and the trace lease (both ms):
    the shorter of them (at least :data:`MIN_TTL_MS`), beaten every third of it. Pure.

    Example: the defaults (60,000 and 30,000 ms) → alive 30 s past each beat, a beat every 10 s."""
    ttl = max(MIN_TTL_MS, min(min_idle_ms, lease_ttl_ms))
    return Liveness(ttl_ms=ttl, beat_ms=max(1, ttl // 3))


def stale_owners(expiries: Mapping[str, int], now_ms: int, *, me: str = "") -> list[str]:
    """The owners whose expiry is at or before ``now_ms`` (their wake-ups are to be handed
    over), other than ``me``, in the order of their expiry. Pure."""
    return [o for o, at in sorted(expiries.items(), key=lambda kv: (kv[1], kv[0])) if at <= now_ms and o != me]


def to_move(entry_ids: Sequence[str], pending: Sequence[str], last_delivered: str | None) -> list[str]:
    """The entries of a gone owner's stream to add anew to the shared stream, in stream order →
    those pending in its group and those after the group's last delivered id (never read). Pure.

    Args:
        entry_ids: the stream's entry ids, in order.
        pending: the ids pending in the owner's group (read, not acknowledged).
        last_delivered: the group's last delivered id; None when the stream has no group
            (then every entry is unread).
    """
    held = set(pending)
    after = _id(last_delivered) if last_delivered is not None else (0, 0)
    return [e for e in entry_ids if e in held or _id(e) > after]


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
