"""Judging one model call: which results the policy's shrinks lower before it is made.

:func:`judge` runs at every model call of a trace, in order, on the state folded from the
events before that call. It estimates the call's size; over ``start_at`` it plans the offers
of the shrinks without a threshold of their own until the size is under ``target``, and of
each shrink with a ``when`` while the size is over that ``when``. A pass that would free less
than ``min_gain`` is not made, unless the context would not fit without it; otherwise its
changes are applied. The floors of each lowered result are read from the same state, so a
result keeps what it kept when it shrank.

Cost: a pass is planned without touching the state, offers that freed nothing are remembered,
a pass is not planned again while the view and the forms stay the same, and the built-in
:class:`Compress` and :class:`Stub` over a prefix of the units (``turns[:-2]``) keep their
candidates from call to call, so a long conversation costs per call what it added.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentstream.context.forms.shorten import STUBBED, Form
from agentstream.context.limits import corrected_tokens
from agentstream.context.policy import Compress, ContextView, Stub
from agentstream.errors import ShortenError

if TYPE_CHECKING:
    from agentstream.context.state import Change, Slot, TraceState


class _Handles(Sequence[Sequence[str]]):
    """The handle lists of turns ``[start, end)`` without copying them."""

    __slots__ = ("_turns", "_start", "_end")

    def __init__(self, turns: list[Any], start: int, end: int) -> None:
        self._turns, self._start, self._end = turns, start, end

    def __len__(self) -> int:
        return self._end - self._start

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self._turns[self._start + i].handles for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._turns[self._start + index].handles


def make_view(state: TraceState, start: int, current: int) -> ContextView:
    """The view of a call in turn ``current`` whose shown turns start at ``start``."""
    first = state.turns[start] if start < len(state.turns) else None
    first_round = first.first_round if first is not None else len(state.rounds)
    first_slot = first.first_slot if first is not None else len(state.slots)
    return ContextView(
        turns=_Handles(state.turns, start, current + 1),
        rounds=state.rounds[first_round:],
        results=state.slot_handles[first_slot:],
        tools=state.handle_tools,
        cited=state.cited,
    )


def element_floors(state: TraceState, slot: Slot, form: Form, view: ContextView) -> tuple[Form, ...] | None:
    """The form of each element of a result lowered to ``form``, lifted by the policy's floors."""
    floors = state.policy.protect
    elements = slot.output.elements
    if not floors or not elements:
        return None
    if state.cited_floors_only:  # the default: a cited source stays at its floor's form
        lift = max(floor.form for floor in floors)
        if lift <= form:
            return (form,) * len(elements)
        cited_ids = state.cited
        return tuple(lift if element.id in cited_ids else form for element in elements)
    tool = slot.output.name
    lifted = []
    for element in elements:
        shown = form
        for floor in floors:
            if floor.form > shown and floor.applies(element, tool, view):
                shown = floor.form
        lifted.append(shown)
    return tuple(lifted)


class Candidates:
    """The offers of a built-in shrink over a prefix of the units, kept from call to call.

    ``turns[:-2]`` selects units ``0 .. n-3`` of ``n``; as the trace grows, units only join the
    selection, so the handles of each unit are read once, and a handle leaves the list once its
    form is at or below the shrink's (or lowering it proved futile).
    """

    __slots__ = ("start", "scanned", "pending")

    def __init__(self, start: int) -> None:
        self.start = start
        self.scanned = 0
        self.pending: list[str] = []


def _prefix_stop(shrink: Any) -> int | None:
    """For a built-in shrink over a prefix slice (``[:-k]``, ``[:k]``, ``[:]``), its stop; else None."""
    if type(shrink) not in (Compress, Stub):
        return None
    key = shrink.where.key
    if not isinstance(key, slice) or key.start not in (None, 0) or key.step not in (None, 1):
        return None
    return 0 if key.stop is None else key.stop


