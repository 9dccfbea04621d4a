"""The delegation tool: a tool whose every call runs a subagent on a child trace (pure).

See :mod:`agentstream.delegation` for the whole flow.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, cast

import pydantic

from agentstream.context.elements import Numbering
from agentstream.declarations.apps import App
from agentstream.declarations.tools import AppOfTool, Tool, ToolResultValue
from agentstream.errors import ConfigError, ToolArgumentsError
from agentstream.wire.events import AnyElement, Element, Event, TurnEnded
from agentstream.wire.jsontext import arguments_unicode_refusal

DEFAULT_MAX_DEPTH = 2
"""The deepest child a delegation opens by default: a child of a root trace is at depth 1."""

DEFAULT_DEADLINE_S = 600.0
"""How long a child may run by default, in seconds, before the supervisor ends it."""

ResultFunction = Callable[[Sequence[Event]], Any]
"""Reads a child's result (a JSON-compatible value, or None for none) from its ended trace."""


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
            that holds an element (a :class:`~agentstream.wire.events.Source`, ``Document``,
            ``Passage`` or ``Image``, alone, optional, or in a list, tuple or Sequence) is
            shown to the model as the number of an element it was shown, and turned back into
            that element of the parent's trace, which the child is then shown (the model needs
            ``arbitrary_types_allowed``). An input that is not an object (a ``RootModel``) is
            shown as one argument named ``input``.
        agent: the name of the agent that runs each child, on its own config.
        model: the model endpoint id the child runs on. None: the child agent's own model when it
            pins one (a ``model`` other than ``default``), else the model of the parent's call that
            delegated (see :func:`agentstream.delegation.handoff.task_model`).
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
        task_text: Callable[[Any], str] | None = None,  # gets an instance of ``input``
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

    def check(self, app: AppOfTool) -> None:
        """Refuse a delegation to an agent the app does not have.

        Raises:
            ConfigError: no agent of that name.
        """
        if app.agent(self.agent) is None:
            known = ", ".join(sorted(a.name for a in app.agents))
            raise ConfigError(
                f"delegation {self.name!r} names agent {self.agent!r}, which the app does not have (agents: {known})"
            )

    # --- the arguments ------------------------------------------------------------------------

    def _wire_model(self) -> type[pydantic.BaseModel]:
        """The model the tool's arguments are validated with (element fields as numbers)."""
        model_name = "".join(part.capitalize() for part in self.name.split("_")) + "Arguments"
        config = pydantic.ConfigDict(extra="forbid")
        if self._rooted:
            root = self.input.model_fields["root"]
            root_type = cast(Any, root.annotation)  # a root model's root field always has its annotation
            return pydantic.create_model(
                model_name, __config__=config, input=(root_type, pydantic.Field(description=root.description))
            )
        if not self._elements:
            return self.input
        fields: dict[str, Any] = {}
        for field_name, info in self.input.model_fields.items():
            spec = self._elements.get(field_name)
            if spec is None:
                fields[field_name] = (info.annotation, info)
                continue
            kind = spec.kind.__name__.lower()
            note = f"The numbers of {kind}s shown to you." if spec.many else f"The number of a {kind} shown to you."
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
            ToolArgumentsError: the text is not a JSON object, is not Unicode (a lone surrogate
                escape), does not validate, or names an element number that the parent was not shown (or of another kind).
        """
        text = raw.strip()
        refusal = arguments_unicode_refusal(self.name, text)  # a lone surrogate: the child's task could not be stored
        if refusal is not None:
            raise ToolArgumentsError(refusal)
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
                text = "\n".join(
                    f"{n}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for n, v in shown.items()
                )
        if self.result_schema is not None:
            schema = json.dumps(self.result_schema, sort_keys=True)
            text = f"{text}\n\nAnswer with only a JSON value that fits this JSON Schema:\n{schema}"
        return text


def _no_arguments() -> None:
    """Stands in for a delegation's function while the Tool base is set up."""


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
