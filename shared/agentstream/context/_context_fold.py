"""The folded state of a trace: what the builder needs, updated one event at a time.

:class:`ContextFold` reads a trace's events in order and keeps the turns, the results (by call
id and by handle), the element numbering, the citations, the compaction in effect, the form of
each result and the estimated size of the context, with every size kept up to date as events
arrive. At each model output it first judges the call that output answered (the shrinks that
call applied), so the forms of the next call follow from the whole trace, and it costs time in
proportion to the events added. The per-worker cache keeps one state per trace.

The rules it keeps: turns in the order of their inputs; each turn's events under it; a tool
result counts only if appended before its turn ended, and the first result per call id wins;
a call without a result gets a synthetic one; an empty reply is not replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import msgspec

from agentstream.context._context_fold_parts import (
    MISSING_CHARS,
    Change,
    Output,
    Slot,
    Turn,
    record_only,
)
from agentstream.context.compaction import summary_section
from agentstream.context.elements import Numbering
from agentstream.context.forms.shorten import COMPRESSED, FULL, STUBBED, Form
from agentstream.context.limits import (
    MESSAGE_OVERHEAD_CHARS,
    TOOL_CALL_OVERHEAD_CHARS,
    WINDOW_MISS,
    ModelLimits,
    corrected_tokens,
    learn_from_miss,
    message_chars,
    plausible_prompt_tokens,
    text_chars,
    tools_chars,
)
from agentstream.context.policy import ALWAYS, CURRENT_TURN, NEVER, cited
from agentstream.context.render import (
    ContextConfig,
    EventFilter,
    ResultRenderer,
    assistant_message,
    check_rendered,
    declared_order,
    input_message,
    missing_result,
)
from agentstream.context.reopen import derive_reopened, is_reopen_output
from agentstream.context.request import AssistantMessage, Message, ToolDefinition, offered_definitions
from agentstream.context.shrink import judge, steps_of
from agentstream.declarations.agents import Agent, ToolChoice
from agentstream.errors import UnrenderedEventError
from agentstream.wire.codec import gc_paused
from agentstream.wire.events import (
    ApprovalDecided,
    Compaction,
    ModelOutput,
    ToolOutput,
    ToolsOffered,
    TurnEnded,
    TurnFailed,
    TurnInput,
    UnknownEvent,
)

COMPRESSED_FUTILE = 1 << COMPRESSED


def _count(value: object) -> int | None:
    """A token figure recorded in an output's attributes, or None when it is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def usage_recorded(
    event: ModelOutput, limits: ModelLimits, sent_chars: int, reserve: int, recorded: tuple[int, int] | None
) -> tuple[int, int] | None:
    """The prompt token count that corrects the size estimate after a model output (pure).

    A window miss recorded on the output (:data:`WINDOW_MISS`: the request was refused as over
    the window and sent again smaller) counts the refused request as the server did
    (:func:`learn_from_miss`); else the output's ``usage.prompt_tokens``, when plausible for the
    request (an under-report corrects nothing). Either only when the output is of ``limits``'
    model (or ``limits`` names none).

    Args:
        event: the model output.
        limits: the model's limits.
        sent_chars: the characters of the request it answered, as built.
        reserve: the output budget the request asked for, in tokens.
        recorded: the correction in effect, kept when the output tells nothing.

    Returns:
        ``(prompt_tokens, sent_chars)``, or ``recorded``.
    """
    if limits.model is not None and limits.model != event.model:
        return recorded
    prompt_tokens = event.usage.prompt_tokens
    if prompt_tokens is not None and plausible_prompt_tokens(prompt_tokens, sent_chars, limits):
        recorded = (prompt_tokens, sent_chars)
    miss = event.attributes.get(WINDOW_MISS) if event.attributes else None
    if isinstance(miss, dict):
        # sent again smaller after a window miss: its usage counts the smaller request, so the
        # refused one (this call as built) is counted as the server did
        counted = learn_from_miss(
            limits,
            sent_chars=sent_chars,
            output_tokens=reserve,
            prompt_tokens=_count(miss.get("prompt_tokens")),
            window_tokens=_count(miss.get("window_tokens")),
            over_by_tokens=_count(miss.get("over_by_tokens")),
        ).prompt_tokens
        recorded = (counted, sent_chars)
    return recorded


def edited_result(result: ToolOutput, arguments: str) -> ToolOutput:
    """The result of a call a person approved with other arguments than the model wrote, as the
    model sees it: its text begins with a line that says so and gives the arguments it ran with
    (the model's own call keeps its arguments in the context; without the line the result would
    seem to answer them)."""
    note = f"[A person approved this call with edited arguments; it ran with: {arguments}]"
    return msgspec.structs.replace(result, text=f"{note}\n{result.text}" if result.text else note)


