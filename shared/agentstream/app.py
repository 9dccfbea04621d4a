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
import contextvars
import importlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pydantic

from agentstream.errors import ConfigError, ToolArgumentsError, ToolCancelled, ToolTimeoutError

if TYPE_CHECKING:
    from agentstream.context.limits import ModelLimits
    from agentstream.context.render import ContextConfig

ToolChoice = Literal["auto", "required", "none"]


@dataclass(frozen=True)
class ToolResultValue:
    """What running a tool gave: the text shown to the model, its data, or an error."""

    text: str
    data: Any = None
    error: str | None = None


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
    ):
        self.fn = fn
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0].strip()
        self.timeout_s = timeout_s
        self.queue = queue
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
            ToolArgumentsError: the text is not a JSON object or does not match the schema; the
                message says what and where, for the model to correct.
        """
        text = raw.strip()
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
        text tells the model what went wrong. A sync tool runs in a daemon thread of its own, so
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
        except (asyncio.TimeoutError, ToolTimeoutError):
            return ToolResultValue(
                text=f"Error: tool {self.name!r} did not finish within {limit:g} s", error="timeout"
            )
        except ToolCancelled as exc:
            return ToolResultValue(text=f"Cancelled: tool {self.name!r} stopped because its turn was cancelled ({exc}); "
                                   "it may have partly run.", error="cancelled")
        except Exception as exc:  # the tool's own failure becomes the model's error result
            return ToolResultValue(text=f"Error: tool {self.name!r} raised {type(exc).__name__}: {exc}", error="tool_error")
        return _as_result(value)


def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> asyncio.Future[Any]:
    """Run ``fn(**kwargs)`` in a new daemon thread (with the caller's context vars) → a future.

    Unlike ``asyncio.to_thread``, the thread is not joined when the event loop or the process
    shuts down, so a stuck sync tool cannot hold a stopping worker past its grace period.
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

    def target() -> None:
        try:
            value, error = context.run(fn, **kwargs), None
        except Exception as exc:
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits for this result any more
            pass

    threading.Thread(target=target, name=f"tool:{name}", daemon=True).start()
    return future


def _as_result(value: Any) -> ToolResultValue:
    if isinstance(value, ToolResultValue):
        return value
    if isinstance(value, str):
        return ToolResultValue(text=value)
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    try:
        data = msgspec.to_builtins(value)
        text = msgspec.json.encode(data).decode()
    except (TypeError, msgspec.EncodeError):
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
) -> Any:
    """Make a :class:`Tool` of a function; use as ``@tool`` or ``@tool(timeout_s=5, side_effects=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f, name=name, description=description, timeout_s=timeout_s, queue=queue,
            side_effects=side_effects, retry_safe=retry_safe,
        )

    return wrap(fn) if fn is not None else wrap


@dataclass
class Agent:
    """An agent: who answers a turn, with which model and tools.

    Attributes:
        name: the name turns use in their ``agent`` field.
        system_prompt: the system prompt text.
        model: a model endpoint id from the settings (``default`` is the one from OPENAI_* or
            the embedded local model).
        tools: the tools the model may call.
        max_passes: the passes cap: the most model calls in one turn. The last pass is made
            without tools, so the turn ends with an answer.
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
    """

    name: str
    system_prompt: str
    model: str = "default"
    tools: Sequence[Tool] = ()
    max_passes: int = 8
    tool_choice: ToolChoice = "auto"
    first_tool_choice: ToolChoice | None = None
    max_output_tokens: int = 512
    temperature: float = 0.0
    context: ContextConfig | None = None
    model_limits: ModelLimits | None = None

    def __post_init__(self) -> None:
        if self.max_passes < 1:
            raise ConfigError(f"agent {self.name!r}: max_passes must be at least 1, got {self.max_passes}")
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"agent {self.name!r}: tool names used twice: {duplicates}")

    def tool(self, name: str) -> Tool | None:
        """The agent's tool of that name, or None."""
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def tool_choice_for(self, step: int) -> ToolChoice:
        """The tool choice on pass ``step`` (0-based); the last pass is always ``none``."""
        if not self.tools or step >= self.max_passes - 1:
            return "none"
        if step == 0 and self.first_tool_choice is not None:
            return self.first_tool_choice
        return self.tool_choice


@dataclass
class App:
    """The agents and tools of one deployment. Every service loads the same app."""

    agents: Sequence[Agent]
    extra_tools: Sequence[Tool] = field(default=())

    def __post_init__(self) -> None:
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
        for t in by_name.values():
            t.check(self)

    def agent(self, name: str) -> Agent | None:
        """The agent of that name, or None."""
        return self._agents.get(name)

    def tool(self, name: str) -> Tool | None:
        """Any agent's tool of that name, or None."""
        return self._tools.get(name)

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    @property
    def tool_queues(self) -> list[str]:
        """Every tool queue the app's tools use, sorted (delegations use none)."""
        return sorted({t.queue for t in self._tools.values() if not t.delegated})


def load_app(path: str) -> App:
    """Import ``module:attribute`` → the App there.

    Raises:
        ConfigError: the path is malformed, the module does not import, or the attribute is
            missing or not an App.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"app path {path!r} must look like 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r} (from {path!r}): {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"app module {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, App):
        obj = obj()
    if not isinstance(obj, App):
        raise ConfigError(f"{path!r} is a {type(obj).__name__}, not an agentstream App")
    return obj


def elapsed_ms(start: float) -> float:
    """Milliseconds since ``start`` (a ``time.perf_counter()`` value)."""
    return (time.perf_counter() - start) * 1000.0
