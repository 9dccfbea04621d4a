"""An agent's declaration: who answers a turn, with which model, prompt, tools and context policy.

:class:`Agent` and :class:`AgentSettings` (an agent's settings for one turn) are pure: the
context library and the step decision read them, so this module loads no asyncio, redis or httpx.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import pydantic

from agentstream.declarations.inputs import (
    DEFAULT_REOPEN_NAME,
    RenderInput,
    Text,
    ToolDeclaration,
    TurnDenied,
    check_declarations,
    offered_names,
    parse_payload,
)
from agentstream.declarations.mcp_servers import McpServer
from agentstream.declarations.prompts import (
    PROMPT_VARIABLES,
    PromptFile,
    PromptFileError,
    PromptFunction,
    Prompts,
    fill_prompt,
    turn_context,
)
from agentstream.declarations.tools import Tool
from agentstream.errors import ConfigError, PromptError
from agentstream.wire.failures import FailureCode

ToolChoice = Literal["auto", "required", "none"]

if TYPE_CHECKING:
    from agentstream.context.limits import ModelLimits
    from agentstream.context.render import ContextConfig


@dataclass
class Agent:
    """An agent: who answers a turn, with which model and tools.

    Attributes:
        name: the name turns use in their ``agent`` field.
        system_prompt: the system prompt, written anew for each model call (see
            :mod:`agentstream.declarations.prompts`): a text whose ``{citation}`` (the example citation of
            the agent's citation style, ``[1]`` for ``BRACKETS``; empty without one) and
            ``{context}`` (the context text the turn brings; empty without one) are filled in
            one pass, other braces staying as written; a function of (the parsed turn, the
            example citation or None) that returns the text; or a
            :class:`~agentstream.declarations.prompts.PromptFile`, of which each call reads the layer naming
            the endpoint it goes to (the turn's model), so one agent serves several endpoints
            with their own texts, and whose tool texts replace the tools' own descriptions for
            that model. A file is checked here, at startup: its templates may read only
            ``citation`` and ``context``, it must have a system template, and its tool texts
            must name tools and arguments the agent has.
        model: the agent's default model endpoint id from the settings (``default`` is the one
            from OPENAI_* or the embedded local model): a turn that names no model runs on it.
            None: the agent has no default, so each turn must name one of ``models`` (a turn
            naming none is refused with code ``bad_turn``, before anything of it is stored).
        models: more model endpoint ids a published turn may name (its ``model`` field) to run
            the whole turn on; a turn that names another is refused (``bad_turn``, naming the
            allowed ones). Each must be configured (checked at startup).
        tools: the tools the model may call. An :class:`~agentstream.mcp_tools.McpServer` among
            them is moved to ``mcp_servers``.
        mcp_servers: MCP servers whose tools the model may call too (after ``tools``, in the
            order the servers list them; see :mod:`agentstream.mcp_tools`).
        max_passes: the passes cap: the most model calls of one turn that call tools (default
            10). Past the cap the calls do not run: each gets a directive to finish as its
            result (:data:`agentstream.steps.decision.PASSES_CAP_DIRECTIVE`). The model keeps its tools
            for ``tool_rounds_after_cap`` more calls, then is called without tools, so it can
            only answer.
        result_as_answer: names of the agent's tools whose result is the turn's answer: once
            the calls of a model output have their results, the first call (in call order) of
            such a tool that succeeded ends the turn with its result's text as the answer, and
            the model is not called again (its ``turn_ended`` records the call in
            ``answer_call``; later turns show the answer as the assistant's message). For an
            agent that cites, its citations are the marks its text holds, read back, or else the sources the result
            carries that its text quotes (else all of them; never a whole whose part it carries). It makes a
            small model's answers exact: it computes with a tool, and the tool answers.
        tool_rounds_after_cap: model calls past the cap that still offer the tools (default 1,
            at least 0); their tool calls get the directive too.
        resets_on_answer: each answer to a request starts the passes count again: a call
            whose tool calls got a subagent's answer (a delegation's result without an error,
            see :mod:`agentstream.delegation`) is followed by a call that counts from 0, so an
            agent that hands out many tasks is not stopped by the cap. False (default): the
            count covers the whole turn.
        tool_choice: what the model is told about tools on each pass before the cap.
        first_tool_choice: overrides ``tool_choice`` on the first pass of a turn (``required``
            makes a small model use a tool before answering).
        max_output_tokens: the output limit sent with each model call, in tokens.
        temperature: sampling temperature sent with each model call.
        context: how each model call's context is built and kept within the model's limits
            (policy, element layout, event selection and renderers, citation style); None uses
            the defaults (see :mod:`agentstream.context`).
        model_limits: the model's window and characters per token; None takes the model
            endpoint's (``window_tokens``, ``chars_per_token``) and caps the context policy's
            output reserve at ``max_output_tokens`` (see
            :func:`agentstream.delegation.offered_agent`); without a configured endpoint, a
            32 000-token window (:data:`agentstream.context.limits.DEFAULT_LIMITS`).
        input: the pydantic type a turn's payload parses into (:class:`~agentstream.declarations.inputs.Text`
            by default: a plain message; :class:`~agentstream.declarations.inputs.ChatTurnInput` adds tool
            states and context). Parsed strictly: a turn with an unknown field is refused.
        render_input: how the model reads a parsed input, ``render(parsed, show, turn_input) ->
            text | None`` (:data:`agentstream.declarations.inputs.RenderInput`); None shows the input's
            elements, then its text. An input the type no longer parses is shown as recorded.
            A hidden input leaves its turn's other messages in place: hiding the first turn's
            makes the history start on an assistant message, which some providers refuse.
        declared: the tools the agent has and its rule for offering each
            (:class:`~agentstream.declarations.inputs.ToolDeclaration`: default state, locked, the
            instruction of a turn that requires it), in the order they are offered; None
            declares each of ``tools`` ``auto``. Each of ``tools`` must be declared. The tools
            of ``mcp_servers`` are offered after these, in their servers' order; a declaration
            may name one of them (a name that is not one of ``tools``), which then has that
            default state and lock, and a turn may ask a state of it by name like any declared
            tool. An MCP tool no declaration names is offered ``auto``. A turn that requires a
            declared MCP tool that no server of the agent lists fails with code ``bad_turn``
            before its first model call.
        repeats: whether a call identical (same tool, same arguments) to an earlier successful
            call of the same turn runs again, for each tool that does not set its own
            ``repeats``. Default False: a repeat does not run; it gets the earlier result
            again, marked with ``repeat_of`` (the earlier call's id) in the trace. Identical
            calls within one model call all run (their jobs go out together).
        settings: the agent's settings for each turn: a function ``settings(resources, turn,
            model) -> AgentSettings`` of the app's ``resources``, the turn's parsed input and
            the model endpoint id it runs on, whose changes apply to this agent for that turn
            (so each model can get its own settings). It may raise
            :class:`~agentstream.declarations.inputs.TurnDenied` to refuse the turn: it then fails with the
            error's code and reason and no model is called. It must be a pure function of its
            arguments (it runs again when any worker rebuilds the turn's context). The tools it
            gives must be the app's (an agent's ``tools`` or ``App(extra_tools=...)``), so the
            tool workers can run them.
        needs_approval: which tools' calls wait for a person's approval before they run, besides
            those whose tool or MCP server says so: True for every tool, or a list of tool names
            (its own or its MCP servers'). A turn may add more (its message's ``approval``).
        approval_timeout_s: how long a call waits for a decision, in seconds; then it is denied
            (``by`` ``timeout``) and the model sees an error result.

    Raises:
        ConfigError: a setting out of range, tool or MCP server names used twice, a tool named
            like the reopen tool, declarations that repeat a name, name the reopen tool or miss
            a supplied tool, or an input type that is not a pydantic model.
    """

    name: str
    system_prompt: str | PromptFile | PromptFunction
    model: str | None = "default"
    models: Sequence[str] = ()
    tools: Sequence[Tool] = ()
    max_passes: int = 10
    tool_rounds_after_cap: int = 1
    resets_on_answer: bool = False
    tool_choice: ToolChoice = "auto"
    first_tool_choice: ToolChoice | None = None
    max_output_tokens: int = 512
    temperature: float = 0.0
    context: ContextConfig | None = None
    model_limits: ModelLimits | None = None
    mcp_servers: Sequence[McpServer] = ()
    input: type[pydantic.BaseModel] = Text
    render_input: RenderInput | None = None
    declared: Sequence[ToolDeclaration] | None = None
    repeats: bool = False
    settings: Callable[[Any, Any, str], AgentSettings] | None = None
    result_as_answer: Sequence[str] = ()
    needs_approval: bool | Sequence[str] = False
    approval_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if not (isinstance(self.input, type) and issubclass(self.input, pydantic.BaseModel)):
            raise ConfigError(f"agent {self.name!r}: input must be a pydantic model class, got {self.input!r}")
        if self.render_input is None and "text" not in self.input.model_fields:
            raise ConfigError(
                f"agent {self.name!r}: its input type {self.input.__name__} has no `text` field for the default rendering; "
                "give the agent a render_input"
            )
        if self.model is None and not self.models:
            raise ConfigError(
                f"agent {self.name!r}: it has no default model (model=None) and no models a turn may name; "
                "give it a model or models=[...]"
            )
        if self.max_passes < 1:
            raise ConfigError(f"agent {self.name!r}: max_passes must be at least 1, got {self.max_passes}")
        self._check_approval()
        if self.tool_rounds_after_cap < 0:
            raise ConfigError(
                f"agent {self.name!r}: tool_rounds_after_cap must be at least 0, got {self.tool_rounds_after_cap}"
            )
        given: Sequence[object] = self.tools  # an MCP server given among the tools
        servers = [t for t in given if isinstance(t, McpServer)]
        if servers:
            self.tools = [t for t in self.tools if not isinstance(t, McpServer)]
            self.mcp_servers = (*self.mcp_servers, *servers)
        server_names = [s.name for s in self.mcp_servers]
        if len(set(server_names)) != len(server_names):
            raise ConfigError(
                f"agent {self.name!r}: MCP server names used twice: "
                f"{sorted({n for n in server_names if server_names.count(n) > 1})}"
            )
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"agent {self.name!r}: tool names used twice: {duplicates}")
        if self.context is not None:
            reopen = self.context.policy.reopen
            reopen_name = reopen.name if reopen is not None else None
        else:
            reopen_name = DEFAULT_REOPEN_NAME  # the default policy's reopen tool
        if reopen_name is not None and reopen_name in names:
            raise ConfigError(
                f"agent {self.name!r}: its tool {reopen_name!r} has the name of the reopen tool that its context "
                "policy adds; rename the tool or the reopen tool (Reopen(name=...))"
            )
        if self.declared is not None:
            self.declared = tuple(self.declared)
            check_declarations(self.name, self.declared, names, [reopen_name] if reopen_name is not None else [])
        self._turns: dict[tuple[int, str | None], tuple[Any, Agent]] = {}  # the agent of recent turns (a cache)
        self._resources: Any = None  # the app's resources, which the settings function gets (App sets them)
        self.result_as_answer = tuple(self.result_as_answer)
        unknown = [n for n in self.result_as_answer if n not in names]
        if unknown and not self.mcp_servers:
            raise ConfigError(
                f"agent {self.name!r}: result_as_answer names tools it does not have: {unknown} (its tools: {names})"
            )
        self._check_prompt()

    def _check_approval(self) -> None:
        if not self.approval_timeout_s > 0:
            raise ConfigError(
                f"agent {self.name!r}: approval_timeout_s must be positive, got {self.approval_timeout_s!r}"
            )
        if not isinstance(self.needs_approval, bool):
            if isinstance(self.needs_approval, str):
                raise ConfigError(
                    f"agent {self.name!r}: needs_approval takes True or a list of tool names, not the string "
                    f"{self.needs_approval!r}"
                )
            self.needs_approval = tuple(self.needs_approval)

    @property
    def declarations(self) -> tuple[ToolDeclaration, ...]:
        """The agent's tool declarations: ``declared``, or each of ``tools`` declared ``auto``."""
        held = self.__dict__.get("_declarations")  # made once per tools and declared (read at every step)
        tools, declared = self.tools, self.declared
        if held is None or held[0] is not tools or held[1] is not declared:
            made = tuple(declared) if declared is not None else tuple(ToolDeclaration(name=t.name) for t in tools)
            held = self.__dict__["_declarations"] = (tools, declared, made)
        return held[2]

    def parse_input(self, payload: Any) -> pydantic.BaseModel:
        """A turn's payload parsed into :attr:`input` (see :func:`agentstream.declarations.inputs.parse_payload`).

        Raises:
            ValueError: the payload does not parse (the message names the field).
        """
        return parse_payload(self.input, payload)

    def turn_states(self, turn: Any) -> dict[str, str]:
        """The state of each declared tool on ``turn`` (a TurnInput): as recorded, else the defaults."""
        recorded = getattr(turn, "tools", None)
        if recorded is not None:
            return {d.name: recorded.get(d.name, d.default) for d in self.declarations}
        return {d.name: d.default for d in self.declarations}

    def offered_tools(self, turn: Any) -> tuple[Tool, ...]:
        """The agent's own tools a call of ``turn`` offers: declared, supplied and not ``off``,
        in declaration order (MCP servers' tools come after them)."""
        names = offered_names(self.declarations, [t.name for t in self.tools], self.turn_states(turn))
        return tuple(t for n in names if (t := self.tool(n)) is not None)

    def suppliable_names(self) -> list[str]:
        """The declared tools that may be supplied: the agent's own, and, for an agent with MCP
        servers, each declared name that is not its own (a server's tool: the servers' lists are
        read at run time, so whether one lists it is known only then)."""
        own = [t.name for t in self.tools]
        if not self.mcp_servers:
            return own
        return [*own, *(d.name for d in self.declarations if d.name not in own)]

    def off_tools(self, turn: Any) -> frozenset[str]:
        """The tools a call of ``turn`` does not offer although they are supplied: the agent's own
        tools that are not offered (``off`` or undeclared), and the MCP servers' tools declared
        ``off`` for the turn (an MCP tool no declaration names is offered)."""
        offered = {t.name for t in self.offered_tools(turn)}
        own = {t.name for t in self.tools}
        states = self.turn_states(turn)
        mcp_off = {n for n, state in states.items() if state == "off" and n not in own} if self.mcp_servers else set()
        return frozenset({n for n in own if n not in offered} | mcp_off)

    def repeats_of(self, name: str) -> bool:
        """Whether an identical call of tool ``name`` runs again: its own ``repeats``, else the agent's."""
        own = self.tool(name)
        if own is not None and own.repeats is not None:
            return own.repeats
        return self.repeats

    def for_turn(self, turn: Any, resources: Any = None) -> Agent:
        """The agent as it answers ``turn`` (a TurnInput): its ``settings`` for that turn applied.

        The same object comes back for the same turn event (recent turns are cached), so
        per-worker caches keyed by agent keep working.

        Raises:
            TurnDenied: the settings function refuses the turn (or the turn's payload no
                longer parses: code ``bad_turn``).
            ConfigError: the settings it returned are not valid for this agent.
        """
        if self.settings is None:
            return self
        if resources is None:
            resources = getattr(self, "_resources", None)
        model = turn.model or self.model
        key = (id(turn), model)
        held = self._turns.get(key)
        if held is not None and held[0] is turn:
            return held[1]
        payload = turn.input if turn.input is not None else turn.text
        try:
            parsed = self.parse_input(payload)
        except ValueError as exc:
            raise TurnDenied(str(exc), code=FailureCode.BAD_TURN) from None
        # a turn that names no model, of an agent with no default, is refused as it is published
        changes = self.settings(resources, parsed, cast(str, model))
        if not isinstance(changes, AgentSettings):
            raise ConfigError(
                f"agent {self.name!r}: its settings function returned a {type(changes).__name__}, not AgentSettings"
            )
        agent = changes.applied_to(self)
        if len(self._turns) >= 256:
            self._turns.pop(next(iter(self._turns)))
        self._turns[key] = (turn, agent)
        return agent

    # --- the system prompt and the tool texts of each model ------------------------------------

    def _check_prompt(self) -> None:
        """Refuse a system prompt that cannot be written (at startup, not mid-chat)."""
        prompt = self.system_prompt
        self._prompts: dict[str | None, Prompts] = {}
        self._fixed_system: str | None = None
        self._described: list[Tool] | None = None
        if isinstance(prompt, PromptFile):
            if prompt.system is None:
                raise PromptFileError(f"agent {self.name!r}: its prompt file has no system template")
            try:
                prompt.check_variables(PROMPT_VARIABLES)
                for endpoint in (None, *sorted(prompt.endpoints)):  # every layer's tool texts fit the tools
                    prompt.for_model(endpoint).described(self.tools)
            except PromptFileError as exc:
                where = f" ({prompt.origin_path})" if prompt.origin_path else ""
                raise PromptFileError(f"agent {self.name!r}: its prompt file{where} does not fit it: {exc}") from None
        elif not isinstance(prompt, str) and not callable(prompt):
            raise ConfigError(
                f"agent {self.name!r}: system_prompt must be a text, a PromptFile or a function of (turn, citation), "
                f"got {type(prompt).__name__}"
            )

    @property
    def citation_example(self) -> str | None:
        """The example citation of the agent's citation style (``[1]``), or None when it does not cite."""
        style = self.context.citations if self.context is not None else None
        return style.example if style is not None else None

    def prompts(self) -> Prompts | None:
        """The texts this agent's model (``model``) reads from its prompt file, or None without one."""
        prompt = self.system_prompt
        if not isinstance(prompt, PromptFile):
            return None
        resolved = self._prompts.get(self.model)
        if resolved is None:
            resolved = self._prompts[self.model] = prompt.for_model(self.model)
        return resolved

    @property
    def prompt_digest(self) -> str:
        """The digest of the prompt file texts this agent's model reads (:attr:`Prompts.digest`),
        or ``""`` when its system prompt is not a prompt file."""
        prompts = self.prompts()
        return prompts.digest if prompts is not None else ""

    def described_tools(self) -> list[Tool]:
        """The agent's tools as its model reads them: with the texts its prompt file gives them
        for this model (copies), the others as they are."""
        if self._described is None:
            prompts = self.prompts()
            self._described = (
                prompts.described(self.tools) if prompts is not None and prompts.tools else list(self.tools)
            )
        return self._described

    def parsed_turn(self, turn: Any) -> Any:
        """The turn as the agent's prompt function reads it: its payload parsed into
        :attr:`input` (:meth:`parse_input`); a payload recorded before the app changed its input
        type, which no longer parses, is the turn input as recorded."""
        payload = getattr(turn, "input", None)
        if payload is None:
            payload = getattr(turn, "text", "")
        try:
            return self.parse_input(payload)
        except ValueError:
            return turn

    def system_text(self, turn: Any) -> str:
        """The system prompt of a model call of this agent (on ``model``) answering ``turn``
        (a turn input, or None before any turn), as :mod:`agentstream.declarations.prompts` writes it.

        Pure: the same agent and turn give the same text, so a rebuild from the trace gives the
        request that was sent.

        Raises:
            PromptError: the prompt function raised or returned something else than a text, or
                the prompt file's template failed to render.
        """
        fixed = self._fixed_system
        if fixed is not None:
            return fixed
        prompt = self.system_prompt
        example = self.citation_example
        parsed = self.parsed_turn(turn) if turn is not None else None
        try:
            if isinstance(prompt, str):
                text = fill_prompt(prompt, citation=example or "", context=turn_context(parsed))
                if "{context}" not in prompt:
                    self._fixed_system = text
                return text
            if isinstance(prompt, PromptFile):
                prompts = self.prompts()
                assert prompts is not None
                text = prompts.system(citation=example or "", context=turn_context(parsed))
                if "context" not in prompt.variables:
                    self._fixed_system = text
                return text
            text = prompt(parsed, example)
        except PromptError:
            raise
        except Exception as exc:  # the app's prompt code or template: the turn fails saying why
            raise PromptError(
                f"agent {self.name!r}: its system prompt could not be written: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(text, str):
            raise PromptError(f"agent {self.name!r}: its prompt function returned a {type(text).__name__}, not a text")
        return text

    @property
    def allowed_models(self) -> tuple[str, ...]:
        """The model endpoint ids a turn of this agent may run on: ``model`` (when it has one), then ``models``."""
        first = () if self.model is None else (self.model,)
        return (*first, *(m for m in dict.fromkeys(self.models) if m != self.model))

    def tool(self, name: str) -> Tool | None:
        """The agent's tool of that name, or None."""
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def tool_choice_at(self, tool_passes: int, step: int) -> ToolChoice:
        """The tool choice of the model call at ``step`` (0-based) of a turn.

        Args:
            tool_passes: how many earlier model calls of the turn called tools (since the last
                answer to a request, with ``resets_on_answer``: see :func:`agentstream.steps.decision.passes_before`).
            step: the call's index in the turn.

        Returns:
            ``none`` once ``tool_passes`` reaches ``max_passes + tool_rounds_after_cap`` (or
            without tools); ``auto`` past the cap (the tools are kept, never forced); before it,
            ``first_tool_choice`` at step 0 when set, else ``tool_choice``.
        """
        if not (self.tools or self.mcp_servers) or tool_passes >= self.max_passes + self.tool_rounds_after_cap:
            return "none"
        if tool_passes >= self.max_passes:
            return "auto" if self.tool_choice != "none" else "none"
        if step == 0 and self.first_tool_choice is not None:
            return self.first_tool_choice
        return self.tool_choice

    def answers_request(self, result: Any) -> bool:
        """Whether a tool result (a :class:`~agentstream.wire.events.ToolOutput`) starts the passes
        count again: with ``resets_on_answer``, a delegation's result without an error (a
        subagent's answer to the task the agent handed it)."""
        if not self.resets_on_answer or result.error is not None or getattr(result, "late", False):
            return False
        tool = self.tool(result.name)
        return tool is not None and tool.delegated

    def tool_choice_for(self, step: int) -> ToolChoice:
        """The tool choice at ``step`` when every earlier call of the turn called tools (see
        :meth:`tool_choice_at`)."""
        return self.tool_choice_at(step, step)


_NOT_PER_TURN = frozenset({"name", "model", "models", "input", "settings"})


class AgentSettings:
    """An agent's settings for one turn: what an agent's ``settings`` function returns.

    Give any of :class:`Agent`'s settings by keyword (``system_prompt``, ``tools``,
    ``declared``, ``max_passes``, ``temperature``, ``context``, ...); the others keep the
    agent's. The agent's name, model, allowed models, input type and settings function are not
    per-turn settings::

        def per_model(resources, turn, model):
            if model == "small":
                return AgentSettings(max_passes=3, temperature=0.0)
            if turn.text.startswith("/admin") and not resources.admins:
                raise TurnDenied("admin commands are off", code="forbidden")
            return AgentSettings()

    Raises:
        ConfigError: a keyword that is not a per-turn setting of an agent.
    """

    def __init__(self, **changes: Any) -> None:
        known = {f.name for f in dataclasses.fields(Agent) if f.init} - _NOT_PER_TURN
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(
                f"AgentSettings: {unknown} are not per-turn settings of an agent (settings: {sorted(known)})"
            )
        self.changes = changes

    def __repr__(self) -> str:
        return f"AgentSettings({', '.join(f'{k}={v!r}' for k, v in self.changes.items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AgentSettings) and self.changes == other.changes

    def applied_to(self, agent: Agent) -> Agent:
        """``agent`` with these changes (``agent`` itself when there are none; the same object
        for settings equal to ones applied before).

        Raises:
            ConfigError: the changed agent is not valid (see :class:`Agent`).
        """
        if not self.changes:
            return agent
        made: list[tuple[dict[str, Any], Agent]] = agent.__dict__.setdefault("_applied", [])
        for changes, derived in made:
            if changes == self.changes:
                return derived
        derived = dataclasses.replace(agent, **self.changes, settings=None)
        derived._turns = {}
        if len(made) >= 64:
            made.pop(0)
        made.append((dict(self.changes), derived))
        return derived
