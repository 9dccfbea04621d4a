"""A tool's declaration: a typed Python function the model can call, and what it may return.

Declared with :func:`tool` (or :class:`Tool`); its JSON schema for the model comes from its
signature through pydantic, and its arguments are validated before the call. Running a tool (in
a thread for a sync one, with its timeout) is :func:`agentstream.app.base.invoke_tool`, in the
running part of the app: this module loads no asyncio.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import pydantic

from agentstream.errors import ConfigError, ToolArgumentsError
from agentstream.wire.codec import ENCODE_ERRORS
from agentstream.wire.jsontext import arguments_unicode_refusal
from agentstream.wire.keys import check_queue_name


class AppOfTool(Protocol):
    """What :meth:`Tool.check` may ask of the app a tool is in (an
    :class:`~agentstream.declarations.apps.App`, which imports this module)."""

    agents: Sequence[Any]  # its Agents

    def agent(self, name: str) -> Any: ...  # the Agent of that name, or None


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns when it gives more than text: data, elements, the app's own events.

    A tool may return a ``str`` (the text the model reads), any JSON-compatible value or
    pydantic model (its data, shown as JSON), an element or a list of elements (built-in
    ``Source``, ``Document``, ``Passage``, ``Image`` or the app's own element classes), or one
    of these for all of it at once::

        @tool
        def search(query: str) -> ToolResult:
            "Search the handbook."
            hits = index.search(query)
            return ToolResult(text=f"{len(hits)} passages", elements=[
                Passage(id=h.key, ref=h.document, text=h.text) for h in hits])

    The model sees the elements under their numbers in the trace, laid out by the agent's
    layout (a source with the citation to copy), before the text; images go with the message.

    Attributes:
        text: what the model reads after the elements (may be empty when elements say it all).
        data: structured data for programs reading the trace (JSON-compatible), or None.
        error: a short error code when the call failed (``text`` then explains it), or None.
        elements: the sources and images the result carries, in order. Each must be of a
            registered element type, with a non-empty id; an image needs a URL or base64 data
            within the size limit (see :func:`agentstream.wire.registry.check_elements`). A result
            whose elements fail these checks is recorded as an error result saying why.
        events: the app's own events (classes registered in ``App(event_types=...)``) to
            record in the trace just before the result, in order; the agent's renderers show
            them to the model (see :class:`agentstream.context.ContextConfig`).
    """

    text: str = ""
    data: Any = None
    error: str | None = None
    elements: Sequence[Any] = ()
    events: Sequence[Any] = ()


ToolResultValue = ToolResult
"""The former name of :class:`ToolResult`."""


