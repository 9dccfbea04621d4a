"""The reopen tool: the model asks to see again what a shrink or a summary shortened.

The tool's result records only which elements (by real id) and which results (by call id) to
show; the builder draws their content from where it was first recorded, every time it builds a
context, so nothing is copied into the trace. Each element shows inside its whole (a passage in
its document); each result shows whole under its handle, cut at its tool's cap.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from agentstream.context.forms.shorten import FULL
from agentstream.context.policy import ContextPolicy
from agentstream.wire.events import AnyElement, Source, ToolCall, ToolOutput
from agentstream.wire.jsontext import unicode_problem

if TYPE_CHECKING:
    from agentstream.context._context_fold_protocol import FoldState

REOPENED_KEY = "reopened"
"""The key of a reopen result's data that holds what it shows: ``{"elements": [...], "results": [...]}``."""


def is_reopen_output(event: ToolOutput, policy: ContextPolicy) -> bool:
    """True for a successful result of the policy's reopen tool."""
    reopen = policy.reopen
    return (
        reopen is not None
        and event.name == reopen.name
        and event.error is None
        and isinstance(event.data, dict)
        and isinstance(event.data.get(REOPENED_KEY), dict)
    )


def derive_reopened(event: ToolOutput, state: FoldState) -> ToolOutput:
    """The reopen result as the model sees it: the reopened results' text and the reopened elements."""
    record: dict[str, Any] = event.data[REOPENED_KEY]
    element_ids = [str(i) for i in record.get("elements", [])]
    call_ids = [str(i) for i in record.get("results", [])]
    parts = []
    for call_id in call_ids:
        slot = state.results.get(call_id)
        if slot is None:
            continue
        text, _ = state.renderer.content(slot.output, slot.handle, FULL, None)
        parts.append(f"[result {slot.handle} of {slot.output.name}, shown again]\n{text}")
    elements: dict[str, AnyElement] = {}
    wanted = set(element_ids)
    for element_id in element_ids:
        element = state.numbering.first(element_id)
        if element is None:
            continue
        if element.ref and element.ref != element_id and element.ref not in wanted and element.ref not in elements:
            whole = state.numbering.first(element.ref)
            if whole is not None:
                if isinstance(whole, Source) and whole.text:
                    whole = msgspec.structs.replace(whole, text="")
                elements[whole.id] = whole
        elements[element_id] = element
    if parts:
        text = "\n\n".join(parts)
    elif elements:
        text = "Shown again above."
    else:
        text = "Nothing to show again."
    return msgspec.structs.replace(event, text=text, elements=tuple(elements.values()))


def resolve_reopen(call: ToolCall, turn_id: str, state: FoldState) -> ToolOutput:
    """The result of a reopen call: its arguments checked and turned into real ids.

    Element numbers become element ids, handles become call ids. Arguments that are not a JSON
    object, name nothing, or name an unknown number or handle give an error result that tells
    the model what was wrong.
    """
    name = call.name

    def error(text: str) -> ToolOutput:
        return ToolOutput(turn_id=turn_id, call_id=call.id, name=name, text=f"Error: {text}", error="invalid_arguments")

    problem = unicode_problem(call.arguments)  # json.loads would make a lone surrogate, echoed below, unstorable
    if problem is not None:
        return error(f"the arguments are not Unicode text: {problem}")
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return error(f'the arguments are not valid JSON ({exc.msg}); send {{"elements": [7], "results": ["r3"]}}')
    if not isinstance(arguments, dict) or set(arguments) - {"elements", "results"}:
        return error(
            'the arguments must be an object with only "elements" (numbers) and "results" (handles such as "r3")'
        )
    numbers = arguments.get("elements") or []
    handles = arguments.get("results") or []
    if not isinstance(numbers, list) or not isinstance(handles, list) or (not numbers and not handles):
        return error('name at least one source number in "elements" or one result handle in "results"')
    element_ids, call_ids, unknown = [], [], []
    for number in numbers:
        try:
            element_id = state.numbering.element_id(int(number))
        except (TypeError, ValueError):
            element_id = None
        if element_id is None:
            unknown.append(str(number))
        else:
            element_ids.append(element_id)
    for handle in handles:
        slot = state.handle_index.get(str(handle))
        if slot is None:
            unknown.append(str(handle))
        else:
            call_ids.append(slot.output.call_id)
    if unknown:
        return error(f"unknown source numbers or result handles: {', '.join(unknown)}")
    shown = ", ".join([*(str(n) for n in numbers), *(str(h) for h in handles)])
    return ToolOutput(
        turn_id=turn_id,
        call_id=call.id,
        name=name,
        text=f"Shown again: {shown}.",
        data={REOPENED_KEY: {"elements": element_ids, "results": call_ids}},
    )
