"""Delegation: a tool whose call runs a subagent on a child trace.

An agent declares a delegation among its tools, with a typed input whose fields are the tool's
arguments, the agent that runs the child (and on which model), and what counts as its result::

    class Research(pydantic.BaseModel):
        question: str = pydantic.Field(description="The question to research.")

    research = Delegation(
        name="research",
        description="Hand a research question to the researcher subagent.",
        input=Research,
        agent="researcher",
    )
    app = App(agents=[Agent(name="lead", ..., tools=[research]), Agent(name="researcher", ...)])

The flow, with the service that does each step:

1. (agent loop) The parent's model calls the delegation: its call goes to the delegations
   stream instead of a tool queue.
2. (delegation) :func:`hand_off` turns the call into the child trace's first event, a
   :class:`~agentstream.events.TaskInput` (call id, expected result schema, parent trace and
   call, depth, root trace), or into an error result for the parent when the arguments do not
   fit, the depth limit is reached, or an ancestor already delegated the identical task to the
   same agent (field case C30). The child trace's id follows from the parent's trace and call
   (:func:`child_trace_id`), so a hand-off that runs twice opens one child.
3. (agent loop) The child runs like any trace, on the child agent's own config. At the depth
   limit, delegations are withheld from its model (:func:`offered_agent`).
4. (agent loop) When the child's turn ends, a :class:`ChildEnded` hint goes to the delegation
   service instead of a reply.
5. (delegation) :func:`hand_back` turns the ended child into the ToolOutput of the parent's
   call, with the sources the child cited. A result that is empty, or does not fit the schema,
   is an error the parent's model sees, never a silent success. The parent is woken.
6. (delegation) A supervisor ends a child that passes its deadline with exactly one
   TurnFailed (code ``timed_out``, :func:`timed_out`), which is handed back like any ending
   (field case C28). A parent's turn that ends while children run cancels them, and so on down.

Parallel delegations in one model output open their children at once; their results come back
in call order, because the context always shows results in the order of the calls.

Everything here is pure (no Redis, no asyncio, no clock): the services do the I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pydantic

from agentstream.app import Agent, App, Tool, ToolResultValue
from agentstream.context.citations import BRACKETS
from agentstream.context.elements import Numbering
from agentstream.errors import ConfigError, ToolArgumentsError
from agentstream.events import (
    AnyElement,
    Element,
    Event,
    ModelOutput,
    Source,
    TaskInput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)

DEFAULT_MAX_DEPTH = 2
"""The deepest child a delegation opens by default: a child of a root trace is at depth 1."""

DEFAULT_DEADLINE_S = 600.0
"""How long a child may run by default, in seconds, before the supervisor ends it."""

TIMED_OUT = "timed_out"
"""The TurnFailed code the supervisor gives a child that passed its deadline."""

ResultFunction = Callable[[Sequence[Event]], Any]
"""Reads a child's result (a JSON-compatible value, or None for none) from its ended trace."""


class ChildEnded(msgspec.Struct, frozen=True, kw_only=True):
    """A hint on the child-endings stream: this child trace's turn ended; hand its result back.

    Attributes:
        trace_id: the child trace.
        turn_id: the child's turn (its TaskInput).
    """

    trace_id: str
    turn_id: str = ""


_ending_decoder = msgspec.json.Decoder(ChildEnded)


def decode_child_ended(payload: bytes) -> ChildEnded:
    """The JSON of a child ending → :class:`ChildEnded` (raises ``msgspec.DecodeError``)."""
    return _ending_decoder.decode(payload)


def default_result(events: Sequence[Event]) -> Any:
    """The answer of the child's ended turn, or None when it ended without one."""
    for event in reversed(events):
        if isinstance(event, TurnEnded):
            return event.answer
    return None


@dataclasses.dataclass(frozen=True)
class _ElementField:
    kind: type[Element]
    many: bool
    optional: bool


