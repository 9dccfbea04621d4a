"""Typed turn inputs and tool declarations: what a turn may ask of its agent (pure).

A published turn carries a payload: its ``text`` (a plain message) or its ``input`` (any JSON
value). Each agent declares the pydantic type the payload parses into (``Agent(input=...)``):

- :class:`Text`, the default: the payload is the message, a plain string.
- :class:`ChatTurnInput`: ``{"text": ..., "tools": {"search": "off"}, "context": ...}``: the
  message, the state it asks of each tool, and context text for the system prompt.

Parsing is strict (:func:`parse_payload`): an unknown field is refused, naming it, so a
misspelt field fails instead of being dropped. A string payload fills the type's ``text``.

How the model reads an input is a hook (:data:`RenderInput`): the default,
:func:`elements_then_text`, shows the input's sources, then its text; a hook may return None to
keep an input from the model. An input recorded earlier that the agent's type no longer parses
(the app changed its type) is shown as recorded (:func:`as_recorded`): its sources, then its
payload as text (a string) or JSON.

Tools: an agent declares each of its tools (:class:`ToolDeclaration`) with a default state
(:data:`ToolState`: ``off``, ``auto``, ``required``) and whether it is locked. A turn asks a
state per tool by name; :func:`tool_states` resolves the states of a turn and refuses one that
names an undeclared tool, changes a locked one, or requires one the app does not supply
(:class:`TurnDenied`). A tool is offered when it is supplied and not ``off``, in declaration
order; a required one adds its instruction after the turn's message.

No Redis, no asyncio: the agent loop, the context library and replay call these alike.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pydantic

from agentstream.errors import ConfigError
from agentstream.errors import TurnDenied as TurnDenied  # re-exported: agentstream.TurnDenied is read from here
from agentstream.wire.failures import FailureCode

DEFAULT_REOPEN_NAME = "reopen"
"""The name of the reopen tool of the default context policy
(:class:`agentstream.context.policy.Reopen`), which an agent's own tools may not take."""


ToolState = Literal["off", "auto", "required"]
"""What a turn asks of one tool: not offered, offered for the model to use as it sees fit, or
offered with an instruction to use it (a request: the model may still not call it)."""

TOOL_STATES: tuple[str, ...] = get_args(ToolState)

DEFAULT_REQUIRED_INSTRUCTION = "Use the {tool} tool for this message."
"""What a turn that requires a tool adds after its message (``{tool}``: the tool's name)."""


class Text(pydantic.BaseModel):
    """A plain-text input: the payload is the message. The default input of an agent.

    It asks no state of any tool and brings no context.

    Attributes:
        text: the message, the whole payload.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    text: str

    @property
    def tools(self) -> dict[str, ToolState]:
        """The states the input asks of the tools: none."""
        return {}

    @property
    def context(self) -> str | None:
        """Context text for the system prompt: always None."""
        return None


class ChatTurnInput(pydantic.BaseModel):
    """A chat turn: the message, the state it asks of each tool, and context for the system prompt.

    Published as the turn message's ``input``::

        {"text": "What is 2**20?", "tools": {"calculator": "required"}, "context": "The user is a pupil."}

    Unknown fields are refused, so a misspelt field fails instead of being dropped.

    Attributes:
        text: the message.
        tools: the state the turn asks of each tool, by the tool's name; a tool it does not
            name has its declaration's default.
        context: text for the agent's system prompt (``{context}`` in a prompt), or None.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    text: str
    tools: dict[str, ToolState] = pydantic.Field(default_factory=dict)
    context: str | None = None


