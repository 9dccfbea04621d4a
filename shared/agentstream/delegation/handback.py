"""Hand-back: an ended child trace becomes its parent's tool result (pure).

See :mod:`agentstream.delegation` for the whole flow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from agentstream.context.cited import read_back
from agentstream.context.elements import Numbering
from agentstream.delegation.handoff import numbering_of
from agentstream.delegation.tool import Delegation, default_result
from agentstream.wire.events import (
    AnyElement,
    Event,
    ModelOutput,
    Source,
    TaskInput,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.jsontext import unicode_problem

TIMED_OUT = FailureCode.TIMED_OUT
"""The TurnFailed code the supervisor gives a child that passed its deadline."""

DIGEST_ARGUMENTS_CHARS = 300
"""The most characters of a tool call's arguments a digest shows (the rest is cut, marked)."""
DIGEST_OUTCOME_CHARS = 300
"""The most characters of a tool call's result a digest shows."""
DIGEST_CALLS = 20
"""The most tool calls a digest lists (the newest ones; a count says how many were left out)."""

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


class Handed(NamedTuple):
    """What a hand-back gives the parent's tool result: its text, data, error code and elements."""

    text: str
    data: Any = None
    error: str | None = None
    elements: tuple[AnyElement, ...] = ()


def hand_back(delegation: Delegation | None, events: Sequence[Event]) -> ToolOutput:
    """The parent's result of the call that opened this ended child trace.

    A child that ended with an answer gives its result (``delegation.result`` of its trace),
    checked against the task's schema. A text result carries every source the child was shown,
    each after the shown whole it is part of (:func:`shown_sources`; the parent shows them in its
    own numbering), the text without its citation marks, and the sources it cited in
    ``data["citations"]`` (:class:`~agentstream.wire.events.CitedSource`, by real id). A result that
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
    handed = _handed(delegation, events, task, ending)
    return ToolOutput(
        turn_id=task.parent_turn_id,
        call_id=task.call_id,
        name=task.delegation or (delegation.name if delegation else "delegation"),
        text=handed.text,
        data=handed.data,
        error=handed.error,
        elements=handed.elements,
    )


def _handed(
    delegation: Delegation | None, events: Sequence[Event], task: TaskInput, ending: TurnEnded | TurnFailed
) -> Handed:
    """:func:`hand_back`'s result, in order: a failed child's error; the result read, or the
    error of reading it; an empty result's ``incomplete``; then the result as the task expects
    it (:func:`expected_result`), as text with its sources (:func:`text_result`), or as data."""
    who = f"The {task.agent!r} subagent"
    if isinstance(ending, TurnFailed):
        return failed_result(who, ending, events)
    read = delegation.result if delegation is not None else default_result
    try:
        value = read(events)
    except Exception as exc:  # the app's result function failed: the parent's model hears it
        return Handed(f"Error: reading {who}'s result failed ({type(exc).__name__}: {exc}).", error="result_error")
    if value is None or (isinstance(value, str) and not value.strip()):
        summary = digest(events, task.turn_id)
        return Handed(
            f"Error: {who} ended without a result, so the task is incomplete.\n{digest_text(summary)}",
            data={"digest": summary},
            error="incomplete",
        )
    if task.expects is not None:
        return expected_result(who, task.expects, value)
    if isinstance(value, str):
        return text_result(events, ending, value)
    return data_result(value)


def failed_result(who: str, ending: TurnFailed, events: Sequence[Event]) -> Handed:
    """A failed child's result (pure): an error named by its code, with the newest text its model
    wrote and the :func:`digest` of what it did."""
    partial = _partial(events)
    text = f"Error: {who} did not finish its task ({ending.code}): {ending.reason}."
    if partial:
        text += f"\nWhat it had written before it stopped (incomplete):\n{partial}"
    summary = digest(events, ending.turn_id)
    return Handed(f"{text}\n{digest_text(summary)}", data={"digest": summary}, error=ending.code)


def expected_result(who: str, expects: dict[str, Any], value: Any) -> Handed:
    """A result checked against the task's JSON schema ``expects`` (pure).

    Text is read as JSON (without a surrounding code fence); text that is not Unicode or not
    JSON, or a value the schema refuses, is a ``schema_mismatch`` error that shows the result;
    else the value as sorted JSON text, and as data.
    """
    if isinstance(value, str):
        problem = unicode_problem(_unfence(value))  # json.loads would make a lone surrogate the trace cannot store
        if problem is not None:
            return Handed(
                f"Error: {who}'s result is not the JSON the task asked for: it is not Unicode text "
                f"({problem}). Its result was:\n{value}",
                error="schema_mismatch",
            )
        try:
            value = json.loads(_unfence(value))
        except json.JSONDecodeError as exc:
            return Handed(
                f"Error: {who}'s result is not the JSON the task asked for ({exc.msg}). Its result was:\n{value}",
                error="schema_mismatch",
            )
    problems = _schema_problems(expects, value)
    if problems:
        shown = json.dumps(value, sort_keys=True)
        return Handed(
            f"Error: {who}'s result does not fit the expected schema: {problems}. Its result was:\n{shown}",
            data=value,
            error="schema_mismatch",
        )
    return Handed(json.dumps(value, sort_keys=True), data=value)


def text_result(events: Sequence[Event], ending: TurnEnded | TurnFailed, value: str) -> Handed:
    """A text result (pure): without its citation marks, the sources it cited as data (those
    its answer recorded, when the text has no marks and is the answer), every source shown."""
    numbering = numbering_of(events)
    text, citations = read_back(value, numbering)  # marks still in the text (a child that does not cite by style)
    if not citations and isinstance(ending, TurnEnded) and value == ending.answer:
        citations = ending.citations
    data = {"citations": msgspec.to_builtins(citations)} if citations else None
    return Handed(text.strip() or value, data=data, elements=shown_sources(events, numbering))


def data_result(value: Any) -> Handed:
    """Any other result (pure): as sorted JSON text and data, or its ``str`` when it is not JSON data."""
    try:
        data = msgspec.to_builtins(value)
    except (TypeError, msgspec.EncodeError):
        return Handed(str(value))
    return Handed(json.dumps(data, sort_keys=True), data=data)


def _partial(events: Sequence[Event]) -> str:
    """The newest text a child's model wrote ('' when it wrote none: the digest tells the rest)."""
    for event in reversed(events):
        if isinstance(event, ModelOutput) and event.content.strip():
            return event.content.strip()
    return ""