def _scan(state: TraceState, shrink: Any, stop: int, start: int, current: int) -> list[str]:
    """Read the units that joined a prefix shrink's selection; returns the handles they added."""
    candidates = state.cursors.get(id(shrink))
    if candidates is None or candidates.start != start:
        candidates = state.cursors[id(shrink)] = Candidates(start)
    unit = shrink.where.unit
    first = state.turns[start] if start < len(state.turns) else None
    if unit == "turns":
        units = current + 1 - start
    elif unit == "rounds":
        first_round = first.first_round if first is not None else len(state.rounds)
        units = len(state.rounds) - first_round
    else:
        first_slot = first.first_slot if first is not None else len(state.slots)
        units = len(state.slots) - first_slot
    end = units + stop if stop < 0 else (units if stop == 0 else min(stop, units))
    added: list[str] = []
    for index in range(candidates.scanned, end):
        if unit == "turns":
            added.extend(state.turns[start + index].handles)
        elif unit == "rounds":
            added.extend(state.rounds[first_round + index])
        else:
            added.append(state.slot_handles[first_slot + index])
    if end > candidates.scanned:
        candidates.scanned = end
    candidates.pending.extend(added)
    return added


def _offers(
    state: TraceState, shrink: Any, start: int, current: int, view: ContextView, planned: dict[str, Form]
) -> Iterable[tuple[str, Form]]:
    stop = _prefix_stop(shrink)
    if stop is None:
        return shrink(view, ChainMap(planned, state.forms))
    target = STUBBED if type(shrink) is Stub else Form.COMPRESSED
    _scan(state, shrink, stop, start, current)
    candidates = state.cursors[id(shrink)]
    keep = []
    offers = []
    bit = 1 << target
    for handle in candidates.pending:
        slot = state.handle_index[handle]
        if slot.form <= target or slot.futile & bit:
            continue
        keep.append(handle)
        if planned.get(handle, slot.form) > target:
            offers.append((handle, target))
    candidates.pending = keep
    return offers


def _still_too_little(state: TraceState, memo_key: tuple, start: int, current: int) -> bool:
    """After a pass that was not made for freeing too little: would this one free too little too?

    Only for built-in prefix shrinks: their offers now are the offers then plus the handles of
    the units that joined since. Forms, the shown turns and the running shrinks are the same
    (``memo_key``), and floors only grow, so the pass can free at most what that one planned
    plus what the joined results hold beyond their smallest form.
    """
    limits = state.limits
    memo = state.reverted
    assert limits is not None
    if memo is None or memo[0] != memo_key:
        return False
    bound = memo[1]
    seen: set[tuple[str, Form]] = set()
    for shrink in state.policy.shrink:
        if id(shrink) not in memo_key[2]:
            continue
        stop = _prefix_stop(shrink)
        assert stop is not None
        form = STUBBED if type(shrink) is Stub else Form.COMPRESSED
        for handle in _scan(state, shrink, stop, start, current):
            slot = state.handle_index[handle]
            if (handle, form) in seen or slot.form <= form:
                continue
            seen.add((handle, form))
            lowest = state.smallest_chars(slot)
            if state.cited_floors_only:  # the floors need no view: use the form's own estimate
                try:
                    lowest = state.estimate(slot, form, element_floors(state, slot, form, None))  # type: ignore[arg-type]
                except ShortenError:
                    continue
            bound += max(0, slot.chars - lowest)
    state.reverted = (memo_key, bound)
    assert state.policy.min_gain is not None
    return limits.tokens_of_chars(bound) + 2 < limits.tokens(state.policy.min_gain)


