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
result (see :func:`invoke_tool`) and never stops the worker.

This module is the running part of an app: tools run in threads (:func:`invoke_tool`), apps load
from ``module:attribute`` (:func:`load_app`). What an app declares (:class:`Agent`, tools, inputs,
prompts) is :mod:`agentstream.declarations`, which the pure core imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import importlib.machinery
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentstream.errors import ConfigError, ToolArgumentsError, ToolCancelled, ToolTimeoutError

if TYPE_CHECKING:
    pass


from agentstream.declarations.agents import Agent, AgentSettings, ToolChoice
from agentstream.declarations.apps import App
from agentstream.declarations.tools import Tool, ToolResult, ToolResultValue, tool
from agentstream.declarations.tools import _as_result as as_result

__all__ = [
    "TOOL_THREAD_IDLE_S",
    "Agent",
    "AgentSettings",
    "App",
    "Tool",
    "ToolChoice",
    "ToolResult",
    "ToolResultValue",
    "elapsed_ms",
    "invoke_tool",
    "load_app",
    "tool",
]
"""Besides the running part (:func:`invoke_tool`, :func:`load_app`), the declarations of
:mod:`agentstream.declarations` under the names code written before the split imports from here."""


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

    def _serve(self, job: Callable[[], Callable[[], None] | None]) -> None:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        while True:
            then = job()
            del job  # nothing of the call is kept while idle
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


async def invoke_tool(tool: Tool, raw_arguments: str, *, timeout_s: float | None = None) -> ToolResult:
    """Run the tool on raw argument text; never raises for the tool's own failures.

    Bad arguments, an exception in the tool and a timeout each give an error result whose
    text tells the model what went wrong. A sync tool runs in a daemon thread (kept for later calls), so
    it blocks neither the worker's event loop nor its exit: a sync tool still running after
    its timeout, or when the worker stops after its shutdown grace period, is abandoned (it
    should check :func:`agentstream.current_call` ``.cancelled`` to stop early).

    A tool class with its own way to run (an MCP server's tool, a delegation) defines an
    ``invoke(raw_arguments, *, timeout_s=None)`` coroutine method, which this calls instead.

    Args:
        tool: the tool.
        raw_arguments: the call's arguments as the model wrote them (JSON object text).
        timeout_s: the longest run in seconds (default: the tool's ``timeout_s``).

    Returns:
        The call's result; an error result (``error`` set) for bad arguments, a failure, a
        timeout or a cancellation.
    """
    own = getattr(tool, "invoke", None)
    if own is not None:
        return await own(raw_arguments, timeout_s=timeout_s)
    try:
        kwargs = tool.parse_arguments(raw_arguments)
    except ToolArgumentsError as exc:
        return ToolResult(text=f"Error: {exc}", error="invalid_arguments")
    limit = tool.timeout_s if timeout_s is None else timeout_s
    try:
        if tool.is_async:
            value = await asyncio.wait_for(tool.fn(**kwargs), timeout=limit)
        else:
            value = await asyncio.wait_for(_in_daemon_thread(tool.fn, kwargs, tool.name), timeout=limit)
    except (TimeoutError, ToolTimeoutError):
        return ToolResult(text=f"Error: tool {tool.name!r} did not finish within {limit:g} s", error="timeout")
    except ToolCancelled as exc:
        return ToolResult(
            text=f"Cancelled: tool {tool.name!r} stopped because its turn was cancelled ({exc}); "
            "it may have partly run.",
            error="cancelled",
        )
    except Exception as exc:  # the tool's own failure becomes the model's error result
        return ToolResult(text=f"Error: tool {tool.name!r} raised {type(exc).__name__}: {exc}", error="tool_error")
    try:
        return as_result(value)
    except Exception as exc:  # not even its str() (nesting past the stack, a failing __str__)
        return ToolResult(
            text=f"Error: tool {tool.name!r} returned a value that cannot be stored ({type(exc).__name__}: {exc})",
            error="invalid_result",
        )


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