class ContextFold:
    """The incremental fold of one trace for one agent's settings and one model's limits.

    Args:
        agent: the agent whose calls are built (system prompt, tools, passes).
        config: the builder's settings.
        limits: the model's limits, or None to shrink nothing and check no size.
        numbering: a numbering made over the whole trace beforehand (when a selection function
            hides events), or None to number elements as events arrive.
        hidden: the ids of rolled-back turns whose events this fold leaves out (a turn input's
            ``rolls_back``; see :func:`agentstream.context.builder.hidden_for`): every event with
            such a ``turn_id`` but a ``tools_offered`` or a ``compaction`` (they hold for the
            calls after them, whichever turn recorded them).

    Attributes:
        rollbacks: the turns named by the ``rolls_back`` of the inputs folded so far.
    """

    def __init__(
        self,
        agent: Agent,
        config: ContextConfig,
        limits: ModelLimits | None,
        numbering: Numbering | None = None,
        hidden: frozenset[str] = frozenset(),
    ):
        self.hidden = hidden
        self.rollbacks: set[str] = set()
        # call id → the arguments a person approved it with, until its result is folded (see _result)
        self.edited: dict[str, str] = {}
        self.hidden_at: dict[str, int] = {}  # a hidden turn → the index of the turn folded after it
        self.agent = agent
        self.config = config
        self.policy = config.policy
        self.limits = limits
        self.prenumbered = numbering is not None
        self.numbering = numbering if numbering is not None else Numbering()
        self.renderer = ResultRenderer(config, limits, self.numbering)
        self.filter = config.select if isinstance(config.select, EventFilter) else None
        self.turns: list[Turn] = []
        self.turn_index: dict[str, int] = {}
        self.ended: set[str] = set()
        self.results: dict[str, Slot] = {}
        self.slots: list[Slot] = []
        self.exhausted: tuple[Any, ...] | None = (
            None  # the last pass tried in full and not made: (its key, chars, chars freed, planned)
        )
        self.cursors: dict[int, Any] = {}  # id(shrink) → its candidates (see shrink.Candidates)
        # the last pass not made: (its key, at most the chars it could free, each planned result's chars)
        self.reverted: tuple[tuple[Any, ...], int, dict[Slot, int]] | None = None
        self.recalls = 0  # model outputs that called a call id an earlier output had called
        self.placements = 0  # results placed under their calls
        self.rescans = 0  # times the prefix shrinks' candidates were dropped to be read again
        self.scanned_mark: tuple[int, int, int, int] | None = None  # see shrink._units_mark
        # the messages of the turns before the current one, kept between calls (see messages()):
        # the first turn they start at, each turn's end in the list, and the lowest turn whose
        # messages changed since (every turn.version bump lowers it)
        self.prefix: list[Message] = []
        self.prefix_ends: list[int] = []
        self.prefix_start = -1
        self.dirty_from = 0
        self.cited_floors_only = all(floor.applies is cited for floor in self.policy.protect)
        self.cited_lift = max((floor.form for floor in self.policy.protect), default=FULL)
        self.handle_index: dict[str, Slot] = {}
        # call id → the first output that made a call still without a result, and the later ones
        self.places: dict[str, Output] = {}
        self.more_places: dict[str, list[Output]] = {}
        self.rounds: list[list[str]] = []
        self.cited: set[str] = set()
        self.forms: dict[str, Form] = {}
        self.forms_view = MappingProxyType(self.forms)
        self.compaction: Compaction | None = None
        self.kept_from = 0
        self.total_chars = 0
        self.hidden_chars = 0
        self.total_reasoning = 0
        self.hidden_reasoning = 0
        self.calls: list[ModelOutput] = []  # every model output, replayed or not
        self.recorded: tuple[int, int] | None = None
        self.last_chars = 0
        self.pending: list[tuple[Message, ...]] = []
        self.count = 0
        self.own_tool_defs = tuple(
            ToolDefinition(name=t.name, description=t.description, parameters=t.parameters)
            for t in declared_order(agent)
        )
        self.per_turn_tools = agent.declared is not None  # the turns' tool states decide what each offers
        reopen = self.policy.reopen
        self.reopen_def = reopen.definition() if reopen is not None and agent.tool(reopen.name) is None else None
        self.reopen_name = reopen.name if reopen is not None else None
        self._set_tools(self.own_tool_defs)
        self._system_chars: tuple[str | None, int] = (None, 0)  # the last system text measured (system_chars)
        self.reasoning_never = self.policy.reasoning == NEVER
        self._summarised: tuple[Compaction | None, str | None, str] = (None, None, "")
        self.thresholds: tuple[int, int, int] | None = None
        self.lowest = 0  # the size (tokens) under which no shrink runs
        self.reserve = self.policy.output_reserve.count
        min_gain = self.policy.min_gain
        self.min_gain_tokens = limits.tokens(min_gain) if limits is not None and min_gain is not None else None
        if limits is not None:
            start_at, target = limits.tokens(self.policy.start_at), limits.tokens(self.policy.target)
            lowest = start_at
            for shrink in self.policy.shrink:
                when = getattr(shrink, "when", None)
                if when is not None:
                    lowest = min(lowest, limits.tokens(when))
            self.thresholds = (start_at, target, lowest)
            self.lowest = lowest
        self.steps = steps_of(self.policy, limits) if limits is not None else ()
        self.prefix_only: dict[tuple[int, ...], bool] = {}  # by running shrinks: all built-in prefix ones
        self.prefix_units = frozenset(step.shrink.where.unit for step in self.steps if step.stop is not None)

    # --- feeding events ------------------------------------------------------------------------

    def feed(self, events: Sequence[Any]) -> None:
        """Fold events (the trace's next events, in order) into the state.

        The cyclic garbage collector is paused meanwhile: folding allocates many small objects
        that live on, and full collections would make a long trace's fold quadratic.
        """
        with gc_paused():
            self._feed(events)

    def _feed(self, events: Sequence[Any]) -> None:
        # the hot loop: a stored tool result or model output is folded here; every other event
        # (and any subclass of these) in _other (see its docstring for the order of the checks)
        numbering = None if self.prenumbered else self.numbering
        keeps = self.filter.keeps if self.filter is not None else None
        result, output, other = self._result, self._output, self._other
        count = self.count
        hidden = self.hidden
        try:
            for event in events:
                count += 1
                kind = type(event)  # the stored types first, by identity; then any subclass
                if hidden and kind is not ToolsOffered and kind is not Compaction and self._hides(event):
                    continue
                if kind is ToolOutput:
                    if numbering is not None and event.elements:
                        numbering.add(event.elements, event.name)
                    if keeps is None or keeps(event):
                        result(event)
                elif kind is ModelOutput:
                    if keeps is None or keeps(event):
                        output(event)
                elif kind is TurnEnded or kind is TurnFailed:  # they carry no elements
                    if keeps is None or keeps(event):
                        self._ending(event)
                elif kind is TurnInput:  # as _other would, without the calls
                    if event.rolls_back is not None:
                        self.rollbacks.add(event.rolls_back)
                    if numbering is not None:
                        numbering.add_event(event)
                    if keeps is None or keeps(event):
                        self._input(event)
                else:
                    other(event, kind, numbering, keeps)
        finally:
            self.count = count

    def _other(self, event: Any, kind: type, numbering: Numbering | None, keeps: Callable[[Any], bool] | None) -> None:
        """Fold an event of another type than the stored ones :meth:`_feed` folds itself (tools
        offered, a compaction, a record-only or an app's own event, or any subclass of the wire's).

        In order: the MCP tools offered to the agent from here on (never filtered out); else the
        rollback a turn input names is noted and the event's elements numbered, whether or not
        the filter keeps it; then a kept event is folded by its class: a stored turn input by
        identity, then each of the wire's events by ``isinstance``, a record-only event not at
        all, any other by its renderer (:meth:`_app_event`).
        """
        if kind is ToolsOffered:
            if event.agent == self.agent.name:
                self._set_tools(self.own_tool_defs + offered_definitions(event))
            return
        if isinstance(event, TurnInput) and event.rolls_back is not None:
            self.rollbacks.add(event.rolls_back)
        if numbering is not None:
            numbering.add_event(event)
        if keeps is not None and not keeps(event):
            return
        if kind is TurnInput:
            self._input(event)
        elif isinstance(event, ModelOutput):
            self._output(event)
        elif isinstance(event, ToolOutput):
            self._result(event)
        elif isinstance(event, TurnInput):
            self._input(event)
        elif isinstance(event, (TurnEnded, TurnFailed)):
            self._ending(event)
        elif isinstance(event, Compaction):
            self._compaction(event)
        elif isinstance(event, ApprovalDecided):
            if event.approved and event.arguments is not None:  # the result shows it ran with them
                self.edited[event.call_id] = event.arguments
        elif not record_only(event):
            self._app_event(event)

    def _hides(self, event: Any) -> bool:
        """Whether ``event`` is of a hidden (rolled-back) turn, noting where a hidden input was."""
        turn_id = getattr(event, "turn_id", None)
        if turn_id not in self.hidden:
            return False
        if isinstance(event, TurnInput):
            if event.rolls_back is not None:
                self.rollbacks.add(event.rolls_back)
            self.hidden_at.setdefault(turn_id, len(self.turns))
        return True

    def _set_tools(self, defs: tuple[ToolDefinition, ...]) -> None:
        """The tools the calls offer from now on (the agent's own, then its MCP servers' as recorded)."""
        self.tool_defs = defs
        self.tools_chars = tools_chars(defs)
        self.reopen_chars = tools_chars((*defs, self.reopen_def)) - self.tools_chars if self.reopen_def else 0

    def _show(self, elements: Sequence[Any]) -> str:
        return self.renderer.show(elements, None)

    def _input(self, event: TurnInput) -> None:
        if event.turn_id in self.turn_index:
            return
        turn = Turn(
            len(self.turns), event, input_message(event, self.agent, self._show), len(self.rounds), len(self.slots)
        )
        if self.per_turn_tools or event.tools is not None:  # the agent's own tools, and its MCP tools declared off
            turn.off = self.agent.off_tools(event)
        self.turn_index[event.turn_id] = turn.index
        self.turns.append(turn)
        self._add_chars(turn, turn.chars, counted=False)
        for messages in self.pending:
            self._append_item(turn, messages)
        self.pending.clear()

    def _output(self, event: ModelOutput) -> None:
        """Fold a model output: judge the call it answered (the shrinks it applied) and correct the
        size estimate by its usage (:func:`usage_recorded`), with limits; count it as a call; then,
        when it is shown, note what it cites and lay it out in its turn under its tool calls (an
        empty reply is not replayed)."""
        index = self.turn_index.get(event.turn_id)
        if index is None:
            return
        limits = self.limits
        if limits is not None:
            # judge the call this output answered (most calls are under every threshold: checked here)
            chars = self.chars(index, event.step)
            if corrected_tokens(chars, limits, self.recorded) + self.reserve > self.lowest:
                judge(self, index, event.step, len(self.calls), speculative=False, chars=chars)
            else:
                self.last_chars = chars
            if event.usage.prompt_tokens is not None or event.attributes:  # else it tells nothing
                self.recorded = usage_recorded(event, limits, self.last_chars, self.reserve, self.recorded)
        self.calls.append(event)
        if not event.include_in_messages:  # recorded, counted as a call, never shown (nor its results)
            return
        content = event.content
        if self.config.citations is not None and content:
            self._note_cited(content)
        tool_calls = event.tool_calls
        if not tool_calls and not content.strip():  # an empty reply is not replayed (is_empty_reply)
            return
        turn = self.turns[index]
        output = Output(event, index)
        chars = (
            text_chars(content) + MESSAGE_OVERHEAD_CHARS
        )  # the message's characters (limits.message_chars) and its results'
        if tool_calls:
            chars += self._calls_chars(event, turn, output)
        turn.items.append(output)
        if event.reasoning:
            reasoning = text_chars(event.reasoning)
            turn.reasoning_chars += reasoning
            self.total_reasoning += reasoning
            if index < self.kept_from:
                self.hidden_reasoning += reasoning
        turn.chars += chars  # _add_chars, inline
        turn.version += 1
        if turn.index < self.dirty_from:
            self.dirty_from = turn.index
        self.total_chars += chars
        if index < self.kept_from:
            self.hidden_chars += chars

    def _note_cited(self, content: str) -> None:
        """Note the elements ``content`` cites (by the citation style's marks)."""
        style = self.config.citations
        assert style is not None
        element_of, cited = self.numbering.element_id, self.cited
        for number in style.read(content):
            element_id = element_of(number)
            if element_id is not None:
                cited.add(element_id)

    def _calls_chars(self, event: ModelOutput, turn: Turn, output: Output) -> int:
        """Lay out a model output's tool calls in a new round: each call's result (recorded
        already) is placed under it, a call without one waits for its result here.

        Returns:
            The characters of the calls and of the results shown under them (a call still
            without a result: its missing result's).
        """
        turn.tool_steps.append(event.step)
        rounds = self.rounds
        output.round = len(rounds)
        rounds.append([])
        places = self.places
        results = self.results
        chars = 0
        for call in event.tool_calls:
            call_id = call.id
            chars += len(call_id) + len(call.name) + text_chars(call.arguments) + TOOL_CALL_OVERHEAD_CHARS
            slot = results.get(call_id)
            if slot is None:  # no result yet: it will show under this call
                if call_id in places:
                    self.recalls += 1
                    self.more_places.setdefault(call_id, []).append(output)
                else:
                    places[call_id] = output
                chars += MISSING_CHARS + len(call_id)  # missing_chars(call_id)
                continue
            chars += slot.chars
            if slot.turn is None:  # a result recorded before its call
                self._place(slot, turn, output)
                if self.agent.resets_on_answer and self.agent.answers_request(slot.output):
                    turn.answer_steps.append(event.step)
            else:  # a call id called again: the result shows under this call too
                self.recalls += 1
                if slot.more is None:
                    slot.more = []
                slot.more.append(output)
        return chars

    def _place(self, slot: Slot, turn: Turn, output: Output) -> None:
        if turn is not self.turns[-1] or 0 <= output.round < len(self.rounds) - 1:
            self.cursors.clear()  # a result placed in an older turn or round: candidates are read again
            self.rescans += 1
        slot.turn = turn
        self.placements += 1
        turn.handles.append(slot.handle)
        if output.round >= 0:
            self.rounds[output.round].append(slot.handle)

    def _result(self, event: ToolOutput) -> None:
        call_id = event.call_id
        results = self.results
        if call_id in results or event.turn_id in self.ended or event.late:
            return
        output = event
        if self.edited and call_id in self.edited:
            output = event = edited_result(event, self.edited.pop(call_id))
        if event.name == self.reopen_name and is_reopen_output(event, self.policy):
            output = derive_reopened(event, self)
        first = self.places.pop(call_id, None)
        if first is not None and self.agent.resets_on_answer and self.agent.answers_request(event):
            self.turns[first.turn].answer_steps.append(first.event.step)
        slots = self.slots
        handle = f"r{len(slots) + 1}"
        slot = Slot(handle, output)
        if self.limits is not None:
            chars, compressed, slot.chars_stubbed = self.renderer.estimates(output, handle, slot)
            slot.chars = slot.chars_full = chars
            slot.chars_compressed = compressed
            if not output.elements and compressed >= chars:
                # no floor can lift an element of it: compressing it never frees anything
                slot.futile = COMPRESSED_FUTILE
        results[call_id] = slot
        slots.append(slot)
        self.handle_index[handle] = slot
        if first is not None:
            turns = self.turns
            turn = turns[first.turn]
            if (
                first.turn == len(turns) - 1 and first.round == len(self.rounds) - 1
            ):  # under the newest call: _place, inline
                slot.turn = turn
                self.placements += 1
                turn.handles.append(handle)
                self.rounds[first.round].append(handle)
            else:
                self._place(slot, turn, first)
            slot.more = self.more_places.pop(call_id, None)
            delta = slot.chars - MISSING_CHARS - len(call_id)  # missing_chars(call_id)
            kept_from = self.kept_from
            for place in (first, *slot.more) if slot.more else (first,):  # _add_chars, inline
                turn = turns[place.turn]
                turn.chars += delta
                turn.version += 1
                if turn.index < self.dirty_from:
                    self.dirty_from = turn.index
                self.total_chars += delta
                if turn.index < kept_from:
                    self.hidden_chars += delta

    def _ending(self, event: TurnEnded | TurnFailed) -> None:
        """A turn's ending; an answer that a tool's result gave (``answer_call``) shows as the
        assistant's message after that result, as the model's own answer would."""
        self.ended.add(event.turn_id)
        if isinstance(event, TurnEnded) and event.answer_call:
            index = self.turn_index.get(event.turn_id)
            if index is not None:
                self._append_item(self.turns[index], (AssistantMessage(content=event.answer),))

    def _compaction(self, event: Compaction) -> None:
        index = self.turn_index.get(event.kept_from_turn)
        if index is None:  # a rolled-back turn kept first: the kept part starts at the turn after it
            index = self.hidden_at.get(event.kept_from_turn)
        if index is None:
            return
        previous = self.kept_from if self.compaction is not None else 0
        self.compaction = event
        self.kept_from = index
        if index >= previous:  # the kept part only moves on: add the turns it now leaves out
            self.hidden_chars += sum(t.chars for t in self.turns[previous:index])
            self.hidden_reasoning += sum(t.reasoning_chars for t in self.turns[previous:index])
        else:
            self.hidden_chars = sum(t.chars for t in self.turns[:index])
            self.hidden_reasoning = sum(t.reasoning_chars for t in self.turns[:index])

    def _app_event(self, event: Any) -> None:
        if isinstance(event, UnknownEvent):
            raise UnrenderedEventError(
                f"the trace holds an event of type {event.stored_type!r}, which this app does not register: "
                "add its class to App(event_types=...) and a renderer to the agent's ContextConfig.renderers "
                "(or leave it out with ContextConfig.select)"
            )
        render = None
        for cls in type(event).__mro__:
            render = self.config.renderers.get(cls)
            if render is not None:
                break
        if render is None:
            raise UnrenderedEventError(
                f"no renderer for event type {type(event).__name__}: give one in the agent's "
                "ContextConfig.renderers, or leave the type out with ContextConfig.select"
            )
        messages = check_rendered(event, render(event, self._show))
        if not messages:
            return
        index = self.turn_index.get(getattr(event, "turn_id", None) or "", len(self.turns) - 1)
        if index < 0:
            self.pending.append(messages)
            return
        self._append_item(self.turns[index], messages)

    def _append_item(self, turn: Turn, messages: tuple[Message, ...]) -> None:
        turn.items.append(messages)
        self._add_chars(turn, sum(message_chars(m) for m in messages))

    def _add_chars(self, turn: Turn, delta: int, counted: bool = True) -> None:
        if counted:
            turn.chars += delta
        turn.version += 1
        if turn.index < self.dirty_from:
            self.dirty_from = turn.index
        self.total_chars += delta
        if turn.index < self.kept_from:
            self.hidden_chars += delta

    # --- sizes ----------------------------------------------------------------------------------

    def with_reasoning(self, turn_index: int, current: int) -> bool:
        mode = self.policy.reasoning
        return mode == ALWAYS or (mode == CURRENT_TURN and turn_index == current)

    def visible_from(self, current: int) -> int:
        return min(self.kept_from, current) if self.compaction is not None else 0

    def compaction_shown(self, current: int) -> bool:
        return self.compaction is not None and self.kept_from > 0 and self.kept_from <= current

    def offers_reopen(self, current: int) -> bool:
        return self.reopen_def is not None and (bool(self.forms) or self.compaction_shown(current))

    def base_system(self, current: int) -> str:
        """The agent's system prompt for the calls of turn ``current`` (an index; -1 before any
        turn), written from the turn's input once (:meth:`agentstream.declarations.agents.Agent.system_text`).

        Raises:
            PromptError: the agent's prompt could not be written for the turn.
        """
        if 0 <= current < len(self.turns):
            turn = self.turns[current]
            text = turn.system
            if text is None:
                text = turn.system = self.agent.system_text(turn.input)
            return text
        return self.agent.system_text(None)

    def system_prompt(self, current: int) -> str:
        """The system message of a call in turn ``current``: its base, with the summary when one shows."""
        base = self.base_system(current)
        if self.compaction_shown(current):
            assert self.compaction is not None
            held = self._summarised
            if held[0] is not self.compaction or held[1] is not base:
                held = self._summarised = (self.compaction, base, base + summary_section(self.compaction))
            return held[2]
        return base

    def system_chars(self, current: int) -> int:
        """Characters of the system message of a call in turn ``current`` (with its overhead)."""
        text = self.system_prompt(current)
        held = self._system_chars
        if held[0] is not text:
            held = self._system_chars = (text, text_chars(text) + MESSAGE_OVERHEAD_CHARS)
        return held[1]

    def tool_choice(self, current: int, step: int) -> ToolChoice:
        """The tool choice of the call at ``step`` of turn ``current`` (an index): the agent's,
        given how many earlier calls of the turn called tools (``Agent.tool_choice_at``), counted
        as :func:`agentstream.steps.decision.passes_before` counts them; ``none`` when the turn offers no tool."""
        turn = self.turns[current] if 0 <= current < len(self.turns) else None
        if turn is None or not turn.tool_steps:
            choice = self.agent.tool_choice_at(0, step)
        else:
            after = max(
                (s for s in turn.answer_steps if s < step), default=-1
            )  # the count starts again after an answer
            passes = sum(1 for s in turn.tool_steps if after < s < step)
            choice = self.agent.tool_choice_at(passes, step)
        if choice != "none" and turn is not None and turn.off and not self.turn_tools(current)[0]:
            return "none"
        return choice

    def turn_tools(self, current: int) -> tuple[tuple[ToolDefinition, ...], int]:
        """The tool definitions the calls of turn ``current`` offer (the agent's own that the turn
        does not turn off, in declaration order, then its MCP tools) and their characters."""
        turn = self.turns[current] if 0 <= current < len(self.turns) else None
        if turn is None or not turn.off:
            return self.tool_defs, self.tools_chars
        held = turn.tools
        if held is None or held[0] is not self.tool_defs:  # made once per turn and tool list
            defs = tuple(d for d in self.tool_defs if d.name not in turn.off)
            held = turn.tools = (self.tool_defs, (defs, tools_chars(defs)))
        return held[1]

    def tools_for(self, current: int, step: int) -> tuple[ToolDefinition, ...]:
        if self.tool_choice(current, step) == "none":
            return ()
        defs = self.turn_tools(current)[0]
        if self.offers_reopen(current):
            assert self.reopen_def is not None
            return (*defs, self.reopen_def)
        return defs

    def tools_offered(self, current: int, step: int) -> bool:
        """Whether the call at ``step`` of turn ``current`` offers tools (see :meth:`tool_choice`)."""
        return self.tool_choice(current, step) != "none"

    def chars(self, current: int, step: int) -> int:
        """Characters of the request of a call in turn ``current`` (an index) at ``step``."""
        if self.reasoning_never and len(self.turns) - 1 == current and current >= 0:
            # the usual case: no queued turn, no reasoning; a summary only moves the start
            if self.compaction is None:
                history, reopen = self.total_chars, bool(self.forms)
            elif self.kept_from <= current:
                history = self.total_chars - self.hidden_chars
                reopen = True if self.kept_from > 0 else bool(self.forms)  # the summary shows, or not
            else:
                history = None
            if history is not None:
                system = self.system_chars(current)
                if self.tool_choice(current, step) != "none":
                    own = self.turn_tools(current)[1]
                    return system + own + (self.reopen_chars if self.reopen_def is not None and reopen else 0) + history
                return system + history
        start = self.visible_from(current)
        history = self.total_chars
        reasoning = self.total_reasoning
        if start == self.kept_from:
            history -= self.hidden_chars
            reasoning -= self.hidden_reasoning
        else:
            history -= sum(t.chars for t in self.turns[:start])
            reasoning -= sum(t.reasoning_chars for t in self.turns[:start])
        for turn in reversed(self.turns):
            if turn.index <= current:
                break
            history -= turn.chars
            reasoning -= turn.reasoning_chars
        mode = self.policy.reasoning
        if mode == CURRENT_TURN and current >= start and self.turns:
            history += self.turns[current].reasoning_chars
        elif mode == ALWAYS:
            history += reasoning
        system = self.system_chars(current)
        tools = 0
        if self.tool_choice(current, step) != "none":
            tools = self.turn_tools(current)[1] + (self.reopen_chars if self.offers_reopen(current) else 0)
        return system + tools + history

    def size(self, current: int, step: int) -> int:
        """Estimated tokens of the call (prompt, corrected by recorded usage, plus output reserve)."""
        assert self.limits is not None
        prompt = corrected_tokens(self.chars(current, step), self.limits, self.recorded)
        return prompt + self.policy.output_reserve.count

    # --- forms ----------------------------------------------------------------------------------

    def render(self, slot: Slot, form: Form, element_forms: tuple[Form, ...] | None) -> Any:
        """A slot's message in a form, laid out once per form and floors.

        Raises:
            ShortenError: a shorten function changed the result's elements or its error.
        """
        renders = slot.renders
        if renders is None:
            renders = slot.renders = {}
        key = ("message", form, element_forms)
        message = renders.get(key)
        if message is None:
            message = renders[key] = self.renderer.message(slot.output, slot.handle, form, element_forms)
        return message

    def estimate(self, slot: Slot, form: Form, element_forms: tuple[Form, ...] | None) -> int:
        """A slot's estimated characters in a form (see :meth:`ResultRenderer.estimate`), once per form and floors.

        Raises:
            ShortenError: a shorten function changed the result's elements or its error.
        """
        if element_forms is None:  # no element lifted: kept on the slot
            if form == COMPRESSED:
                chars = slot.chars_compressed
                if chars < 0:
                    chars = slot.chars_compressed = self.renderer.estimate(slot.output, slot.handle, form, None, slot)
            elif form == STUBBED:
                chars = slot.chars_stubbed
                if chars < 0:
                    chars = slot.chars_stubbed = self.renderer.estimate(slot.output, slot.handle, form, None, slot)
            else:
                chars = slot.chars_full
                if chars < 0:
                    chars = slot.chars_full = self.renderer.estimate(slot.output, slot.handle, form, None, slot)
            return chars
        renders = slot.renders
        if renders is None:
            renders = slot.renders = {}
        key = ("chars", form, element_forms)
        known: int | None = renders.get(key)
        if known is None:
            known = renders[key] = self.renderer.estimate(slot.output, slot.handle, form, element_forms, slot)
        return known

    def smallest_chars(self, slot: Slot) -> int:
        """A lower bound of a slot's estimated characters in any form (a handle line alone)."""
        renderer = self.renderer
        line = min(
            text_chars(renderer.handle_line(slot.handle, slot.output.name, f)) for f in (Form.COMPRESSED, Form.STUBBED)
        )
        return line + len(slot.output.call_id) + MESSAGE_OVERHEAD_CHARS

    def message_of(self, slot: Slot) -> Any:
        """A slot's message in its current form."""
        if slot.message is None:
            slot.message = self.render(slot, slot.form, slot.element_forms)
        return slot.message

    def set_form(
        self, slot: Slot, form: Form, by: Any, at: int, element_forms: tuple[Form, ...] | None, chars: int
    ) -> Change:
        """Give a slot a form and keep every size right (its message is laid out when sent).

        Returns:
            The slot as it was (for :meth:`undo`).
        """
        change = Change(slot, slot.form, slot.by, slot.at, slot.element_forms, slot.chars)
        self.apply_form(slot, form, by, at, element_forms, chars)
        return change

    def apply_form(
        self, slot: Slot, form: Form, by: Any, at: int, element_forms: tuple[Form, ...] | None, chars: int
    ) -> None:
        """:meth:`set_form` without keeping what the slot was."""
        delta = chars - slot.chars
        slot.form, slot.by, slot.at, slot.element_forms, slot.chars = form, by, at, element_forms, chars
        slot.message = None
        if form == FULL:
            self.forms.pop(slot.handle, None)
        else:
            self.forms[slot.handle] = form
        kept_from = self.kept_from
        first = slot.turn
        if first is None:
            return
        turns = self.turns
        for turn in (first, *(turns[place.turn] for place in slot.more)) if slot.more else (first,):
            turn.chars += delta
            turn.version += 1
            if turn.index < self.dirty_from:
                self.dirty_from = turn.index
            self.total_chars += delta
            if turn.index < kept_from:
                self.hidden_chars += delta

    def apply_plan(self, slots: Sequence[Slot], call: int, keep: bool) -> list[Change]:
        """Give each slot the form the judge planned for it (its ``plan_*``) at model call ``call``.

        The same as :meth:`apply_form` for each slot, in order, then clears the plans.

        Returns:
            When ``keep``, each slot as it was (for :meth:`undo`), in order; else an empty list.
        """
        changes: list[Change] = []
        forms = self.forms
        turns = self.turns
        kept_from = self.kept_from
        total = hidden = 0
        for slot in slots:
            form, chars = slot.plan_form, slot.plan_chars
            assert form is not None
            if keep:
                changes.append(Change(slot, slot.form, slot.by, slot.at, slot.element_forms, slot.chars))
            delta = chars - slot.chars
            slot.form, slot.by, slot.at, slot.element_forms, slot.chars = (
                form,
                slot.plan_by,
                call,
                slot.plan_floors,
                chars,
            )
            slot.message = slot.plan_form = slot.plan_by = slot.plan_floors = None
            if form == FULL:
                forms.pop(slot.handle, None)
            else:
                forms[slot.handle] = form
            first = slot.turn
            if first is None:
                continue
            for turn in (first, *(turns[place.turn] for place in slot.more)) if slot.more else (first,):
                turn.chars += delta
                turn.version += 1
                if turn.index < self.dirty_from:
                    self.dirty_from = turn.index
                total += delta
                if turn.index < kept_from:
                    hidden += delta
        self.total_chars += total
        self.hidden_chars += hidden
        return changes

    def undo(self, changes: Sequence[Change]) -> None:
        """Undo form changes, newest first."""
        for change in reversed(changes):
            self.set_form(change.slot, change.form, change.by, change.at, change.element_forms, change.chars)

    # --- messages -------------------------------------------------------------------------------

    def turn_messages(self, turn: Turn, with_reasoning: bool) -> tuple[Message, ...]:
        key = (turn.version, with_reasoning)
        if turn.cache_key == key:
            return turn.cache
        messages: list[Message] = [turn.user] if turn.user is not None else []
        results = self.results
        for item in turn.items:
            if isinstance(item, Output):
                if with_reasoning and item.event.reasoning:
                    messages.append(assistant_message(item.event, True))
                else:
                    messages.append(item.message)
                for call in item.event.tool_calls:
                    slot = results.get(call.id)
                    messages.append(self.message_of(slot) if slot is not None else missing_result(call))
            else:
                messages.extend(item)
        turn.cache_key, turn.cache = key, tuple(messages)
        return turn.cache

    def messages(self, current: int) -> list[Message]:
        """The history of a call in turn ``current``: the visible turns, in order.

        The messages of the turns before ``current`` are kept between calls and only the turns
        changed since (a new result, a form change) are laid out again, so a call costs what
        changed, not the length of the history.
        """
        start = self.visible_from(current)
        prefix, ends = self.prefix, self.prefix_ends
        if start != self.prefix_start:
            prefix.clear()
            ends.clear()
            self.prefix_start = start
        valid = min(self.dirty_from, current) - start  # turns of the prefix still as laid out
        if valid < len(ends):
            keep = max(valid, 0)
            del prefix[ends[keep - 1] if keep else 0 :]
            del ends[keep:]
        self.dirty_from = len(self.turns)
        turns = self.turns
        for index in range(start + len(ends), current):
            prefix.extend(self.turn_messages(turns[index], self.with_reasoning(index, current)))
            ends.append(len(prefix))
        out = list(prefix)
        if 0 <= current < len(turns):
            out.extend(self.turn_messages(turns[current], self.with_reasoning(current, current)))
        return out

    def shrunk(self, current: int) -> list[Slot]:
        """The shortened results shown in a call in turn ``current``, in recorded order."""
        if not self.forms:  # every result shown is in full
            return []
        start = self.visible_from(current)
        first = self.turns[start].first_slot if start < len(self.turns) else len(self.slots)
        return [
            s for s in self.slots[first:] if s.form != FULL and s.turn is not None and start <= s.turn.index <= current
        ]

    def last_assistant(self) -> AssistantMessage | None:
        for turn in reversed(self.turns):
            for item in reversed(turn.items):
                if isinstance(item, Output):
                    return item.message
        return None
