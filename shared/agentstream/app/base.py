"""The user's app: agents and tools, loaded by every service from ``module:attribute``.

An app module declares tools as typed Python functions and agents that use them::

    from agentstream import App, Agent, tool

    @tool
    def add(a: float, b: float) -> float:
        "Add two numbers."
        return a + b

    app = App(agents=[Agent(name="calc", system_prompt="You add numbers.", tools=[add])])

Each service loads it with ``--app mypkg.agents:app`` (as task-queue workers load theirs).
A tool's JSON schema for the model comes from its signature through pydantic; its arguments are
validated before the call; a tool that raises or gets bad arguments gives the model an error
result (see :meth:`Tool.invoke`) and never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import importlib
import importlib.machinery
import inspect
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pydantic

from agentstream.app.inputs import (
    RenderInput,
    Text,
    ToolDeclaration,
    TurnDenied,
    check_declarations,
    offered_names,
    parse_payload,
)
from agentstream.app.prompts import (
    PROMPT_VARIABLES,
    PromptFile,
    PromptFileError,
    PromptFunction,
    Prompts,
    fill_prompt,
    turn_context,
)
from agentstream.errors import ConfigError, PromptError, ToolArgumentsError, ToolCancelled, ToolTimeoutError
from agentstream.mcp_tools.server import McpServer
from agentstream.wire.codec import ENCODE_ERRORS
from agentstream.wire.failures import FailureCode
from agentstream.wire.jsontext import arguments_unicode_refusal
from agentstream.wire.keys import check_queue_name

if TYPE_CHECKING:
    from agentstream.context.limits import ModelLimits
    from agentstream.context.render import ContextConfig

ToolChoice = Literal["auto", "required", "none"]


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
    ):
        self.fn = fn
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

    def check(self, app: App) -> None:
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

    async def invoke(self, raw_arguments: str, *, timeout_s: float | None = None) -> ToolResultValue:
        """Run the tool on raw argument text; never raises for the tool's own failures.

        Bad arguments, an exception in the tool and a timeout each give an error result whose
        text tells the model what went wrong. A sync tool runs in a daemon thread (kept for later calls), so
        it blocks neither the worker's event loop nor its exit: a sync tool still running after
        its timeout, or when the worker stops after its shutdown grace period, is abandoned (it
        should check :func:`agentstream.current_call` ``.cancelled`` to stop early).
        """
        try:
            kwargs = self.parse_arguments(raw_arguments)
        except ToolArgumentsError as exc:
            return ToolResultValue(text=f"Error: {exc}", error="invalid_arguments")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            if self.is_async:
                value = await asyncio.wait_for(self.fn(**kwargs), timeout=limit)
            else:
                value = await asyncio.wait_for(_in_daemon_thread(self.fn, kwargs, self.name), timeout=limit)
        except (TimeoutError, ToolTimeoutError):
            return ToolResultValue(text=f"Error: tool {self.name!r} did not finish within {limit:g} s", error="timeout")
        except ToolCancelled as exc:
            return ToolResultValue(
                text=f"Cancelled: tool {self.name!r} stopped because its turn was cancelled ({exc}); "
                "it may have partly run.",
                error="cancelled",
            )
        except Exception as exc:  # the tool's own failure becomes the model's error result
            return ToolResultValue(
                text=f"Error: tool {self.name!r} raised {type(exc).__name__}: {exc}", error="tool_error"
            )
        try:
            return _as_result(value)
        except Exception as exc:  # not even its str() (nesting past the stack, a failing __str__)
            return ToolResultValue(
                text=f"Error: tool {self.name!r} returned a value that cannot be stored ({type(exc).__name__}: {exc})",
                error="invalid_result",
            )


TOOL_THREAD_IDLE_S = 60.0
"""How long an idle tool thread waits for its next call before it ends (seconds)."""


class _ToolThreads:
    """Daemon threads that run sync tools, kept for the next call once one returns.

    Starting a thread per call cost the tool worker a fifth of its CPU under load. A thread
    whose tool returned waits up to :data:`TOOL_THREAD_IDLE_S` for another call; a call that
    finds no idle thread starts a new one, so a stuck tool only keeps its own thread. The
    threads are daemons: nothing joins them at exit. A tool's thread-local data may outlive its
    call (as in any thread pool); its context variables do not (each call runs in a copy of
    its caller's context).
    """

    def __init__(self, idle_s: float = TOOL_THREAD_IDLE_S) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # each idle thread's inbox, the newest last

    def submit(self, job: Callable[[], Callable[[], None] | None], name: str) -> None:
        """Run ``job()`` on an idle thread, or on a new one named ``name``.

        What ``job`` returns, if not None, is called once the thread is idle again (so a caller
        told of the result there finds the thread free for its next call)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put((job, name))
            return
        threading.Thread(target=self._serve, args=(job,), name=name, daemon=True).start()

    def _serve(self, job: Callable[[], None]) -> None:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        while True:
            then = job()
            job = None  # type: ignore[assignment]  # nothing of the call is kept while idle
            with self._lock:
                self._idle.append(inbox)
            if then is not None:
                then()
                then = None
            try:
                job, name = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody handed it a call: end
                        self._idle.remove(inbox)
                        return
                job, name = inbox.get()  # taken just now: its call is on the way
            threading.current_thread().name = name


_TOOL_THREADS = _ToolThreads()


def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> asyncio.Future[Any]:
    """Run ``fn(**kwargs)`` in a daemon thread (with the caller's context vars) → a future.

    Unlike ``asyncio.to_thread``, the thread is not joined when the event loop or the process
    shuts down, so a stuck sync tool cannot hold a stopping worker past its grace period. The
    threads are reused (:class:`_ToolThreads`); a call never waits for a busy one.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> Callable[[], None]:
        try:
            value, error = context.run(fn, **kwargs), None
        except Exception as exc:
            value, error = None, exc

        def tell() -> None:  # once the thread is idle: the caller's next call can reuse it
            try:
                loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:  # the loop is closed: nobody waits for this result any more
                pass

        return tell

    _TOOL_THREADS.submit(target, f"tool:{name}")
    return future


def _as_result(value: Any) -> ToolResult:
    from agentstream.app.readable import bytes_value, readable_data, readable_text
    from agentstream.wire.events import Element

    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(text=readable_text(value))
    if isinstance(value, (bytes, bytearray, memoryview)):  # text, an image, or described (agentstream.app.readable)
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
        )

    return wrap(fn) if fn is not None else wrap


@dataclass
class Agent:
    """An agent: who answers a turn, with which model and tools.

    Attributes:
        name: the name turns use in their ``agent`` field.
        system_prompt: the system prompt, written anew for each model call (see
            :mod:`agentstream.app.prompts`): a text whose ``{citation}`` (the example citation of
            the agent's citation style, ``[1]`` for ``BRACKETS``; empty without one) and
            ``{context}`` (the context text the turn brings; empty without one) are filled in
            one pass, other braces staying as written; a function of (the parsed turn, the
            example citation or None) that returns the text; or a
            :class:`~agentstream.app.prompts.PromptFile`, of which each call reads the layer naming
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
        input: the pydantic type a turn's payload parses into (:class:`~agentstream.app.inputs.Text`
            by default: a plain message; :class:`~agentstream.app.inputs.ChatTurnInput` adds tool
            states and context). Parsed strictly: a turn with an unknown field is refused.
        render_input: how the model reads a parsed input, ``render(parsed, show, turn_input) ->
            text | None`` (:data:`agentstream.app.inputs.RenderInput`); None shows the input's
            elements, then its text. An input the type no longer parses is shown as recorded.
            A hidden input leaves its turn's other messages in place: hiding the first turn's
            makes the history start on an assistant message, which some providers refuse.
        declared: the tools the agent has and its rule for offering each
            (:class:`~agentstream.app.inputs.ToolDeclaration`: default state, locked, the
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
            :class:`~agentstream.app.inputs.TurnDenied` to refuse the turn: it then fails with the
            error's code and reason and no model is called. It must be a pure function of its
            arguments (it runs again when any worker rebuilds the turn's context). The tools it
            gives must be the app's (an agent's ``tools`` or ``App(extra_tools=...)``), so the
            tool workers can run them.

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
        if self.tool_rounds_after_cap < 0:
            raise ConfigError(
                f"agent {self.name!r}: tool_rounds_after_cap must be at least 0, got {self.tool_rounds_after_cap}"
            )
        servers = [t for t in self.tools if isinstance(t, McpServer)]
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
        else:
            from agentstream.context.policy import ContextPolicy  # the default policy's

            reopen = ContextPolicy().reopen
        if reopen is not None and reopen.name in names:
            raise ConfigError(
                f"agent {self.name!r}: its tool {reopen.name!r} has the name of the reopen tool that its context "
                "policy adds; rename the tool or the reopen tool (Reopen(name=...))"
            )
        if self.declared is not None:
            self.declared = tuple(self.declared)
            check_declarations(self.name, self.declared, names, [reopen.name] if reopen is not None else [])
        self._turns: dict[tuple[int, str], tuple[Any, Agent]] = {}  # the agent of recent turns (a cache)
        self.result_as_answer = tuple(self.result_as_answer)
        unknown = [n for n in self.result_as_answer if n not in names]
        if unknown and not self.mcp_servers:
            raise ConfigError(
                f"agent {self.name!r}: result_as_answer names tools it does not have: {unknown} (its tools: {names})"
            )
        self._check_prompt()

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
        """A turn's payload parsed into :attr:`input` (see :func:`agentstream.app.inputs.parse_payload`).

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
        changes = self.settings(resources, parsed, model)
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
        self._prompts: dict[str, Prompts] = {}
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
        (a turn input, or None before any turn), as :mod:`agentstream.app.prompts` writes it.

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


@dataclass
class App:
    """The agents and tools of one deployment. Every service loads the same app.

    Attributes:
        agents: the agents, by their unique names.
        extra_tools: tools no agent offers but workers must run (a tool a subagent's
            delegation declares elsewhere).
        element_types: the app's own element classes (subclasses of ``Element``, each with an
            explicit ``tag=``), which tools may return and the trace stores.
        event_types: the app's own event classes (msgspec Structs with an explicit ``tag=``),
            which tools may record (``ToolResult.events``) and agents render
            (``ContextConfig.renderers``).
        resources: what the agents' ``settings`` functions get as their first argument (the
            app's clients, feature flags, quotas); any object, None by default.

    Raises:
        ConfigError: two agents or two different tools share a name, or a registered type has
            no explicit tag or shares its tag with another type (see :mod:`agentstream.wire.registry`).
    """

    agents: Sequence[Agent]
    extra_tools: Sequence[Tool] = field(default=())
    element_types: Sequence[type] = field(default=())
    event_types: Sequence[type] = field(default=())
    resources: Any = None

    def __post_init__(self) -> None:
        from agentstream.wire.codec import TraceCodec
        from agentstream.wire.registry import AppTypes

        for agent in self.agents:
            agent._resources = self.resources  # what its settings function gets

        self.types = AppTypes(tuple(self.element_types), tuple(self.event_types))
        self.codec = TraceCodec(self.types)
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent names used twice: {sorted({n for n in names if names.count(n) > 1})}")
        by_name: dict[str, Tool] = {}
        for t in [*self.extra_tools, *(t for a in self.agents for t in a.tools)]:
            other = by_name.setdefault(t.name, t)
            if other is not t and other.fn is not t.fn:
                raise ConfigError(f"two different tools are named {t.name!r}")
        self._tools = by_name
        self._agents = {a.name: a for a in self.agents}
        servers: dict[str, McpServer] = {}
        for server in (s for a in self.agents for s in a.mcp_servers):
            other = servers.setdefault(server.name, server)
            if other is not server:
                raise ConfigError(f"two different MCP servers are named {server.name!r}; declare it once and share it")
        self._mcp_servers = servers
        for t in by_name.values():
            t.check(self)

    def agent(self, name: str) -> Agent | None:
        """The agent of that name, or None."""
        return self._agents.get(name)

    def turn_input(self, message: Any) -> Any:
        """A published turn (a :class:`~agentstream.wire.events.TurnMessage` that passed the wire's
        checks) → the :class:`~agentstream.wire.events.TurnInput` its trace records.

        The payload is parsed into its agent's input type; the agent's settings for the turn
        are made (its ``settings`` function, on the model the turn names); the state of each
        declared tool is resolved from what the input asks (its ``tools`` field) and recorded,
        with the instructions of the tools it requires, so every later context shows the turn
        as it was admitted. The raw payload is kept (``input``).

        Raises:
            TurnRejected: code ``bad_turn``: the payload does not parse, or asks a tool state
                the agent does not allow (:func:`agentstream.app.inputs.tool_states`); the code the
                settings function's :class:`~agentstream.app.inputs.TurnDenied` gives; ``config``:
                the settings it returned are not valid.
        """
        from agentstream.app.inputs import payload_text, required_instructions, tool_states
        from agentstream.errors import TurnRejected
        from agentstream.wire.events import TurnInput

        def refused(reason: str, code: str = FailureCode.BAD_TURN) -> TurnRejected:
            return TurnRejected(
                f"turn {message.turn_id!r} for agent {message.agent!r}: {reason}",
                trace_id=message.trace_id,
                turn_id=message.turn_id,
                reply_to=message.reply_to,
                metadata=message.metadata,
                code=code,
            )

        payload = message.payload
        recorded = TurnInput(
            turn_id=message.turn_id,
            agent=message.agent,
            text=payload if isinstance(payload, str) else "",
            metadata=message.metadata,
            reply_to=message.reply_to,
            elements=message.elements,
            model=message.model,
            input=message.input,
        )
        agent = self.agent(message.agent)
        if agent is None:
            return recorded
        try:
            parsed = agent.parse_input(payload)
        except ValueError as exc:
            raise refused(str(exc)) from None
        text = payload_text(parsed, payload)
        if message.model is None and agent.model is None:
            raise refused(
                f"it names no model in its field `model`, and agent {agent.name!r} has no default model: "
                f"name one of {', '.join(agent.allowed_models)}"
            )
        if message.model is not None and message.model not in agent.allowed_models:
            # refused before anything of the turn is stored, as every other refusal of a turn is
            raise refused(
                f"it names model {message.model!r} in its field `model`, which agent {agent.name!r} "
                f"does not allow (allowed: {', '.join(agent.allowed_models)})"
            )
        try:
            turn_agent = agent.for_turn(recorded)
            unknown = [t.name for t in turn_agent.tools if self._tools.get(t.name) is not t]
            if unknown:  # the tool workers run only the app's tools
                raise ConfigError(f"tools {unknown} are not the app's (give them to an agent or App(extra_tools=...))")
            declared = turn_agent.declarations
            states = tool_states(declared, turn_agent.suppliable_names(), getattr(parsed, "tools", None) or {})
        except TurnDenied as exc:
            raise refused(exc.reason, exc.code) from None
        except ConfigError as exc:
            raise refused(f"its settings for this turn are not valid: {exc}", "config") from None
        if not declared:
            return msgspec.structs.replace(recorded, text=text)
        return msgspec.structs.replace(
            recorded, text=text, tools=states, instructions=required_instructions(declared, states)
        )

    def tool(self, name: str) -> Tool | None:
        """Any agent's tool of that name, or None."""
        return self._tools.get(name)

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    @property
    def mcp_servers(self) -> dict[str, McpServer]:
        """Every MCP server any agent uses, by name."""
        return dict(self._mcp_servers)

    @property
    def tool_queues(self) -> list[str]:
        """Every tool queue the app's tools and MCP servers use, sorted (delegations use none)."""
        queues = {t.queue for t in self._tools.values() if not t.delegated}
        return sorted(queues | {s.queue for s in self._mcp_servers.values()})


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
        made = agent.__dict__.setdefault("_applied", [])
        for changes, derived in made:
            if changes == self.changes:
                return derived
        derived = dataclasses.replace(agent, **self.changes, settings=None)
        derived._turns = {}
        if len(made) >= 64:
            made.pop(0)
        made.append((dict(self.changes), derived))
        return derived


def _import_app_module(module_name: str):
    """Import ``module_name``, its top-level module looked up in the current directory first.

    The current directory is put first on ``sys.path`` only when that top-level module (a file
    ``<name>.py`` or a folder ``<name>/``) is there, and only while it imports (its own imports
    of modules beside it work then); it is taken off again after, so a file there (``h2.py``,
    ``redis.py``) never shadows a module agentstream or its dependencies import later. A
    directory already on ``sys.path`` is left as it is.

    Raises:
        whatever the import raises.
    """
    here = os.getcwd()
    top = module_name.partition(".")[0]
    local = (
        top not in sys.modules
        and "" not in sys.path
        and here not in sys.path
        and importlib.machinery.PathFinder.find_spec(top, [here]) is not None
    )
    if not local:
        return importlib.import_module(module_name)
    sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(here)


def load_app(path: str) -> App:
    """Import ``module:attribute`` → the App there. The module is looked up from the current
    directory first (as uvicorn and celery do), then ``sys.path``; the current directory is on
    ``sys.path`` only while the app module imports (see :func:`_import_app_module`), so the app's
    own modules beside it are imported by the app module, not later.

    Raises:
        ConfigError: the path is malformed, the module does not import, the attribute is
            missing or not an App, or it is a factory that raised.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"app path {path!r} must look like 'package.module:attribute'")
    try:
        module = _import_app_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r} (from {path!r}): {exc}") from exc
    except Exception as exc:  # the module itself fails (SyntaxError, NameError, ...): say where
        where = f" ({exc.filename}, line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise ConfigError(
            f"app module {module_name!r} (from {path!r}) failed to import: {type(exc).__name__}: {exc}{where}"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"app module {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, App):
        try:
            obj = obj()
        except Exception as exc:  # the app's factory fails: say which, as a failing import does
            raise ConfigError(f"app factory {path!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, App):
        raise ConfigError(f"{path!r} is a {type(obj).__name__}, not an agentstream App")
    return obj


def elapsed_ms(start: float) -> float:
    """Milliseconds since ``start`` (a ``time.perf_counter()`` value)."""
    return (time.perf_counter() - start) * 1000.0
