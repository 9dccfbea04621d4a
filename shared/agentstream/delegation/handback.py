"""Hand-back: an ended child trace becomes its parent's tool result (pure).

See :mod:`agentstream.delegation` for the whole flow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from agentstream.context.citations import BRACKETS
from agentstream.delegation.handoff import numbering_of
from agentstream.delegation.tool import Delegation, default_result
from agentstream.events import AnyElement, Event, ModelOutput, Source, TaskInput, ToolOutput, TurnEnded, TurnFailed, TurnInput

TIMED_OUT = "timed_out"
"""The TurnFailed code the supervisor gives a child that passed its deadline."""

# --- hand-back --------------------------------------------------------------------------------


def task_of(events: Sequence[Event]) -> TaskInput | None:
    """The TaskInput that opens a child trace, or None for a root trace."""
    first = next((e for e in events if isinstance(e, TurnInput)), None)
    return first if isinstance(first, TaskInput) else None


def ending_of(events: Sequence[Event], turn_id: str) -> TurnEnded | TurnFailed | None:
    """The first ending of a turn (a turn has one), or None while it runs."""
    return next((e for e in events if isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == turn_id), None)


def timed_out(task: TaskInput) -> TurnFailed:
    """The ending the supervisor gives a child that passed its deadline."""
    return TurnFailed(
        turn_id=task.turn_id,
        code=TIMED_OUT,
        reason=f"the subagent did not finish within its deadline of {task.deadline_s:g} s; the supervisor ended it",
    )


def hand_back(delegation: Delegation | None, events: Sequence[Event]) -> ToolOutput:
    """The parent's result of the call that opened this ended child trace.

    A child that ended with an answer gives its result (``delegation.result`` of its trace),
    checked against the task's schema, with the sources its answer cited (citation marks are
    taken out of the text; the parent shows the sources in its own numbering). A result that
    is None or empty is an ``incomplete`` error, one that does not fit the schema a
    ``schema_mismatch`` error, a child that failed, timed out or was cancelled an error named
    by its code; each carries what the child had written so far.

    Args:
        delegation: the delegation that opened the child (None when the app no longer has it:
            the default result is used).
        events: the child's trace, after its turn ended.

    Raises:
        ValueError: the trace is not a child trace, or its turn has not ended.
    """
    task = task_of(events)
    if task is None:
        raise ValueError("not a child trace: its first turn is not a TaskInput")
    ending = ending_of(events, task.turn_id)
    if ending is None:
        raise ValueError(f"the child's turn {task.turn_id!r} has not ended")
    name = task.delegation or (delegation.name if delegation else "delegation")

    def result(text: str, *, data: Any = None, error: str | None = None, elements: tuple[AnyElement, ...] = ()) -> ToolOutput:
        return ToolOutput(turn_id=task.parent_turn_id, call_id=task.call_id, name=name, text=text, data=data,
                          error=error, elements=elements)

    who = f"The {task.agent!r} subagent"
    if isinstance(ending, TurnFailed):
        partial = _partial(events)
        text = f"Error: {who} did not finish its task ({ending.code}): {ending.reason}."
        if partial:
            text += f"\nWhat it had written before it stopped (incomplete):\n{partial}"
        return result(text, error=ending.code)

    read = delegation.result if delegation is not None else default_result
    try:
        value = read(events)
    except Exception as exc:  # the app's result function failed: the parent's model hears it
        return result(f"Error: reading {who}'s result failed ({type(exc).__name__}: {exc}).", error="result_error")
    if value is None or (isinstance(value, str) and not value.strip()):
        return result(f"Error: {who} ended without a result, so the task is incomplete.", error="incomplete")

    if task.expects is not None:
        if isinstance(value, str):
            try:
                value = json.loads(_unfence(value))
            except json.JSONDecodeError as exc:
                return result(
                    f"Error: {who}'s result is not the JSON the task asked for ({exc.msg}). Its result was:\n{value}",
                    error="schema_mismatch",
                )
        problems = _schema_problems(task.expects, value)
        if problems:
            shown = json.dumps(value, sort_keys=True)
            return result(
                f"Error: {who}'s result does not fit the expected schema: {problems}. Its result was:\n{shown}",
                data=value,
                error="schema_mismatch",
            )
        return result(json.dumps(value, sort_keys=True), data=value)

    if isinstance(value, str):
        text, elements = _cited(events, value)
        return result(text, elements=elements)
    try:
        data = msgspec.to_builtins(value)
    except (TypeError, msgspec.EncodeError):
        return result(str(value))
    return result(json.dumps(data, sort_keys=True), data=data)


def _partial(events: Sequence[Event]) -> str:
    """The newest text a child's model wrote, or a count of its tool results when it wrote none."""
    for event in reversed(events):
        if isinstance(event, ModelOutput) and event.content.strip():
            return event.content.strip()
    results = sum(1 for e in events if isinstance(e, ToolOutput) and not e.late)
    return f"(no text; {results} tool result(s) gathered)" if results else ""


_MARK = re.compile(r"\s?(?:\[[^\[\]]*\]|【[^【】]*】)")


def _cited(events: Sequence[Event], text: str) -> tuple[str, tuple[AnyElement, ...]]:
    """The answer without its citation marks, and the sources they cite (each after its whole)."""
    numbering = numbering_of(events)
    if not len(numbering):
        return text, ()
    ids = numbering.ids
    cited: list[AnyElement] = []

    def strip(match: re.Match[str]) -> str:
        numbers = BRACKETS.read(match.group(0))
        if not numbers or any(n not in ids for n in numbers):
            return match.group(0)
        for n in numbers:
            element = numbering.first(ids[n])
            if element is None or not isinstance(element, Source):
                continue
            whole = numbering.first(element.ref) if element.ref else None
            for e in (whole, element):
                if e is not None and e not in cited:
                    cited.append(e)
        return ""

    return _MARK.sub(strip, text).strip(), tuple(cited)


def _unfence(text: str) -> str:
    """Text without a surrounding Markdown code fence (```json … ```), as models often add."""
    stripped = text.strip()
    match = re.fullmatch(r"```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```", stripped, flags=re.DOTALL)
    return match.group(1) if match else stripped


def _schema_problems(schema: dict[str, Any], value: Any) -> str:
    """What is wrong with ``value`` under ``schema`` (at most three problems), or ''."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema)
    errors = sorted(validator_cls(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    parts = []
    for error in errors[:3]:
        where = "/".join(str(p) for p in error.absolute_path) or "(the result)"
        parts.append(f"{where}: {error.message}")
    if len(errors) > 3:
        parts.append(f"and {len(errors) - 3} more")
    return "; ".join(parts)