def _cap(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text):,} characters in all]"


def digest(events: Sequence[Event], turn_id: str) -> dict[str, Any]:
    """What a child run did, for a parent whose child ended without a usable answer (pure).

    Returns:
        ``{"ended": "ended" | "failed", "code": ..., "reason": ..., "stop_reason": ...,
        "model_calls": n, "tool_calls": [{"name", "arguments", "outcome", "error"}], "more_calls": n}``:
        how the turn ended (its code and reason when it failed; the stop reason of its last model
        output), and each tool call it made, in call order, with its arguments and its result's
        text capped (:data:`DIGEST_ARGUMENTS_CHARS`, :data:`DIGEST_OUTCOME_CHARS`), the result's
        error code (None when it succeeded), or outcome ``(no result)`` for a call that got none.
        At most :data:`DIGEST_CALLS` calls are listed (the newest); ``more_calls`` counts the rest.
    """
    ending = ending_of(events, turn_id)
    outputs = [e for e in events if isinstance(e, ModelOutput) and e.turn_id == turn_id]
    results = {e.call_id: e for e in events if isinstance(e, ToolOutput) and not e.late}
    calls = [call for output in outputs for call in output.tool_calls]
    listed = calls[-DIGEST_CALLS:]
    return {
        "ended": "failed" if isinstance(ending, TurnFailed) else "ended",
        "code": ending.code if isinstance(ending, TurnFailed) else None,
        "reason": ending.reason if isinstance(ending, TurnFailed) else None,
        "stop_reason": outputs[-1].stop_reason if outputs else None,
        "model_calls": len(outputs),
        "tool_calls": [
            {
                "name": call.name,
                "arguments": _cap(call.arguments, DIGEST_ARGUMENTS_CHARS),
                "outcome": _cap(results[call.id].text, DIGEST_OUTCOME_CHARS) if call.id in results else "(no result)",
                "error": results[call.id].error if call.id in results else "no_result",
            }
            for call in listed
        ],
        "more_calls": len(calls) - len(listed),
    }


def digest_text(summary: dict[str, Any]) -> str:
    """A :func:`digest` as the lines the parent's model reads."""
    how = f"failed ({summary['code']})" if summary["ended"] == "failed" else "ended without an answer"
    lines = [
        f"What the subagent did: it {how} after {summary['model_calls']} model call(s), last stop reason "
        f"{summary['stop_reason'] or 'none'}; tool calls: {len(summary['tool_calls']) + summary['more_calls']}."
    ]
    if summary["more_calls"]:
        lines.append(f"(the first {summary['more_calls']} call(s) are left out; the newest follow)")
    for n, call in enumerate(summary["tool_calls"], start=1):
        status = "ok" if call["error"] is None else f"error {call['error']}"
        lines.append(f"{n}. {call['name']}({call['arguments']}) -> {status}: {call['outcome']}")
    return "\n".join(lines)


def shown_sources(events: Sequence[Event], numbering: Numbering | None = None) -> tuple[AnyElement, ...]:
    """Every source a child trace's inputs and results showed, each after the shown whole it is part of.

    In order of first appearance, each once (by id); a late result (never shown) adds nothing.
    """
    numbering = numbering if numbering is not None else numbering_of(events)
    out: dict[str, AnyElement] = {}
    for event in events:
        if isinstance(event, ToolOutput):
            if event.late:
                continue
        elif not isinstance(event, TurnInput):
            continue
        for element in event.elements:
            if not isinstance(element, Source) or element.id in out:
                continue
            if element.ref and element.ref != element.id and element.ref not in out:
                whole = numbering.first(element.ref)
                if whole is not None:
                    out[whole.id] = whole
            out[element.id] = numbering.first(element.id) or element
    return tuple(out.values())


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
