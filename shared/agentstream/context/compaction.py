"""Compaction boundaries: what a summary replaces, and how a context shows it.

A compaction replaces whole turns, from the oldest: the kept part always starts on a turn's
input, so no cut falls between a tool call and its results, and the running turn (with the
newest user message) is never replaced. The summary shows in the system message, after the
agent's prompt; element numbers and result handles stay those of the whole trace. A second
compaction folds the earlier summary into the new one: the summary call's system message
holds the earlier summary, and only the newer summary is shown afterwards.

These are the pure functions the compaction service calls: :func:`plan_compaction` says
whether a summary is due and which turns it replaces, :func:`summary_request` builds each
summary call (budgeted to fit the window: results are shortened first, and long histories are
summarised in chunks), and :func:`compaction_event` makes the event to append.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentstream.context._context_fold_parts import Output
from agentstream.context.forms.shorten import COMPRESSED, STUBBED
from agentstream.context.layout import escape_text
from agentstream.context.limits import (
    MESSAGE_OVERHEAD_CHARS,
    ModelLimits,
    message_chars,
    text_chars,
)
from agentstream.context.policy import Compact
from agentstream.context.request import ChatRequest, Message, UserMessage
from agentstream.errors import CompactionError
from agentstream.wire.events import Compaction, Usage

if TYPE_CHECKING:
    from agentstream.context._context_fold_protocol import FoldState

SUMMARY_HEADING = "The conversation before the messages below was summarised; this summary replaces it."


def summary_section(compaction: Compaction) -> str:
    """The text added to the system prompt for a compaction's summary (escaped)."""
    return f"\n\n<conversation_summary>\n{SUMMARY_HEADING}\n{escape_text(compaction.summary.strip())}\n</conversation_summary>"


def kept_from_index(compact: Compact, current: int) -> int:
    """The index of the first turn a new summary keeps, for a call in turn ``current``.

    Only the selected turns that run on from the oldest (0, 1, 2, …) are replaced, so
    ``turns[1:]`` replaces nothing; the running turn is always kept.
    """
    run = 0
    for index in sorted(compact.where.picked(current + 1)):
        if index != run:
            break
        run += 1
    return min(run, current)


@dataclass(frozen=True)
class CompactionPlan:
    """A compaction that is due: which turns it replaces, and the summary calls to make.

    Attributes:
        turn_id: the running turn.
        kept_from_turn: the first turn shown in full after the summary.
        replaced: the turns the new summary replaces (those of an earlier summary included).
        new_turns: the turns that no summary replaced yet, in order.
        chunks: ``new_turns`` split so that each summary call fits the window.
        previous_summary: the summary that the new one folds in, or None.
    """

    turn_id: str
    kept_from_turn: str
    replaced: tuple[str, ...]
    new_turns: tuple[str, ...]
    chunks: tuple[tuple[str, ...], ...]
    previous_summary: str | None


def summary_budget_chars(state: FoldState, compact: Compact, summary_chars: int, current: int = -1) -> int:
    """Characters of history one summary call may carry: the window less the summary output,
    the instructions, the system prompt (of the calls of turn ``current``, an index) and
    ``summary_chars`` of summary so far."""
    limits = state.limits
    assert limits is not None
    fixed = (
        text_chars(state.base_system(current))
        + text_chars(instructions(compact, state))
        + 4 * MESSAGE_OVERHEAD_CHARS
        + len(SUMMARY_HEADING)
        + 32
        + summary_chars
    )
    return limits.chars_of_tokens(limits.window.count - compact.summary_output.count) - fixed


def instructions(compact: Compact, state: FoldState) -> str:
    """The user message that asks for the summary (with the citing text when the agent cites)."""
    style = state.config.citations
    if style is None:
        return compact.instructions
    return f"{compact.instructions}\n{compact.citing.replace('{citation}', style.example)}"


def plan(state: FoldState, current: int, compact: Compact) -> CompactionPlan | None:
    """The compaction of a call in turn ``current``, or None when it would replace nothing new."""
    kept = kept_from_index(compact, current)
    already = state.kept_from if state.compaction is not None else 0
    if kept <= already:
        return None
    previous = state.compaction.summary if state.compaction is not None else None
    new = [state.turns[i] for i in range(already, kept)]
    # A later chunk carries the summary written so far: at most the summary output.
    summary_room = (
        max(text_chars(previous or ""), state.limits.chars_of_tokens(compact.summary_output.count))
        if state.limits
        else 0
    )
    budget = summary_budget_chars(state, compact, summary_room, current)
    chunks: list[tuple[str, ...]] = []
    chunk: list[str] = []
    used = 0
    for turn in new:
        size = min(turn.chars, _stubbed_chars(state, turn))
        if chunk and used + size > budget:
            chunks.append(tuple(chunk))
            chunk, used = [], 0
        chunk.append(turn.turn_id)
        used += size
    if chunk:
        chunks.append(tuple(chunk))
    return CompactionPlan(
        turn_id=state.turns[current].turn_id,
        kept_from_turn=state.turns[kept].turn_id,
        replaced=tuple(t.turn_id for t in state.turns[:kept]),
        new_turns=tuple(t.turn_id for t in new),
        chunks=tuple(chunks),
        previous_summary=previous,
    )


