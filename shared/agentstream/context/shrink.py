"""Judging one model call: which results the policy's shrinks lower before it is made.

:func:`judge` runs at every model call of a trace, in order, on the state folded from the
events before that call. It estimates the call's size; over ``start_at`` it applies the
shrinks without a threshold of their own until the size is under ``target``, and each shrink
with a ``when`` while the size is over that ``when``. A pass that frees less than ``min_gain``
is undone, unless the context would not fit without it. The floors of each lowered result are
read from the same state, so a result keeps what it kept when it shrank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentstream.context.forms.shorten import Form
from agentstream.context.limits import corrected_tokens, message_chars
from agentstream.context.policy import ContextView
from agentstream.errors import ShortenError

if TYPE_CHECKING:
    from agentstream.context.state import Change, Slot, TraceState


def element_floors(state: TraceState, slot: Slot, form: Form, view: ContextView) -> tuple[Form, ...] | None:
    """The form of each element of a result lowered to ``form``, lifted by the policy's floors."""
    floors = state.policy.protect
    elements = slot.output.elements
    if not floors or not elements:
        return None
    tool = slot.output.name
    lifted = []
    for element in elements:
        shown = form
        for floor in floors:
            if floor.form > shown and floor.applies(element, tool, view):
                shown = floor.form
        lifted.append(shown)
    return tuple(lifted)


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
    chars = state.chars(current, step)
    size = corrected_tokens(chars, limits, state.recorded) + policy.output_reserve.count
    changes: list[Change] = []
    if size <= lowest:
        state.last_chars = chars
        return changes
    before = size
    started = size > start_at
    start = state.visible_from(current)
    active = tuple(
        id(shrink) for shrink in policy.shrink
        if (started if getattr(shrink, "when", None) is None else size > limits.tokens(shrink.when))
    )
    key = (start, current, len(state.slots), len(state.rounds), len(state.forms), len(state.cited), active)
    if state.exhausted == key:  # the same offers as last time, and they freed nothing
        state.last_chars = chars
        return changes
    view: ContextView | None = None
    for shrink in policy.shrink:
        when = getattr(shrink, "when", None)
        if when is None:
            if not started:
                continue
            stop = target
        else:
            stop = limits.tokens(when)
        if size <= stop:
            continue
        if view is None:
            view = state.view(current)
        for handle, form in shrink(view, state.forms_view):
            if size <= stop:
                break
            slot = state.handle_index.get(handle)
            if slot is None or form >= slot.form or slot.turn is None or slot.futile & (1 << form):
                continue
            if not start <= slot.turn.index <= current:
                continue
            floors = element_floors(state, slot, form, view)
            try:
                message = state.renderer.message(slot.output, handle, form, floors)
            except ShortenError:
                slot.futile |= 1 << form
                continue
            new_chars = message_chars(message)
            if new_chars >= slot.chars:
                slot.futile |= 1 << form
                continue
            changes.append(state.set_form(slot, form, shrink, call, floors, message, new_chars))
            size = state.size(current, step)
    if not changes:
        state.exhausted = key
    gain = before - size
    if changes and policy.min_gain is not None and gain < limits.tokens(policy.min_gain) and before <= limits.window.count:
        state.undo(changes)
        changes = []
    state.last_chars = state.chars(current, step)
    _ = speculative
    return changes