def parse_payload(input_type: type[pydantic.BaseModel], payload: Any) -> pydantic.BaseModel:
    """A turn's payload → its parsed input (strict: unknown fields are refused).

    A string payload is the input's ``text`` (``{"text": payload}``); any other value is
    validated as the input type's JSON.

    Raises:
        ValueError: the payload does not parse; the message names each field (``$.input.tools``)
            and what is wrong with it, and lists the type's fields for an unknown one.
    """
    value = {"text": payload} if isinstance(payload, str) else payload
    try:
        return input_type.model_validate(value, strict=False)
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
            path = (
                f"`$.input{where}`" if not isinstance(payload, str) else f"`$.text` (as `{input_type.__name__}{where}`)"
            )
            if error["type"] == "extra_forbidden":
                fields = ", ".join(input_type.model_fields) or "none"
                problems.append(f"unknown field {path}; the fields of {input_type.__name__} are: {fields}")
            else:
                problems.append(f"{path}: {error['msg']}")
        raise ValueError(
            f"the turn's input does not parse into {input_type.__name__}: " + "; ".join(problems)
        ) from None


def payload_text(parsed: Any, payload: Any) -> str:
    """The message text of a parsed input (its ``text`` field), else the payload as text or JSON."""
    text = getattr(parsed, "text", None)
    if isinstance(text, str):
        return text
    return as_text(payload)


def as_text(payload: Any) -> str:
    """A payload as the model reads one that no type parses: a string as it is, else JSON."""
    if isinstance(payload, str):
        return payload
    return json.dumps(payload, ensure_ascii=False, sort_keys=True)


ShowElements = Callable[[Sequence[Any]], str]

RenderInput = Callable[[Any, ShowElements, Any], Any]
"""How the model reads a parsed input: ``render(parsed, show, turn_input) -> text | UserMessage | None``.

``parsed`` is the turn's input parsed into the agent's type, ``show`` lays elements out under
their numbers (the agent's layout), ``turn_input`` is the recorded
:class:`~agentstream.wire.events.TurnInput` (its elements, metadata, raw ``input``). The text returned
is the user message (the input's images go with it), or a
:class:`~agentstream.context.request.UserMessage` of its own; None keeps the input from the model. It must
be a pure function of its arguments: every later model call renders the input again.
"""


def join_shown(shown: str, text: str) -> str:
    """Shown elements, then text after a blank line (either may be empty)."""
    if shown and text:
        return f"{shown}\n\n{text}"
    return shown or text


def elements_then_text(parsed: Any, show: ShowElements, turn_input: Any = None) -> str:
    """The default :data:`RenderInput`: the turn's elements as ``show`` lays them out, then the
    input's text after a blank line.

    Raises:
        AttributeError: the parsed input has no ``text`` (give its agent a render hook).
    """
    elements = getattr(turn_input, "elements", ()) if turn_input is not None else ()
    return join_shown(show(elements) if elements else "", parsed.text)


def as_recorded(turn_input: Any, show: ShowElements) -> str:
    """An input shown as recorded (its type no longer parses it): its elements, then its payload
    as text when it is a string and as JSON otherwise."""
    payload = turn_input.input if turn_input.input is not None else turn_input.text
    elements = turn_input.elements
    return join_shown(show(elements) if elements else "", as_text(payload))


@dataclass(frozen=True)
class ToolDeclaration:
    """A tool an agent has, by name, and the agent's rule for offering it.

    Args:
        name: the name the model calls the tool by.
        default: the tool's state on a turn that names no state for it.
        locked: a turn may not ask a state other than ``default`` (such a turn is refused).
        required_tool_instruction: what the model is told after the message of a turn that
            requires the tool; ``{tool}`` becomes the tool's name.

    Raises:
        ConfigError: ``default`` is not a tool state, or the instruction has a placeholder
            other than ``{tool}`` (or is not a valid format string).
    """

    name: str
    default: ToolState = "auto"
    locked: bool = False
    required_tool_instruction: str = DEFAULT_REQUIRED_INSTRUCTION

    def __post_init__(self) -> None:
        if self.default not in TOOL_STATES:
            raise ConfigError(
                f"tool declaration {self.name!r}: default {self.default!r} is not one of {', '.join(TOOL_STATES)}"
            )
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.required_tool_instruction) if f is not None]
        except ValueError as exc:
            raise ConfigError(
                f"tool declaration {self.name!r}: required_tool_instruction is not a valid format string: {exc}"
            ) from None
        others = sorted({f for f in fields if f != "tool"})
        if others:
            shown = ", ".join("{" + f + "}" for f in others)
            raise ConfigError(
                f"tool declaration {self.name!r}: required_tool_instruction uses {shown}; the only placeholder is {{tool}} "
                "(write {{ and }} for literal braces)"
            )

    def state(self, requested: Mapping[str, str]) -> ToolState:
        """This tool's state on a turn that asks ``requested``: ``default`` when locked or not named."""
        if self.locked or self.name not in requested:
            return self.default
        return requested[self.name]  # type: ignore[return-value]

    def instruction(self) -> str:
        """The instruction a turn that requires this tool adds after its message."""
        return self.required_tool_instruction.format(tool=self.name)