def judge(state: TraceState, current: int, step: int, call: int, *, speculative: bool) -> list[Change]:
    """Apply the policy's shrinks for the model call ``call`` (its index in the trace).

    Args:
        state: the trace's state just before the call; changed in place.
        current: the index of the call's turn.
        step: the call's step within its turn (sets whether tools are offered).
        call: the index of the call among the trace's model calls.
        speculative: True for the call about to be made (the caller undoes the changes after
            building, so the state stays that of the stored trace).

    Returns:
        The form changes made, oldest first (for :meth:`TraceState.undo`).
    """
    limits = state.limits
    assert limits is not None and state.thresholds is not None
    policy = state.policy
    start_at, target, lowest = state.thresholds
    reserve = policy.output_reserve.count
    chars = state.chars(current, step)
    size = corrected_tokens(chars, limits, state.recorded) + reserve
    state.last_chars = chars
    if size <= lowest:
        return []
    started = size > start_at
    start = state.visible_from(current)
    active = tuple(
        id(shrink) for shrink in policy.shrink
        if (started if getattr(shrink, "when", None) is None else size > limits.tokens(shrink.when))
    )
    key = (start, current, len(state.slots), len(state.rounds), len(state.forms), len(state.cited), active)
    if state.exhausted == key:  # the same offers as last time, and no pass of them was made
        return []
    before = size
    prefix_only = all(_prefix_stop(shrink) is not None for shrink in policy.shrink if id(shrink) in active)
    memo_key = (start, len(state.forms), active)
    if prefix_only and policy.min_gain is not None and before <= limits.window.count and _still_too_little(state, memo_key, start, current):
        return []
    reopen_extra = 0
    if state.reopen_def is not None and not state.offers_reopen(current) and state.agent.tool_choice_for(step) != "none":
        reopen_extra = state.reopen_chars  # the first shortened result brings the reopen tool
    planned: dict[str, tuple[Slot, Form, Any, Any, int]] = {}
    planned_forms: dict[str, Form] = {}
    freed = 0
    view: ContextView | None = None
    exhausted = True  # every offer of every running shrink was tried
    for shrink in policy.shrink:
        when = getattr(shrink, "when", None)
        if when is None:
            if not started:
                continue
            stop = target
        else:
            stop = limits.tokens(when)
        if size <= stop:
            exhausted = exhausted and not planned  # skipped for what this pass freed, not for the view
            continue
        if view is None:
            view = make_view(state, start, current)
        for handle, form in _offers(state, shrink, start, current, view, planned_forms):
            if size <= stop:
                exhausted = False
                break
            slot = state.handle_index.get(handle)
            if slot is None or slot.turn is None or slot.futile & (1 << form):
                continue
            previous = planned.get(handle)
            now_form, now_chars = (previous[1], previous[4]) if previous else (slot.form, slot.chars)
            if form >= now_form or not start <= slot.turn.index <= current:
                continue
            lowered = state.lowered.get((handle, form))
            if lowered is None or lowered[0] != len(state.cited) or not state.cited_floors_only:
                floors = element_floors(state, slot, form, view)
                try:
                    new_chars = state.estimate(slot, form, floors)
                except ShortenError:
                    slot.futile |= 1 << form
                    continue
                state.lowered[(handle, form)] = lowered = (len(state.cited), floors, new_chars)
            _, floors, new_chars = lowered
            if new_chars >= now_chars:
                slot.futile |= 1 << form
                continue
            places = state.places.get(slot.output.call_id, ())
            shown = 1 if len(places) == 1 else sum(1 for turn, _ in places if start <= turn.index <= current)
            freed += (now_chars - new_chars) * shown
            planned[handle] = (slot, form, shrink, floors, new_chars)
            planned_forms[handle] = form
            size = corrected_tokens(chars - freed + reopen_extra, limits, state.recorded) + reserve
    changes: list[Change] = []
    state.reverted = None
    if planned:
        gain = before - size
        if policy.min_gain is None or gain >= limits.tokens(policy.min_gain) or before > limits.window.count:
            for slot, form, shrink, floors, new_chars in planned.values():
                changes.append(state.set_form(slot, form, shrink, call, floors, new_chars))
            state.last_chars = state.chars(current, step)
    if not changes and exhausted and prefix_only:
        state.reverted = (memo_key, freed)  # not made: remember what it could free
    if not changes and exhausted:  # asked again with the same view, the shrinks would do the same
        state.exhausted = key
    _ = speculative
    return changes
