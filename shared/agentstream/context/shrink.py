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
candidates from call to call, so a long conversation costs per call what it added. A pass that
was not made for freeing too little is not planned again until a bound of what it could free
(what it planned, plus what each result that joined its selection since would free in its
lowest offered form) reaches ``min_gain``: between ``start_at`` and the compaction threshold,
most calls are judged by that bound alone. Setting :data:`SHORTCUTS` to False plans every pass
in full (the tests compare both).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator, Mapping, Sequence
from math import ceil
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from agentstream.context._context_fold_parts import Change, Slot
from agentstream.context.forms.shorten import COMPRESSED, STUBBED, Form
from agentstream.context.limits import ModelLimits, corrected_tokens
from agentstream.context.policy import Compress, ContextPolicy, ContextView, Stub
from agentstream.errors import ShortenError

if TYPE_CHECKING:
    from agentstream.context._context_fold_parts import Turn
    from agentstream.context._context_fold_protocol import FoldState

SHORTCUTS = True
"""Skip planning a pass when its outcome is known (the same view as a pass that did nothing, or a
bound under ``min_gain``), and read the built-in prefix shrinks' candidates incrementally. False
plans every pass from the shrinks' own offers: slower, the same forms (tests compare both)."""


class _Handles(Sequence[Sequence[str]]):
    """The handle lists of turns ``[start, end)`` without copying them."""

    __slots__ = ("_turns", "_start", "_end")

    def __init__(self, turns: list[Turn], start: int, end: int) -> None:
        self._turns, self._start, self._end = turns, start, end

    def __len__(self) -> int:
        return self._end - self._start

    @overload
    def __getitem__(self, index: int) -> Sequence[str]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Sequence[str]]: ...

    def __getitem__(self, index: int | slice) -> Sequence[str] | Sequence[Sequence[str]]:
        if isinstance(index, slice):
            return [self._turns[self._start + i].handles for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._turns[self._start + index].handles


class _Tools(Mapping[str, str]):
    """The tool name of each result, by handle (read-only, read from the results themselves)."""

    __slots__ = ("_slots",)

    def __init__(self, slots: Mapping[str, Slot]) -> None:
        self._slots = slots

    def __getitem__(self, handle: str) -> str:
        return self._slots[handle].output.name

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


def make_view(state: FoldState, start: int, current: int) -> ContextView:
    """The view of a call in turn ``current`` whose shown turns start at ``start``."""
    first = state.turns[start] if start < len(state.turns) else None
    first_round = first.first_round if first is not None else len(state.rounds)
    first_slot = first.first_slot if first is not None else len(state.slots)
    return ContextView(
        turns=_Handles(state.turns, start, current + 1),
        rounds=state.rounds[first_round:],
        results=[slot.handle for slot in state.slots[first_slot:]],
        tools=_Tools(state.handle_index),
        cited=state.cited,
    )


def element_floors(state: FoldState, slot: Slot, form: Form, view: ContextView | None) -> tuple[Form, ...] | None:
    """The form of each element of a result lowered to ``form``, lifted by the policy's floors.

    None when no element is lifted (each shows in ``form``; lays out and estimates the same).
    """
    floors = state.policy.protect
    elements = slot.output.elements
    if not floors or not elements:
        return None
    if state.cited_floors_only:  # the default: a cited source stays at its floor's form
        lift = state.cited_lift
        if lift <= form:
            return None
        cited_ids = state.cited
        for element in elements:
            if element.id in cited_ids:
                return tuple(lift if element.id in cited_ids else form for element in elements)
        return None
    assert view is not None  # only the default floors (above) are read without a view
    tool = slot.output.name
    lifted = []
    changed = False
    for element in elements:
        shown = form
        for floor in floors:
            if floor.form > shown and floor.applies(element, tool, view):
                shown = floor.form
        lifted.append(shown)
        changed = changed or shown != form
    return tuple(lifted) if changed else None


class Step(NamedTuple):
    """One shrink of the policy, read once per state.

    Attributes:
        shrink: the shrink.
        when: its own threshold in tokens, or None (it runs from start_at to target).
        stop: for a built-in shrink over a prefix slice of the units, the slice's stop (0 for
            none); None for any other shrink.
        form: the form a built-in prefix shrink offers.
    """

    shrink: Any
    when: int | None
    stop: int | None
    form: Form


def steps_of(policy: ContextPolicy, limits: ModelLimits) -> tuple[Step, ...]:
    """The policy's shrinks with their thresholds in a model's window, in order."""
    out = []
    for shrink in policy.shrink:
        when = getattr(shrink, "when", None)
        stop = _prefix_stop(shrink) if SHORTCUTS else None
        out.append(
            Step(
                shrink,
                None if when is None else limits.tokens(when),
                stop,
                STUBBED if type(shrink) is Stub else COMPRESSED,
            )
        )
    return tuple(out)


class Candidates:
    """The offers of a built-in shrink over a prefix of the units, kept from call to call.

    ``turns[:-2]`` selects units ``0 .. n-3`` of ``n``; as the trace grows, units only join the
    selection, so the results of each unit are read once, and a result leaves the list once its
    form is at or below the shrink's (or lowering it proved futile).

    Kept for one ``start`` and a ``current`` turn that does not go back: a call judged for an
    older turn than the last one (a model output recorded for a turn that had ended, after the
    call of a newer turn was built) selects fewer turns, so the list is read again from the start.
    """

    __slots__ = ("start", "current", "scanned", "pending")

    def __init__(self, start: int, current: int) -> None:
        self.start = start
        self.current = current
        self.scanned = 0
        self.pending: list[Slot] = []


def _prefix_stop(shrink: Any) -> int | None:
    """For a built-in shrink over a prefix slice whose units are complete once selected, its stop; else None.

    Turns and rounds qualify with a negative stop (``turns[:-2]``: the newest units, which may
    still gain results, stay out); results with any stop (``results[:-3]``, ``results[:5]``, ``results[:]``).
    """
    if type(shrink) not in (Compress, Stub):
        return None
    key = shrink.where.key
    if not isinstance(key, slice) or key.start not in (None, 0) or key.step not in (None, 1):
        return None
    stop = 0 if key.stop is None else key.stop
    if shrink.where.unit != "results" and stop >= 0:
        return None
    return stop


def _scan(state: FoldState, shrink: Any, stop: int, start: int, current: int) -> list[Slot]:
    """Read the units that joined a prefix shrink's selection; returns the results they added."""
    candidates = state.cursors.get(id(shrink))
    if candidates is None or candidates.start != start or current < candidates.current:
        candidates = state.cursors[id(shrink)] = Candidates(start, current)
    candidates.current = current
    unit = shrink.where.unit
    if unit == "turns":
        if current + 1 - start + stop <= candidates.scanned:  # (stop < 0 for turns) nothing joined
            return []
        units = current + 1 - start
    else:
        first = state.turns[start] if start < len(state.turns) else None
        if unit == "rounds":
            first_round = first.first_round if first is not None else len(state.rounds)
            units = len(state.rounds) - first_round
        else:
            first_slot = first.first_slot if first is not None else len(state.slots)
            units = len(state.slots) - first_slot
    end = units + stop if stop < 0 else (units if stop == 0 else min(stop, units))
    if end <= candidates.scanned:
        return []
    index_of = state.handle_index
    added: list[Slot] = []
    for index in range(candidates.scanned, end):
        if unit == "turns":
            added.extend(map(index_of.__getitem__, state.turns[start + index].handles))
        elif unit == "rounds":
            added.extend(map(index_of.__getitem__, state.rounds[first_round + index]))
        else:
            added.append(state.slots[first_slot + index])
    candidates.scanned = end
    candidates.pending.extend(added)
    return added


def _lowest_chars(state: FoldState, slot: Slot, form: Form) -> int | None:
    """At most how few characters ``slot`` takes once lowered to ``form`` (None: it cannot be)."""
    if not state.cited_floors_only:
        return state.smallest_chars(slot)
    try:  # the floors need no view: the form's own estimate
        return state.estimate(slot, form, element_floors(state, slot, form, None))
    except ShortenError:
        return None


def _still_too_little(state: FoldState, memo_key: tuple[Any, ...], start: int, current: int) -> bool:
    """After a pass that was not made for freeing too little: would this one free too little too?

    Only for built-in prefix shrinks: their offers now are the offers then plus the results of
    the units that joined since. Forms, the shown turns and the running shrinks are the same
    (``memo_key``), and floors only grow, so the pass can free at most what that one planned
    plus, for each result that joined, what it holds beyond its lowest offered form (beyond the
    form that pass planned for it, if any; counted once per result, however many shrinks offer it).
    """
    limits = state.limits
    memo = state.reverted
    assert limits is not None and state.min_gain_tokens is not None
    if memo is None or memo[0] != memo_key:
        return False
    _, bound, counted = memo
    mark = _units_mark(state, current)
    if mark == state.scanned_mark:  # no unit joined any selection since the last scan
        return limits.tokens_of_chars(bound) + 2 < state.min_gain_tokens
    state.scanned_mark = mark
    before = bound
    cited_only = state.cited_floors_only
    lifts = bool(state.policy.protect)
    cited = state.cited
    for step in state.steps:
        if id(step.shrink) not in memo_key[-1]:
            continue
        assert step.stop is not None
        form = step.form
        bit = 1 << form
        lifted = lifts and state.cited_lift > form
        for slot in _scan(state, step.shrink, step.stop, start, current):
            if slot.form <= form or slot.futile & bit:
                continue
            lowest = -1
            if cited_only:  # nothing cited in it: the form's estimate, kept on the slot
                lowest = slot.chars_compressed if form == COMPRESSED else slot.chars_stubbed if form == STUBBED else -1
                if lifted and lowest >= 0:
                    for element in slot.output.elements:
                        if element.id in cited:
                            lowest = -1
                            break
            if lowest < 0:
                found = _lowest_chars(state, slot, form)
                if found is None:
                    continue
                lowest = found
            now = counted.get(slot, slot.chars)
            if lowest < now:
                bound += (now - lowest) * (1 + len(slot.more) if slot.more else 1)
                counted[slot] = lowest
    if bound != before:
        state.reverted = (memo_key, bound, counted)
    return limits.tokens_of_chars(bound) + 2 < state.min_gain_tokens


def _units_mark(state: FoldState, current: int) -> tuple[int, int, int, int]:
    """What the prefix shrinks' selections grow with: the current turn, the rounds, the results (for the
    units some shrink selects), and the rescans."""
    units = state.prefix_units
    return (
        current,
        len(state.rounds) if "rounds" in units else 0,
        len(state.slots) if "results" in units else 0,
        state.rescans,
    )


def judge(
    state: FoldState, current: int, step: int, call: int, *, speculative: bool, chars: int | None = None
) -> list[Change]:
    """Apply the policy's shrinks for the model call ``call`` (its index in the trace).

    In named passes, in this order (each may end the judgement; the order matters, since each
    reads what the one before it found):

    1. the call's size (:func:`_size_of`): at or under the policy's lowest threshold, nothing is
       shrunk;
    2. which shrinks run at that size (:func:`_running`);
    3. shortcuts (:func:`_known_unmade`): a pass already known not to be made (the same view as
       one that freed too little, or that tried every offer) is not planned again;
    4. planning (:class:`_Plan`): each running shrink's offers, in the policy's order, lowered
       in the plan while the size is over its stop, each offer judged on its sizes (and floors);
    5. the outcome (:func:`_conclude`): the plan is applied when it frees enough (``min_gain``) or
       the call would not fit without it, else undone and remembered for the shortcuts.

    Args:
        state: the trace's state just before the call; changed in place.
        current: the index of the call's turn.
        step: the call's step within its turn (sets whether tools are offered).
        call: the index of the call among the trace's model calls.
        speculative: True for the call about to be made (the caller undoes the changes after
            building, so the state stays that of the stored trace).
        chars: ``state.chars(current, step)``, when the caller has it.

    Returns:
        When ``speculative``, the form changes made, oldest first (for
        :meth:`~agentstream.context._context_fold.ContextFold.undo`); otherwise an empty list.
    """
    limits = state.limits
    assert limits is not None and state.thresholds is not None
    chars, size = _size_of(state, current, step, chars)  # 1
    if size <= state.thresholds[2]:
        return []
    started, active = _running(state, size)  # 2
    start = min(state.kept_from, current) if state.compaction is not None else 0  # state.visible_from(current)
    known = _known_unmade(state, current, step, chars, size, start, active)  # 3
    if known is None:
        return []
    prefix_only, memo_key, key, reopen_extra = known
    plan = _Plan(state, chars, size, start, current, reopen_extra)  # 4
    for s in state.steps:
        plan.run(s, started)
    return _conclude(state, plan, call, current, step, speculative, prefix_only, memo_key, key)  # 5


def _size_of(state: FoldState, current: int, step: int, chars: int | None) -> tuple[int, int]:
    """Pass 1: the call's characters and its size in tokens (corrected by the recorded usage,
    plus the output reserve); noted as the state's ``last_chars``."""
    assert state.limits is not None
    if chars is None:
        chars = state.chars(current, step)
    state.last_chars = chars
    return chars, corrected_tokens(chars, state.limits, state.recorded) + state.reserve


def _running(state: FoldState, size: int) -> tuple[bool, tuple[int, ...]]:
    """Pass 2: whether the size is over ``start_at``, and the ids of the shrinks that run (those
    without a ``when`` once started, each with one while the size is over it)."""
    assert state.thresholds is not None
    started = size > state.thresholds[0]
    active = tuple(id(s.shrink) for s in state.steps if (started if s.when is None else size > s.when))
    return started, active


def _known_unmade(
    state: FoldState, current: int, step: int, chars: int, size: int, start: int, active: tuple[int, ...]
) -> tuple[bool, tuple[Any, ...], tuple[Any, ...], int] | None:
    """Pass 3: None when the pass is known not to be made without planning it (either way is
    enough, in any order), else what the later passes need: (whether only prefix shrinks run, the
    memo key of a reverted pass, the key of an exhausted one, the reopen tool's characters)."""
    limits, policy, recorded = state.limits, state.policy, state.recorded
    assert limits is not None
    prefix_only = state.prefix_only.get(active)
    if prefix_only is None:
        prefix_only = state.prefix_only[active] = SHORTCUTS and all(
            s.stop is not None for s in state.steps if id(s.shrink) in active
        )
    memo_key = (start, len(state.forms), state.recalls, active)
    memo = state.reverted
    if (
        prefix_only
        and memo is not None
        and memo[0] == memo_key
        and policy.min_gain is not None
        and size <= limits.window.count
        and _still_too_little(state, memo_key, start, current)
    ):
        return None
    reopen_extra = 0
    if state.reopen_def is not None and not state.offers_reopen(current) and state.tools_offered(current, step):
        reopen_extra = state.reopen_chars  # the first shortened result brings the reopen tool
    key = (
        start,
        current,
        len(state.slots),
        state.placements,
        len(state.rounds),
        len(state.forms),
        len(state.cited),
        state.recalls,
        active,
        reopen_extra,
        recorded,
    )
    exhausted_then = state.exhausted
    if SHORTCUTS and exhausted_then is not None and exhausted_then[0] == key and chars >= exhausted_then[1]:
        # The same offers as a pass that tried them all and was not made; with as many characters
        # or more, this one plans the same and frees the same: made only if that now gains enough.
        _, _, freed_then, planned_then = exhausted_then
        after = corrected_tokens(chars - freed_then + reopen_extra, limits, recorded) + state.reserve
        if not planned_then or not _made(policy, limits, size, after):
            return None
    return prefix_only, memo_key, key, reopen_extra


class _Plan:
    """Pass 4: the plan of one judgement: the slots lowered, in the order first planned (each
    keeps its plan in its ``plan_*`` attributes), what they free, and the size left."""

    def __init__(self, state: FoldState, chars: int, size: int, start: int, current: int, reopen_extra: int):
        self.state, self.chars, self.start, self.current, self.reopen_extra = state, chars, start, current, reopen_extra
        self.before = self.size = size
        self.planned: list[Slot] = []
        self.planned_forms: dict[str, Form] = {}  # for the offers of other shrinks
        self.freed = 0
        self.view: ContextView | None = None
        self.exhausted = True  # every offer of every running shrink was tried
        self.settled = True  # every offer was judged on its sizes alone (none skipped for where it shows)

    def the_view(self) -> ContextView:
        if self.view is None:
            self.view = make_view(self.state, self.start, self.current)
        return self.view

    def run(self, s: Step, started: bool) -> None:
        """Plan the offers of one shrink while the size is over its stop."""
        assert self.state.thresholds is not None
        if s.when is None:
            if not started:
                return
            stop = self.state.thresholds[1]
        else:
            stop = s.when
        if self.size <= stop:
            if self.before > stop:  # skipped for what this pass freed, not for the view
                self.exhausted = self.exhausted and not self.planned
            return
        if s.stop is not None:
            self._run_prefix(s, stop)
        else:
            self._run_offers(s, stop)

    def _run_prefix(self, s: Step, stop: int) -> None:
        """A built-in prefix shrink: its pending candidates, pruned as they are read."""
        state, form = self.state, s.form
        bit = 1 << form
        assert s.stop is not None  # a prefix shrink's
        _scan(state, s.shrink, s.stop, self.start, self.current)
        candidates = state.cursors[id(s.shrink)]
        keep: list[Slot] = []
        for index, slot in enumerate(candidates.pending):
            if slot.form <= form or slot.futile & bit:
                continue  # it leaves the candidates
            keep.append(slot)
            if slot.plan_form is not None and slot.plan_form <= form:
                continue
            if self.size <= stop:
                self.exhausted = False
                keep.extend(candidates.pending[index + 1 :])
                break
            self._offer(slot, form, bit, s.shrink)
        candidates.pending = keep

    def _run_offers(self, s: Step, stop: int) -> None:
        """Any other shrink: its offers ``(handle, form)`` for the view and the forms planned so far."""
        handle_index = self.state.handle_index
        for handle, form in s.shrink(self.the_view(), ChainMap(self.planned_forms, self.state.forms)):
            if self.size <= stop:
                self.exhausted = False
                break
            slot = handle_index.get(handle)
            if slot is not None:
                self._offer(slot, form, 1 << form, s.shrink)

    def _offer(self, slot: Slot, form: Form, bit: int, shrink: Any) -> None:
        """Plan ``slot`` in ``form`` when that is lower than its form now and frees characters."""
        if slot.turn is None or slot.futile & bit:
            self.settled = self.settled and slot.turn is not None
            return
        now_form = slot.plan_form
        if now_form is None:
            now_form, now_chars = slot.form, slot.chars
        else:
            now_chars = slot.plan_chars
        if form >= now_form:
            return
        if not self.start <= slot.turn.index <= self.current:
            self.settled = False
            return
        floors = self._floors(slot, form)
        new_chars = slot.chars_compressed if form == COMPRESSED else slot.chars_stubbed if form == STUBBED else -1
        if floors is not None or new_chars < 0:
            try:
                new_chars = self.state.estimate(slot, form, floors)
            except ShortenError:
                slot.futile |= bit
                return
        if new_chars >= now_chars:
            slot.futile |= bit
            return
        self._plan(slot, form, shrink, floors, now_chars, new_chars)

    def _floors(self, slot: Slot, form: Form) -> tuple[Form, ...] | None:
        """The floors of ``slot``'s elements in ``form`` (None: none above the form)."""
        state = self.state
        if not state.cited_floors_only:
            return element_floors(state, slot, form, self.the_view())
        # the default floors: lifted only when an element was cited
        if state.policy.protect and form < state.cited_lift:
            cited = state.cited
            for element in slot.output.elements:
                if element.id in cited:
                    return element_floors(state, slot, form, self.view)
        return None

    def _plan(self, slot: Slot, form: Form, shrink: Any, floors: Any, now_chars: int, new_chars: int) -> None:
        more = slot.more  # a call id called again shows the result again
        start, current = self.start, self.current
        shown = 1 if more is None else 1 + sum(1 for place in more if start <= place.turn <= current)
        self.freed += (now_chars - new_chars) * shown
        if slot.plan_form is None:
            self.planned.append(slot)
        slot.plan_form, slot.plan_chars, slot.plan_by, slot.plan_floors = form, new_chars, shrink, floors
        self.planned_forms[slot.handle] = form
        state = self.state
        limits = state.limits
        assert limits is not None
        rest = self.chars - self.freed + self.reopen_extra
        if state.recorded is None:  # corrected_tokens(rest, limits, None), inline: at every offer
            self.size = (ceil(rest / limits.characters_per_token) if rest > 0 else 0) + state.reserve
        else:
            self.size = corrected_tokens(rest, limits, state.recorded) + state.reserve


def _conclude(
    state: FoldState,
    plan: _Plan,
    call: int,
    current: int,
    step: int,
    speculative: bool,
    prefix_only: bool,
    memo_key: tuple[Any, ...],
    key: tuple[Any, ...],
) -> list[Change]:
    """Pass 5: apply the plan when it is made; else undo it, and remember what it could free."""
    assert state.limits is not None
    planned = plan.planned
    state.reverted = None
    if planned and _made(state.policy, state.limits, plan.before, plan.size):
        state.exhausted = None
        changes = state.apply_plan(planned, call, speculative)
        state.last_chars = state.chars(current, step)
        return changes
    if plan.exhausted and prefix_only and plan.settled:  # not made: remember what it could free
        state.reverted = (memo_key, plan.freed, {slot: slot.plan_chars for slot in planned})
        state.scanned_mark = _units_mark(state, current)  # every running shrink read its units
    for slot in planned:
        slot.plan_form = slot.plan_by = slot.plan_floors = None
    if plan.exhausted:  # asked again with the same view, the shrinks would do the same
        state.exhausted = (key, plan.chars, plan.freed, bool(planned))
    return []


def _made(policy: ContextPolicy, limits: ModelLimits, before: int, after: int) -> bool:
    """Whether a pass that brings the size from ``before`` to ``after`` tokens is made."""
    return policy.min_gain is None or before - after >= limits.tokens(policy.min_gain) or before > limits.window.count