class Delegation(Tool):
    """A tool whose every call runs a subagent on a child trace of its own.

    Args:
        name: the tool name the parent's model calls it by.
        description: what the parent's model reads about it.
        input: the pydantic model of the task. Its fields are the tool's arguments. A field
            that holds an element (a :class:`~agentstream.events.Source`, ``Document``,
            ``Passage`` or ``Image``, alone, optional, or in a list, tuple or Sequence) is
            shown to the model as the number of an element it was shown, and turned back into
            that element of the parent's trace, which the child is then shown (the model needs
            ``arbitrary_types_allowed``). An input that is not an object (a ``RootModel``) is
            shown as one argument named ``input``.
        agent: the name of the agent that runs each child, on its own config.
        model: the model endpoint id the child runs on; None uses the agent's own model.
        result: reads a child's result from its ended trace; the default is the child's
            final answer (:func:`default_result`).
        result_schema: the JSON Schema (2020-12 or any draft ``jsonschema`` knows) that each
            result must fit, or None for any result. With a schema, a text result is parsed as
            JSON first, and the child is told to answer with JSON that fits it.
        task_text: writes the child's task message from the parsed input; the default writes a
            single text field as it is, and other fields as ``name: value`` lines.
        max_depth: the deepest child this delegation opens (1: only a root trace's model may
            call it). At that depth the tool is withheld from the child's model, and a call made
            anyway gets an error result.
        deadline_s: the longest a child may run, in seconds; then the supervisor ends it and
            the parent's call gets a timed-out result.

    Raises:
        ConfigError: an element field sits where it cannot be filled (inside another model,
            in a dict, or in a union with another type), ``result_schema`` is not a valid JSON
            Schema, ``max_depth`` is below 1 or ``deadline_s`` is not positive.
    """

    delegated = True

    def __init__(
        self,
        *,
        name: str,
        description: str,
        input: type[pydantic.BaseModel],
        agent: str,
        model: str | None = None,
        result: ResultFunction = default_result,
        result_schema: dict[str, Any] | None = None,
        task_text: Callable[[pydantic.BaseModel], str] | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ):
        if max_depth < 1:
            raise ConfigError(f"delegation {name!r}: max_depth must be at least 1, got {max_depth}")
        if deadline_s <= 0:
            raise ConfigError(f"delegation {name!r}: deadline_s must be positive, got {deadline_s}")
        if result_schema is not None:
            _check_schema(name, result_schema)
        super().__init__(_no_arguments, name=name, description=description, timeout_s=deadline_s, queue="")
        self.fn = self._not_a_function  # one per delegation, so two delegations never pass for one tool
        self.is_async = True
        self.input = input
        self.agent = agent
        self.model = model
        self.result = result
        self.result_schema = result_schema
        self.task_text = task_text
        self.max_depth = max_depth
        self.deadline_s = deadline_s
        self._rooted = issubclass(input, pydantic.RootModel)
        self._elements = {} if self._rooted else _element_fields(name, input)
        self.arguments_model = self._wire_model()
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        self.parameters: dict[str, Any] = schema

    def __repr__(self) -> str:
        return f"Delegation({self.name!r}, agent={self.agent!r}, max_depth={self.max_depth})"

    async def _not_a_function(self, **kwargs: Any) -> Any:
        raise RuntimeError(f"delegation {self.name!r} runs on the delegation service, not as a function")

    async def invoke(self, raw_arguments: str, *, timeout_s: float | None = None) -> ToolResultValue:
        """A delegation never runs on a tool worker: a job that reached one gets an error result."""
        return ToolResultValue(
            text=f"Error: {self.name!r} is a delegation; the delegation service runs it, not a tool worker.",
            error="misrouted",
        )

    def check(self, app: App) -> None:
        """Refuse a delegation to an agent the app does not have.

        Raises:
            ConfigError: no agent of that name.
        """
        if app.agent(self.agent) is None:
            known = ", ".join(sorted(a.name for a in app.agents))
            raise ConfigError(f"delegation {self.name!r} names agent {self.agent!r}, which the app does not have (agents: {known})")

    # --- the arguments ------------------------------------------------------------------------

    def _wire_model(self) -> type[pydantic.BaseModel]:
        """The model the tool's arguments are validated with (element fields as numbers)."""
        model_name = "".join(part.capitalize() for part in self.name.split("_")) + "Arguments"
        config = pydantic.ConfigDict(extra="forbid")
        if self._rooted:
            root = self.input.model_fields["root"]
            return pydantic.create_model(model_name, __config__=config, input=(root.annotation, pydantic.Field(description=root.description)))
        if not self._elements:
            return self.input
        fields: dict[str, Any] = {}
        for field_name, info in self.input.model_fields.items():
            spec = self._elements.get(field_name)
            if spec is None:
                fields[field_name] = (info.annotation, info)
                continue
            kind = spec.kind.__name__.lower()
            note = (f"The numbers of {kind}s shown to you." if spec.many else f"The number of a {kind} shown to you.")
            description = f"{info.description} {note}" if info.description else note
            annotation: Any = list[int] if spec.many else int
            if spec.optional:
                annotation = annotation | None
            default = info.default if not info.is_required() else ...
            if spec.many and not info.is_required():
                default = []
            fields[field_name] = (annotation, pydantic.Field(default=default, description=description))
        return pydantic.create_model(model_name, __config__=config, **fields)

    def parse(self, raw: str, numbering: Numbering) -> tuple[pydantic.BaseModel, Any, tuple[AnyElement, ...]]:
        """A call's raw arguments → the parsed input, its JSON form, and the elements it names.

        Args:
            raw: the argument text the model wrote.
            numbering: the numbering of the parent's trace (element numbers → elements).

        Returns:
            ``(input, arguments, elements)``: the input model; the arguments as JSON-compatible
            data, with each element field holding the element's real id; the elements named.

        Raises:
            ToolArgumentsError: the text is not a JSON object, does not validate, or names an
                element number that the parent was not shown (or of another kind).
        """
        text = raw.strip()
        try:
            obj = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"arguments for {self.name!r} are not valid JSON ({exc.msg} at character {exc.pos}); "
                "send one JSON object matching the tool's parameters"
            ) from None
        if not isinstance(obj, dict):
            raise ToolArgumentsError(f"arguments for {self.name!r} must be a JSON object, got {type(obj).__name__}")
        wire = _validate(self.name, self.arguments_model, obj)
        if self._rooted:
            parsed = _validate(self.name, self.input, wire.input)  # type: ignore[attr-defined]
            return parsed, parsed.model_dump(mode="json"), ()
        if not self._elements:
            return wire, wire.model_dump(mode="json"), ()
        values = {name: getattr(wire, name) for name in type(wire).model_fields}
        arguments = wire.model_dump(mode="json")
        named: list[AnyElement] = []
        for field_name, spec in self._elements.items():
            value = values[field_name]
            if value is None:
                continue
            numbers = value if spec.many else [value]
            found = [self._element(field_name, spec, n, numbering) for n in numbers]
            named.extend(e for e in found if e not in named)
            values[field_name] = found if spec.many else found[0]
            ids = [e.id for e in found]
            arguments[field_name] = ids if spec.many else ids[0]
        parsed = _validate(self.name, self.input, values)
        return parsed, arguments, tuple(named)

    def _element(self, field_name: str, spec: _ElementField, number: int, numbering: Numbering) -> AnyElement:
        element_id = numbering.element_id(number)
        element = numbering.first(element_id) if element_id is not None else None
        kind = spec.kind.__name__.lower()
        if element is None or not isinstance(element, spec.kind):
            raise ToolArgumentsError(
                f"invalid arguments for {self.name!r}: {field_name}: {number} is not the number of a {kind} shown to you"
            )
        return element

    def render_task(self, parsed: pydantic.BaseModel) -> str:
        """The child's task message for a parsed input (with the schema instruction, if any)."""
        if self.task_text is not None:
            text = self.task_text(parsed)
        elif self._rooted:
            root = parsed.root  # type: ignore[attr-defined]
            text = root if isinstance(root, str) else json.dumps(parsed.model_dump(mode="json"), sort_keys=True)
        else:
            shown = parsed.model_dump(mode="json", exclude=set(self._elements))
            texts = [v for v in shown.values() if isinstance(v, str)]
            if len(shown) == 1 and len(texts) == 1:
                text = texts[0]
            else:
                text = "\n".join(f"{n}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for n, v in shown.items())
        if self.result_schema is not None:
            schema = json.dumps(self.result_schema, sort_keys=True)
            text = f"{text}\n\nAnswer with only a JSON value that fits this JSON Schema:\n{schema}"
        return text


def _no_arguments() -> None:
    """Stands in for a delegation's function while the Tool base is set up."""


# --- which tools a trace's model is offered --------------------------------------------------

_OFFERED: dict[tuple[int, tuple[str, ...], str], tuple[Agent, Agent]] = {}


def depth_of(turn: TurnInput) -> int:
    """The delegation depth of a turn: 0 for a root trace's turn, the task's depth for a child."""
    return turn.depth if isinstance(turn, TaskInput) else 0


def offered_agent(agent: Agent, turn: TurnInput) -> Agent:
    """The agent as a model call of ``turn`` sees it.

    In a child trace the agent runs on the model its task names, and each delegation whose
    ``max_depth`` the child has reached is withheld (not offered), so the chain of subagents
    ends (field case C30). The same agent object comes back for the same inputs, so caches
    keyed by agent keep working.

    Args:
        agent: the agent that answers the turn.
        turn: the turn being answered (a TaskInput in a child trace).

    Returns:
        ``agent`` itself when nothing changes, else a copy without the withheld tools and with
        the task's model.
    """
    depth = depth_of(turn)
    withheld = tuple(t.name for t in agent.tools if t.delegated and depth >= t.max_depth)  # type: ignore[attr-defined]
    model = turn.model if isinstance(turn, TaskInput) and turn.model else agent.model
    if not withheld and model == agent.model:
        return agent
    key = (id(agent), withheld, model)
    cached = _OFFERED.get(key)
    if cached is not None and cached[0] is agent:
        return cached[1]
    copy = dataclasses.replace(agent, tools=[t for t in agent.tools if t.name not in withheld], model=model)
    _OFFERED[key] = (agent, copy)
    return copy


# --- hand-off ---------------------------------------------------------------------------------


def child_trace_id(parent_trace_id: str, call_id: str) -> str:
    """The id of the child trace that a call opens: ``<parent trace>/<call id>``.

    Deterministic, so a hand-off that runs twice opens the same child once.
    """
    return f"{parent_trace_id}/{call_id.replace('{', '(').replace('}', ')')}"


def task_digest(agent: str, arguments: Any) -> str:
    """The fingerprint of a task: the agent and its arguments as canonical JSON (16 hex digits)."""
    canonical = json.dumps({"agent": agent, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class HandOff:
    """A call that opens a child: the child's trace id and its first event."""

    child_trace_id: str
    task: TaskInput


def _turn(events: Sequence[Event], turn_id: str) -> TurnInput | None:
    return next((e for e in events if isinstance(e, TurnInput) and e.turn_id == turn_id), None)


def numbering_of(events: Sequence[Event]) -> Numbering:
    """The element numbering of a trace (every input's and result's elements, in order)."""
    numbering = Numbering()
    for event in events:
        numbering.add_event(event)
    return numbering


def hand_off(
    delegation: Delegation, parent_trace_id: str, parent_events: Sequence[Event], call: ToolCall, turn_id: str
) -> HandOff | ToolOutput:
    """The child that a call of ``delegation`` opens, or the error result that it gets instead.

    Args:
        delegation: the delegation called.
        parent_trace_id: the trace of the call.
        parent_events: the parent's trace (its turn ``turn_id`` made the call).
        call: the call, as the model wrote it.
        turn_id: the parent's turn.

    Returns:
        A :class:`HandOff`, or a ToolOutput with an error for the parent's model: the
        arguments do not fit (``invalid_arguments``), the depth limit is reached
        (``depth_limit``), or an ancestor already gave the same agent the identical task
        (``repeated_task``).
    """
    turn = _turn(parent_events, turn_id)

    def refuse(error: str, text: str) -> ToolOutput:
        return ToolOutput(turn_id=turn_id, call_id=call.id, name=call.name, text=text, error=error)

    try:
        parsed, arguments, elements = delegation.parse(call.arguments, numbering_of(parent_events))
    except ToolArgumentsError as exc:
        return refuse("invalid_arguments", f"Error: {exc}")
    depth = depth_of(turn) + 1 if turn is not None else 1
    if depth > delegation.max_depth:
        return refuse(
            "depth_limit",
            f"Error: the delegation depth limit ({delegation.max_depth}) is reached, so {call.name!r} started no "
            "subagent. Do the task yourself with the tools you have.",
        )
    digest = task_digest(delegation.agent, arguments)
    lineage = turn.lineage if isinstance(turn, TaskInput) else ()
    if digest in lineage:
        return refuse(
            "repeated_task",
            f"Error: this exact task was already delegated to the {delegation.agent!r} agent further up this chain "
            "of subagents, so it was not delegated again. Do the task yourself, or delegate a smaller, different part of it.",
        )
    root = turn.root_trace_id if isinstance(turn, TaskInput) and turn.root_trace_id else parent_trace_id
    task = TaskInput(
        turn_id=call.id,
        agent=delegation.agent,
        text=delegation.render_task(parsed),
        elements=elements,
        call_id=call.id,
        parent_trace_id=parent_trace_id,
        parent_turn_id=turn_id,
        root_trace_id=root,
        depth=depth,
        delegation=delegation.name,
        arguments=arguments,
        expects=delegation.result_schema,
        model=delegation.model,
        lineage=(*lineage, digest),
        deadline_s=delegation.deadline_s,
    )
    return HandOff(child_trace_id=child_trace_id(parent_trace_id, call.id), task=task)


def descendants_refused(delegation: Delegation, call: ToolCall, turn_id: str, limit: int) -> ToolOutput:
    """The error result of a call refused because its root trace has ``limit`` descendants already."""
    return ToolOutput(
        turn_id=turn_id,
        call_id=call.id,
        name=call.name,
        text=(f"Error: this conversation has already started {limit} subagents, its limit, so {call.name!r} "
              "started none. Do the task yourself with the tools you have."),
        error="descendants_limit",
    )


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


def _check_schema(name: str, schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"delegation {name!r}: result_schema is not a valid JSON Schema: {exc.message}") from None


def _validate(name: str, model: type[pydantic.BaseModel], value: Any) -> pydantic.BaseModel:
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
        )
        raise ToolArgumentsError(f"invalid arguments for {name!r}: {problems}") from None


def _element_fields(name: str, model: type[pydantic.BaseModel]) -> dict[str, _ElementField]:
    """The fields of ``model`` that hold elements, and how (refusing places they cannot be filled)."""
    out: dict[str, _ElementField] = {}
    for field_name, info in model.model_fields.items():
        spec = _element_spec(info.annotation)
        if spec is not None:
            out[field_name] = spec
        elif _mentions_element(info.annotation):
            raise ConfigError(
                f"delegation {name!r}: field {field_name!r} holds elements where they cannot be filled in "
                "(use the element type alone, optional, or in a list, tuple or Sequence)"
            )
    return out


def _is_element_type(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Element)


def _element_spec(annotation: Any) -> _ElementField | None:
    if _is_element_type(annotation):
        return _ElementField(annotation, many=False, optional=False)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            inner = _element_spec(rest[0])
            if inner is not None and not inner.optional:
                return dataclasses.replace(inner, optional=True)
        return None
    if origin in (list, tuple, Sequence, typing.Sequence):
        items = [a for a in args if a is not Ellipsis]
        if len(items) == 1 and _is_element_type(items[0]) and (origin is not tuple or len(args) == 2):
            return _ElementField(items[0], many=True, optional=False)
    return None


def _mentions_element(annotation: Any) -> bool:
    if _is_element_type(annotation):
        return True
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return any(_mentions_element(f.annotation) for f in annotation.model_fields.values())
    return any(_mentions_element(a) for a in typing.get_args(annotation))


def delegations_of(app: App) -> dict[str, Delegation]:
    """The app's delegations, by name."""
    return {name: t for name, t in app.tools.items() if isinstance(t, Delegation)}


def children_of(
    parent_trace_id: str, events: Sequence[Event], turn_id: str, is_delegation: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """The children that the delegation calls of a turn open: ``[(child trace id, child turn id)]``.

    Args:
        parent_trace_id: the parent's trace.
        events: the parent's trace events.
        turn_id: the parent's turn.
        is_delegation: whether a tool name is a delegation.
    """
    out: list[tuple[str, str]] = []
    for event in events:
        if isinstance(event, ModelOutput) and event.turn_id == turn_id:
            out.extend((child_trace_id(parent_trace_id, c.id), c.id) for c in event.tool_calls if is_delegation(c.name))
    return out
