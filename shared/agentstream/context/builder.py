"""Events → the chat request of one model call: a pure function of the trace, the agent and its limits.

No I/O, no clock, no randomness: the same events, agent and limits give the same request, in
any process. The rules it keeps (tested as properties over generated traces):

- every assistant tool call is followed by exactly one result, in call order, before the next
  user or assistant message; a result is matched by call id whatever order results arrived in,
  the first result for a call id wins, and a result appended after its turn ended is ignored;
  a result with no matching call is never shown;
- a call that never got a result (the worker died, the turn was cancelled or failed) gets a
  synthetic error result saying so;
- the system prompt is always first; after it, history starts on a user message;
- under budget the history is shown whole and unchanged; the prefix of the context stays the
  same between calls unless a shrink or a compaction changed it;
- a turn that a later turn input rolls back (its ``rolls_back``, busy policy ``rollback``) is
  left out, with all its events, of the context of every other turn's calls built from events
  that hold that input (:func:`hidden_for`); its own calls, and every call built before that
  input, show it. A fold that finds the hidden turns changed is folded again from the start
  (once per rollback): a request depends on the events before it alone, as ever.

The agent's settings come from ``Agent.context`` (a :class:`ContextConfig`, default settings
when None) and ``Agent.model_limits`` (:data:`~agentstream.context.limits.DEFAULT_LIMITS` when
None).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentstream.context._context_fold import ContextFold
from agentstream.context.compaction import CompactionPlan, plan, trigger_tokens
from agentstream.context.compaction import instructions as compaction_instructions
from agentstream.context.elements import Numbering
from agentstream.context.forms.shorten import Form
from agentstream.context.limits import (
    DEFAULT_LIMITS,
    MissCorrection,
    ModelLimits,
    learn_from_miss,
    request_chars,
    text_chars,
)
from agentstream.context.render import ContextConfig, EventFilter, cap_images
from agentstream.context.reopen import resolve_reopen
from agentstream.context.request import ChatRequest, Message, ToolDefinition
from agentstream.context.shrink import judge
from agentstream.context.trimming import trim_request
from agentstream.declarations.agents import Agent
from agentstream.errors import ContextFullError
from agentstream.wire.codec import gc_paused
from agentstream.wire.events import ToolCall, ToolOutput, TurnInput

if TYPE_CHECKING:
    from agentstream.context._context_fold_parts import Slot

FROM_AGENT: Literal["agent"] = "agent"
"""Take the limits from the agent (``Agent.model_limits``, or the default limits)."""

LimitsArg = ModelLimits | None | Literal["agent"]

DEFAULT_CONFIG = ContextConfig()
"""The settings of an agent that gives none."""


def settings_of(
    agent: Agent, config: ContextConfig | None = None, limits: LimitsArg = FROM_AGENT
) -> tuple[ContextConfig, ModelLimits | None]:
    """The builder settings and model limits of an agent (explicit arguments win)."""
    own_config = getattr(agent, "context", None)
    if config is None:
        config = own_config if own_config is not None else DEFAULT_CONFIG
    if limits == FROM_AGENT:
        own_limits = getattr(agent, "model_limits", None)
        limits = own_limits if own_limits is not None else DEFAULT_LIMITS
    return config, limits


@dataclass(frozen=True)
class Shrunk:
    """Why a shown result has a shortened form: which shrink gave it, at which model call.

    Attributes:
        handle: the result's handle (``r3``).
        call_id: the id of the tool call it answers.
        tool: the tool's name.
        form: its form in this call.
        by: the shrink that gave the form.
        at: the index of the model call (among the trace's calls) at which it got the form.
        at_turn: the turn of that call.
        at_step: the step of that call within its turn.
        kept: the elements a floor shows in a higher form than the result's (a cited source
            kept full), as ``(number, element id, form)``, in the result's order.
    """

    handle: str
    call_id: str
    tool: str
    form: Form
    by: Any
    at: int
    at_turn: str
    at_step: int
    kept: tuple[tuple[int | None, str, Form], ...] = ()


@dataclass(frozen=True)
class BuiltContext:
    """A model call's context and what the builder knows about it.

    Attributes:
        request: the provider-neutral request.
        turn_id: the turn of the call (None when the trace has no turn).
        step: the call's step within its turn.
        call: the index of the call among the trace's model calls.
        size_tokens: the estimated size (prompt plus output reserve), or None without limits.
        window_tokens: the model's window, or None without limits.
        fits: False when the size is over the window (the call must not be made).
        compaction: the compaction that is due before this call, or None.
        shrunk: each shortened result shown, in recorded order.
    """

    request: ChatRequest
    turn_id: str | None
    step: int
    call: int
    size_tokens: int | None
    window_tokens: int | None
    fits: bool
    compaction: CompactionPlan | None
    shrunk: tuple[Shrunk, ...]


def rolled_back(events: Sequence[Any]) -> frozenset[str]:
    """The turns the turn inputs among ``events`` roll back (their ``rolls_back``)."""
    return frozenset(e.rolls_back for e in events if isinstance(e, TurnInput) and e.rolls_back is not None)


def hidden_for(rollbacks: frozenset[str] | set[str], turn_id: str | None) -> frozenset[str]:
    """The turns left out of the context of a call of ``turn_id``: every rolled-back turn but
    itself (a rolled-back turn's own late call is built as it was sent)."""
    if not rollbacks:
        return frozenset()
    return frozenset(rollbacks - {turn_id}) if turn_id in rollbacks else frozenset(rollbacks)


def new_state(
    events: Sequence[Any],
    agent: Agent,
    config: ContextConfig,
    limits: ModelLimits | None,
    *,
    turn_id: str | None = None,
) -> ContextFold:
    """Fold events into a fresh state for the calls of ``turn_id`` (a selection that is not
    :func:`only` is applied here; the rolled-back turns but ``turn_id`` are left out)."""
    if limits is not None:
        config.policy.check(limits)
    hidden = hidden_for(rolled_back(events), turn_id)
    if config.select is not None and not isinstance(config.select, EventFilter):
        numbering = Numbering()
        for event in events:
            numbering.add_event(event)
        state = ContextFold(agent, config, limits, numbering, hidden)
        state.feed(config.select(events))
        state.count = len(events)
        return state
    state = ContextFold(agent, config, limits, hidden=hidden)
    state.feed(events)
    return state


def stale_hidden(state: ContextFold, turn_id: str | None) -> bool:
    """Whether ``state`` leaves out other turns than a call of ``turn_id`` must (a rollback came
    since it was folded): then it is folded again from the start (:func:`new_state`)."""
    return state.hidden != hidden_for(state.rollbacks, turn_id)


def build_from_state(state: ContextFold, *, turn_id: str | None, step: int) -> BuiltContext:
    """Build the next call's context from a folded state; the state is left as it was.

    Raises:
        ShortenError: a shorten function changed a result's elements or its error.
    """
    with gc_paused():
        return _build_from_state(state, turn_id=turn_id, step=step)


def _build_from_state(state: ContextFold, *, turn_id: str | None, step: int) -> BuiltContext:
    index = state.turn_index.get(turn_id) if turn_id is not None else None
    if index is None:
        index = len(state.turns) - 1
    call = len(state.calls)
    changes = judge(state, index, step, call, speculative=True) if state.limits is not None and index >= 0 else []
    try:
        if index < 0:
            request = ChatRequest(
                system=state.base_system(-1),
                messages=(),
                tools=state.tools_for(0, step),
                tool_choice=state.agent.tool_choice_at(0, step),
                max_output_tokens=state.agent.max_output_tokens,
                temperature=state.agent.temperature,
            )
            return BuiltContext(request, None, step, call, None, None, True, None, ())
        messages = state.messages(index)
        max_images = state.policy.max_images if state.limits is not None else None
        if max_images is not None:
            cap_images(messages, max_images)
        choice = state.tool_choice(index, step)
        request = ChatRequest(
            system=state.system_prompt(index),
            messages=tuple(messages),
            tools=state.tools_for(index, step),
            tool_choice=choice,
            max_output_tokens=state.agent.max_output_tokens,
            temperature=state.agent.temperature,
        )
        size = window = None
        fits = True
        due = None
        if state.limits is not None:
            size = state.size(index, step)
            window = state.limits.window.count
            fits = size <= window
            compact = state.policy.compact
            if compact is not None:
                threshold = trigger_tokens(
                    compact,
                    state.limits,
                    state.policy.output_reserve.count,
                    text_chars(compaction_instructions(compact, state)),
                )
                if size > threshold or not fits:
                    due = plan(state, index, compact)
        shrunk = tuple(_shrunk(state, s, index, step) for s in state.shrunk(index))
        return BuiltContext(request, state.turns[index].turn_id, step, call, size, window, fits, due, shrunk)
    finally:
        if changes:
            state.undo(changes)


def _shrunk(state: ContextFold, slot: Slot, index: int, step: int) -> Shrunk:
    """Why a shown result has its form; kept on the slot while it keeps that form from a recorded call."""
    at = slot.at
    kept = _kept(state, slot)
    if not 0 <= at < len(state.calls):  # given at the call being built: its turn and step
        return Shrunk(
            slot.handle,
            slot.output.call_id,
            slot.output.name,
            slot.form,
            slot.by,
            at,
            state.turns[index].turn_id,
            step,
            kept,
        )
    record: Shrunk | None = slot.record
    if record is None or record.at != at or record.form != slot.form or record.by is not slot.by or record.kept != kept:
        call = state.calls[at]
        record = slot.record = Shrunk(
            slot.handle, slot.output.call_id, slot.output.name, slot.form, slot.by, at, call.turn_id, call.step, kept
        )
    return record


def _kept(state: ContextFold, slot: Any) -> tuple[tuple[int | None, str, Form], ...]:
    """The elements of a shortened result that floors show in a higher form than the result's."""
    forms = slot.element_forms
    if not forms:
        return ()
    elements = slot.output.elements
    return tuple(
        (state.numbering.number(elements[i].id), elements[i].id, form)
        for i, form in enumerate(forms)
        if form > slot.form and i < len(elements)
    )


def require_fit(built: BuiltContext, *, trace_id: str | None = None) -> ChatRequest:
    """The request of a built context that fits the window.

    Raises:
        ContextFullError: the context is over the window after every shrink.
    """
    if built.fits:
        return built.request
    where = f"trace {trace_id!r}, " if trace_id else ""
    hint = (
        "a compaction is due: summarise earlier turns first"
        if built.compaction is not None
        else "give the agent's context policy a Compact setting, shorten the tool results (result_cap, per-tool forms), "
        "or use a model with a larger window"
    )
    raise ContextFullError(
        f"{where}turn {built.turn_id!r} step {built.step}: the context needs about {built.size_tokens} tokens "
        f"(prompt and output reserve) but the model's window is {built.window_tokens} tokens, even after every "
        f"shrink; {hint}. Nothing was sent."
    )


def build_context(
    events: Sequence[Any],
    agent: Agent,
    *,
    turn_id: str | None,
    step: int,
    config: ContextConfig | None = None,
    limits: LimitsArg = FROM_AGENT,
) -> BuiltContext:
    """The context of model call ``step`` of turn ``turn_id``, from the events before it.

    Args:
        events: the trace's events up to (not including) this call's model output.
        agent: the agent answering the turn.
        turn_id: the turn being answered; later (queued) turns are not shown. None, or a turn
            not in the events, shows every turn.
        step: the pass number within the turn (the last pass under the passes cap offers no tools).
        config: the builder settings (default: the agent's).
        limits: the model's limits (default: the agent's); None shrinks nothing and checks no size.

    Raises:
        UnrenderedEventError: a selected event that nothing renders.
        ShortenError: a shorten function changed a result's elements or its error.
        ValueError: the policy's target is not below its start_at in the model's window.
    """
    config, resolved = settings_of(agent, config, limits)
    state = new_state(events, agent, config, resolved, turn_id=turn_id)
    return build_from_state(state, turn_id=turn_id, step=step)


def build_request(
    events: Sequence[Any],
    agent: Agent,
    *,
    turn_id: str,
    step: int,
    config: ContextConfig | None = None,
    limits: LimitsArg = FROM_AGENT,
) -> ChatRequest:
    """The request of model call ``step`` (0-based) of turn ``turn_id``, from the events before it.

    See :func:`build_context` for the arguments.

    Raises:
        ContextFullError: the context does not fit the model's window after every shrink.
        UnrenderedEventError: a selected event that nothing renders.
        ShortenError: a shorten function changed a result's elements or its error.
    """
    return require_fit(build_context(events, agent, turn_id=turn_id, step=step, config=config, limits=limits))


def rebuild_after_miss(
    events: Sequence[Any],
    agent: Agent,
    *,
    turn_id: str,
    step: int,
    prompt_tokens: int | None = None,
    window_tokens: int | None = None,
    over_by_tokens: int | None = None,
    config: ContextConfig | None = None,
    limits: LimitsArg = FROM_AGENT,
) -> tuple[BuiltContext, MissCorrection]:
    """The context of model call ``step`` again, smaller, after the server refused it as over the
    model's window although the estimate said it fits (a window miss).

    The refused request is rebuilt as it was sent; :func:`~agentstream.context.limits.learn_from_miss`
    corrects the model's limits from the server's figures (``prompt_tokens``, ``window_tokens``,
    ``over_by_tokens``: any may be None); the context is built again under the corrected limits,
    with the refused request's size counted as the server counted it, so the policy's shrinks
    run (and a compaction is planned, ``BuiltContext.compaction``, where the policy has one).
    The caller sends the rebuilt request once (through its compaction or trimming as usual,
    with the agent's limits replaced by ``correction.limits``).

    Returns:
        ``(built, correction)``: the smaller context and what the miss taught.

    Raises:
        ContextFullError: nothing can be shed (the rebuilt request is no smaller than the refused
            one and no compaction is due); the message gives the figures.
        ValueError: the agent has no limits (``limits=None``): nothing to correct.
    """
    config, resolved = settings_of(agent, config, limits)
    if resolved is None:
        raise ValueError("rebuild_after_miss needs the model's limits; got limits=None")
    state = new_state(events, agent, config, resolved, turn_id=turn_id)
    refused = build_from_state(state, turn_id=turn_id, step=step)
    index = state.turn_index.get(turn_id, len(state.turns) - 1)
    sent_chars = state.chars(index, step)
    output_tokens = min(state.reserve, refused.request.max_output_tokens) or refused.request.max_output_tokens
    correction = learn_from_miss(
        resolved,
        sent_chars=sent_chars,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        window_tokens=window_tokens,
        over_by_tokens=over_by_tokens,
    )
    again = new_state(events, agent, config, correction.limits, turn_id=turn_id)
    again.recorded = (correction.prompt_tokens, sent_chars)  # the refused request, as the server counted it
    built = build_from_state(again, turn_id=turn_id, step=step)
    refused_chars = request_chars(refused.request)
    if built.compaction is None and request_chars(built.request) >= refused_chars:
        # the shrinks shed nothing: the oldest history, trimmed whole, is the last resort
        said = ", ".join(
            f"{name} {value}"
            for name, value in (("prompt", prompt_tokens), ("window", window_tokens), ("over by", over_by_tokens))
            if value is not None
        )
        full = ContextFullError(
            f"turn {turn_id!r} step {step}: the model's server refused the request as over its context window "
            f"({said + ' tokens' if said else 'no figures given'}; estimated {refused.size_tokens} of "
            f"{refused.window_tokens} tokens with the output reserve) and nothing more can be shed: the running "
            "turn alone is too large for this model. Nothing was sent again."
        )
        try:
            trimmed = trim_request(built.request, correction.limits, output_reserve=output_tokens, note=TRIMMED_NOTE)
        except ContextFullError:
            raise full from None
        if request_chars(trimmed) >= refused_chars:
            raise full
        built = dataclasses.replace(built, request=trimmed, fits=True)
    return built, correction


def request_after_miss(
    events: Sequence[Any],
    agent: Agent,
    *,
    turn_id: str,
    step: int,
    prompt_tokens: int | None = None,
    window_tokens: int | None = None,
    over_by_tokens: int | None = None,
) -> ChatRequest:
    """The request sent once more after a window miss: :func:`rebuild_after_miss`'s context, trimmed
    whole from the oldest history under the corrected limits when it still does not fit (no
    summary is asked for in between: the call is being answered now).

    The agent loop sends it, and records the server's figures in the output's
    ``attributes["window_miss"]``; a rebuild of that call (:func:`agentstream.steps.replay.rebuild_calls`)
    calls this with the same figures, so the fingerprint is the same.

    Raises:
        ContextFullError: nothing can be shed (the message gives the figures).
    """
    built, correction = rebuild_after_miss(
        events,
        agent,
        turn_id=turn_id,
        step=step,
        prompt_tokens=prompt_tokens,
        window_tokens=window_tokens,
        over_by_tokens=over_by_tokens,
    )
    if built.fits:
        return built.request
    return trimmed_request(built, dataclasses.replace(agent, model_limits=correction.limits))


TRIMMED_NOTE = "Earlier messages of this conversation were left out to fit the model's context window."


def trimmed_request(built: BuiltContext, agent: Agent, *, limits: LimitsArg = FROM_AGENT) -> ChatRequest:
    """A request that fits the window, by trimming the oldest history whole (the last resort).

    For when a compaction failed: the history keeps whole tool-call units, starts on a user
    message, always holds the running turn whole (see :func:`trim_request`), and the system
    prompt says that earlier messages were left out.

    Raises:
        ContextFullError: the running turn alone does not fit (the message gives the sizes).
    """
    config, resolved = settings_of(agent, None, limits)
    if built.fits or resolved is None:
        return built.request
    try:
        return trim_request(
            built.request, resolved, output_reserve=config.policy.output_reserve.count, note=TRIMMED_NOTE
        )
    except ContextFullError as exc:
        raise ContextFullError(
            f"turn {built.turn_id!r} step {built.step}: the summary failed and trimming cannot help: {exc}"
        ) from None


def build_messages(events: Sequence[Any], *, upto_turn: str | None = None) -> tuple[Message, ...]:
    """Trace events → the history messages, whole (no limits, default settings).

    Args:
        events: the trace's events, oldest first.
        upto_turn: show only the turns up to and including this one; None shows every turn.

    Raises:
        UnrenderedEventError: an event type that no rule renders.
    """
    state = ContextFold(_PLAIN_AGENT, ContextConfig(), None, hidden=hidden_for(rolled_back(events), upto_turn))
    state.feed(events)
    index = state.turn_index.get(upto_turn, len(state.turns) - 1) if upto_turn is not None else len(state.turns) - 1
    return tuple(state.messages(index)) if index >= 0 else ()


def reopen_result(events: Sequence[Any], agent: Agent, turn_id: str, call: ToolCall) -> ToolOutput | None:
    """The result of a call of the agent's reopen tool, or None when ``call`` is not one.

    The agent loop records it like any result (the reopen tool runs nowhere else): source
    numbers become element ids and handles become call ids, checked against the trace.
    An app tool of the same name wins: then this returns None.
    """
    config, _ = settings_of(agent)
    reopen = config.policy.reopen
    if reopen is None or call.name != reopen.name or agent.tool(call.name) is not None:
        return None
    return resolve_reopen(call, turn_id, new_state(events, agent, config, None, turn_id=turn_id))


def tool_definitions(agent: Agent) -> tuple[ToolDefinition, ...]:
    """The agent's tools, in declaration order (stable, so prompt caches survive)."""
    return tuple(ToolDefinition(name=t.name, description=t.description, parameters=t.parameters) for t in agent.tools)


_PLAIN_AGENT = Agent(name="_history", system_prompt="")
