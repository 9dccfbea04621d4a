"""Tool call ids that name one call of one trace: a pure function, applied before a model output
is recorded.

A provider's call id is only unique within one reply, and some models repeat ids: the same id in
a later turn (``call_0`` every time), or twice in one output. Everything downstream (the
result's idempotency key, the tool worker's per-call claim, a delegation's child trace) keys on
the call id within the trace, so a repeated id would match a new call to an old result and leave
the turn waiting for ever. :func:`scope_call_ids` therefore renames, before the output enters
the trace, every call whose id the trace already used or that appeared earlier in the same
output: ``<id>_r<n>`` with the smallest ``n >= 2`` that is free. Each such call then runs and is
answered on its own. The model sees the recorded ids in the next request (the request is rebuilt
from the trace), so what it reads and what was run agree. Ids keep the characters providers
accept (letters, digits, ``_`` and ``-`` are added; nothing is removed).

Renaming is deterministic: the same trace and the same output give the same ids, so a step that
is retried records the same calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from agentstream.wire.events import Event, ModelOutput

__all__ = ["scope_call_ids", "used_call_ids"]


def used_call_ids(events: Iterable[Event]) -> set[str]:
    """Every tool call id that a model output of the trace holds."""
    return {call.id for event in events if isinstance(event, ModelOutput) for call in event.tool_calls}


def scope_call_ids(output: ModelOutput, events: Sequence[Event] = (), *, used: set[str] | None = None) -> ModelOutput:
    """``output`` with every call id that repeats one of the trace (``events``, or ``used``: the
    call ids of the trace as a caller that keeps them has them) or of the same output replaced by
    a fresh one (``<id>_r<n>``); the same object when no id repeats."""
    if not output.tool_calls:
        return output
    before = used if used is not None else used_call_ids(events)  # read only: a caller's set is not copied
    mine: set[str] = set()  # the ids given to this output's calls so far

    def taken(call_id: str) -> bool:
        return call_id in before or call_id in mine

    calls = []
    changed = False
    for call in output.tool_calls:
        new_id = call.id
        if taken(new_id):
            n = 2
            while taken(f"{call.id}_r{n}"):
                n += 1
            new_id = f"{call.id}_r{n}"
            changed = True
        mine.add(new_id)
        calls.append(call if new_id == call.id else msgspec.structs.replace(call, id=new_id))
    return msgspec.structs.replace(output, tool_calls=tuple(calls)) if changed else output