def _stubbed_chars(state: FoldState, turn: Any) -> int:
    messages = _turn_messages_in_form(state, turn, STUBBED)
    return sum(message_chars(m) for m in messages)


def _turn_messages_in_form(state: FoldState, turn: Any, form: Any) -> list[Message]:
    """A turn's messages with every result at most in ``form`` (for summary calls)."""
    out: list[Message] = [turn.user] if turn.user is not None else []
    for item in turn.items:
        if isinstance(item, Output):
            out.append(item.message)
            for call in item.event.tool_calls:
                slot = state.results.get(call.id)
                if slot is None:
                    from agentstream.context.render import missing_result

                    out.append(missing_result(call))
                elif slot.form <= form:
                    out.append(state.message_of(slot))
                else:
                    out.append(state.renderer.message(slot.output, slot.handle, form, None))
        else:
            out.extend(item)
    return out


def summary_messages(state: FoldState, turn_ids: Sequence[str], budget_chars: int) -> list[Message]:
    """The messages of the turns a summary call reads, shortened until they fit ``budget_chars``.

    Results in their current forms first; then every result compressed; then stubbed; then the
    oldest turns are left out whole (the call still starts on a user message).
    """
    turns = [state.turns[state.turn_index[t]] for t in turn_ids]
    for form in (None, COMPRESSED, STUBBED):
        messages: list[Message] = []
        for turn in turns:
            if form is None:
                messages.extend(state.turn_messages(turn, False))
            else:
                messages.extend(_turn_messages_in_form(state, turn, form))
        if sum(message_chars(m) for m in messages) <= budget_chars:
            return messages
    from agentstream.context.trimming import SystemMessage, estimate_counter, trim_messages

    limits = state.limits
    assert limits is not None
    trimmed = trim_messages(
        messages,
        max_tokens=limits.tokens_of_chars(budget_chars),
        token_counter=estimate_counter(limits),
        strategy="last",
        start_on="user",
    )
    return [m for m in trimmed if not isinstance(m, SystemMessage)]  # none: the input holds none


def summary_request(
    state: FoldState, compaction_plan: CompactionPlan, chunk: int, summary_so_far: str | None
) -> ChatRequest:
    """The request of summary call ``chunk`` of a plan.

    The system message is the agent's prompt with the summary so far (the earlier compaction's
    for the first chunk); then the chunk's turns; then the instructions as a user message. No
    tools are offered; the output limit is the policy's ``summary_output``.
    """
    compact = state.policy.compact
    assert compact is not None and state.limits is not None
    current = state.turn_index.get(compaction_plan.turn_id, len(state.turns) - 1)
    system = state.base_system(current)
    if summary_so_far:
        system += summary_section(Compaction(summary=summary_so_far))
    budget = summary_budget_chars(state, compact, text_chars(summary_so_far or ""), current)
    messages = summary_messages(state, compaction_plan.chunks[chunk], budget)
    messages.append(UserMessage(text=instructions(compact, state)))
    return ChatRequest(
        system=system,
        messages=tuple(messages),
        tools=(),
        tool_choice="none",
        max_output_tokens=compact.summary_output.count,
        temperature=state.agent.temperature,
    )


def compaction_event(
    compaction_plan: CompactionPlan, summary: str, *, provider: str = "", model: str = "", usage: Usage | None = None
) -> Compaction:
    """The event that records a summary.

    Raises:
        CompactionError: the summary is empty.
    """
    if not summary.strip():
        raise CompactionError(
            f"turn {compaction_plan.turn_id}: the model wrote an empty summary of {len(compaction_plan.new_turns)} turns; "
            "nothing was compacted"
        )
    return Compaction(
        turn_id=compaction_plan.turn_id,
        summary=summary.strip(),
        kept_from_turn=compaction_plan.kept_from_turn,
        replaced_turns=len(compaction_plan.replaced),
        provider=provider,
        model=model,
        usage=usage if usage is not None else Usage(),
    )


def trigger_tokens(compact: Compact, limits: ModelLimits, output_reserve: int, instructions_chars: int) -> int:
    """The size (prompt plus output reserve) above which a summary is due.

    The setting's ``when``, lowered where needed so that the summary call itself still fits: the
    history, the instructions and the summary output must fit the window together.
    """
    room = (
        limits.window.count - compact.summary_output.count - limits.tokens_of_chars(instructions_chars) + output_reserve
    )
    return min(limits.tokens(compact.when), room)