def check_declarations(
    agent_name: str, declared: Sequence[ToolDeclaration], supplied: Sequence[str], reserved: Sequence[str]
) -> None:
    """Refuse declarations that cannot work: a name declared twice, a name of a tool the context
    adds (``reserved``: the reopen tool), or a supplied tool left undeclared.

    Raises:
        ConfigError: naming the agent and the tools.
    """
    names = [d.name for d in declared]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"agent {agent_name!r}: tools declared twice: {twice}")
    clash = sorted(set(names) & set(reserved))
    if clash:
        raise ConfigError(
            f"agent {agent_name!r}: declares {clash}, the name of a tool its context adds (the reopen tool); "
            "rename the tool or the reopen tool (Reopen(name=...))"
        )
    undeclared = [n for n in supplied if n not in names]
    if undeclared:
        raise ConfigError(f"agent {agent_name!r}: supplies tools it does not declare: {undeclared} (declared: {names})")


def tool_states(
    declared: Sequence[ToolDeclaration], supplied: Sequence[str], requested: Mapping[str, str]
) -> dict[str, ToolState]:
    """The state of every declared tool on a turn that asks ``requested``, in declaration order.

    Raises:
        TurnDenied: code ``bad_turn``: the turn names a tool that is not declared, asks a locked
            tool for another state than its default, or requires a tool the app does not supply.
    """
    by_name = {d.name: d for d in declared}
    names = ", ".join(by_name) or "none"
    for name, state in requested.items():
        declaration = by_name.get(name)
        if declaration is None:
            raise TurnDenied(
                f"the turn asks a state of tool {name!r}, which its agent does not declare (tools: {names})",
                code=FailureCode.BAD_TURN,
            )
        if state not in TOOL_STATES:
            raise TurnDenied(
                f"the turn asks tool {name!r} for state {state!r}; the states are {', '.join(TOOL_STATES)}",
                code=FailureCode.BAD_TURN,
            )
        if declaration.locked and state != declaration.default:
            raise TurnDenied(
                f"the turn asks tool {name!r} to be {state!r}, but its agent locks it at {declaration.default!r}",
                code=FailureCode.BAD_TURN,
            )
    states = {d.name: d.state(requested) for d in declared}
    for name, state in states.items():
        if state == "required" and name not in supplied:
            raise TurnDenied(
                f"the turn requires tool {name!r}, which this app does not supply", code=FailureCode.BAD_TURN
            )
    return states


def offered_names(
    declared: Sequence[ToolDeclaration], supplied: Sequence[str], states: Mapping[str, str]
) -> tuple[str, ...]:
    """The tools a turn offers: declared, supplied and not ``off``, in declaration order."""
    have = set(supplied)
    return tuple(d.name for d in declared if d.name in have and states.get(d.name, d.default) != "off")


def required_instructions(declared: Sequence[ToolDeclaration], states: Mapping[str, str]) -> tuple[str, ...]:
    """The instructions of the tools a turn requires, in declaration order."""
    return tuple(d.instruction() for d in declared if states.get(d.name, d.default) == "required")


def input_schema(input_type: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The JSON schema of what a turn's payload may be for an agent of this input type: a string
    (its text) when the type has a ``text`` field, or the type's object."""
    schema = input_type.model_json_schema()
    if "text" in input_type.model_fields:
        return {"anyOf": [{"type": "string", "description": "the message (the input's text)"}, schema]}
    return schema