class Tool:
    """A typed Python function the model can call.

    Args:
        fn: the function (sync or async). Its parameters, with type hints and defaults, become
            the tool's JSON schema; its docstring's first paragraph is the description.
        name: the tool's name for the model (default: the function's name).
        description: overrides the docstring.
        timeout_s: longest run time in seconds before the call gets a timeout error result.
        queue: the tool queue (stream) its jobs go to, so heavy tools get their own worker pool.
        side_effects: the tool changes the world (sends, writes, pays). A ``tool_started`` event
            is recorded before it runs, and if its worker dies mid-run the call is not run again:
            it gets an "outcome unknown" error result for the model (unless ``retry_safe``).
        retry_safe: running it again after a crash is harmless (it is idempotent), so a call
            whose worker died mid-run is simply run again, side effects or not.
        repeats: whether a call identical to an earlier successful call of this tool in the
            same turn runs again; None (the default) takes the agent's ``repeats`` (itself
            False by default). A repeat that does not run gets the earlier result again,
            marked with ``repeat_of`` in the trace; ``True`` suits a tool whose answer changes
            between calls (a clock, a queue).
        needs_approval: whether a call waits for a person's approval before it runs: True for
            every call, or a function of the call's arguments (a dict, as the model sent them)
            that says True for the calls that do (it must be a pure function: it runs again at
            every step). Arguments that are not a JSON object always wait. See the how-to
            "Tool calls that wait for a person".
        approval_edits: whether the person who approves a call may replace its arguments.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = 60.0,
        queue: str = "default",
        side_effects: bool = False,
        retry_safe: bool = False,
        repeats: bool | None = None,
        needs_approval: bool | Callable[[dict[str, Any]], bool] = False,
        approval_edits: bool = False,
    ):
        self.fn = fn
        self.needs_approval = needs_approval
        self.approval_edits = approval_edits
        self.repeats = repeats
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0].strip()
        self.timeout_s = timeout_s
        try:
            self.queue = check_queue_name(queue)  # no name may stand for another queue's partition
        except ConfigError as exc:
            raise ConfigError(f"tool {self.name!r}: {exc}") from None
        self.side_effects = side_effects
        self.retry_safe = retry_safe
        self.is_async = inspect.iscoroutinefunction(fn)
        self.arguments_model = _arguments_model(fn, self.name)
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        self.parameters: dict[str, Any] = schema

    delegated = False
    """True for a delegation (:class:`agentstream.delegation.Delegation`): its calls go to the
    delegation service, which runs a subagent, instead of to a tool queue."""

    def check(self, app: AppOfTool) -> None:
        """Refuse a tool that does not fit the app it is in (a delegation to a missing agent).

        Raises:
            ConfigError: the tool cannot work in this app.
        """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, queue={self.queue!r}, side_effects={self.side_effects!r})"

    def definition(self) -> dict[str, Any]:
        """The provider-neutral definition: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def parse_arguments(self, raw: str) -> dict[str, Any]:
        """Raw argument text → validated keyword arguments.

        Empty or whitespace-only text means ``{}`` (some servers send ``""`` for a tool without
        parameters).

        Raises:
            ToolArgumentsError: the text is not a JSON object, is not Unicode (a lone surrogate
                escape: :func:`agentstream.wire.jsontext.arguments_unicode_refusal`) or does not
                match the schema; the message says what and where, for the model to correct.
        """
        text = raw.strip()
        refusal = arguments_unicode_refusal(self.name, text)
        if refusal is not None:
            raise ToolArgumentsError(refusal)
        if not text:
            obj: Any = {}
        else:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ToolArgumentsError(
                    f"arguments for tool {self.name!r} are not valid JSON ({exc.msg} at character {exc.pos}); "
                    f"send one JSON object matching the tool's parameters"
                ) from None
        if not isinstance(obj, dict):
            raise ToolArgumentsError(
                f"arguments for tool {self.name!r} must be a JSON object, got {type(obj).__name__}"
            )
        try:
            model = self.arguments_model.model_validate(obj)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for tool {self.name!r}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}


def _as_result(value: Any) -> ToolResult:
    from agentstream.declarations.readable import bytes_value, readable_data, readable_text
    from agentstream.wire.events import Element

    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(text=readable_text(value))
    if isinstance(
        value, (bytes, bytearray, memoryview)
    ):  # text, an image, or described (agentstream.declarations.readable)
        text, data, elements = bytes_value(value)
        return ToolResult(text=text, data=data, elements=elements)
    if isinstance(value, Element):
        return ToolResult(elements=(value,))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Element) for v in value):
        return ToolResult(elements=tuple(value))
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    try:
        data = readable_data(msgspec.to_builtins(value, builtin_types=(bytes, bytearray, memoryview)))
        text = msgspec.json.encode(data).decode()
    except ENCODE_ERRORS:  # no JSON form (the tool worker checks that the text stores)
        return ToolResultValue(text=str(value))
    return ToolResultValue(text=text, data=data)


def _arguments_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    """A pydantic model of the function's parameters (the tool's argument schema)."""
    signature = inspect.signature(fn)
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception as exc:
        raise ConfigError(f"tool {name!r}: cannot read its type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.capitalize() for part in name.split("_")) + "Arguments"
    return pydantic.create_model(model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = 60.0,
    queue: str = "default",
    side_effects: bool = False,
    retry_safe: bool = False,
    repeats: bool | None = None,
    needs_approval: bool | Callable[[dict[str, Any]], bool] = False,
    approval_edits: bool = False,
) -> Any:
    """Make a :class:`Tool` of a function; use as ``@tool`` or ``@tool(timeout_s=5, side_effects=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            timeout_s=timeout_s,
            queue=queue,
            side_effects=side_effects,
            retry_safe=retry_safe,
            repeats=repeats,
            needs_approval=needs_approval,
            approval_edits=approval_edits,
        )

    return wrap(fn) if fn is not None else wrap
