"""agentstream: run LLM agents as services that talk over Redis Streams.

The public API of the shared library: declare an :class:`App` of :class:`Agent` s and
:func:`tool` s (and :class:`Delegation` s, tools that run a subagent); the events of a trace
are in :mod:`agentstream.wire.events`; the context library is :mod:`agentstream.context`.

The library is a folder per layer, bottom first (docs/contributing.md, "Layout"; ``LAYERS`` in
``tests/unit/test_layers.py``), each importing only its own layer and those below:

- :mod:`agentstream.errors`; :mod:`agentstream.wire` (events, codec, keys, failure codes, the
  checks on what a client publishes); :mod:`agentstream.ops` (settings, logs, metrics, tracing);
- pure layers, no Redis, no asyncio, no httpx: :mod:`agentstream.declarations` (what an app
  declares: App, Agent, tools, inputs, prompts), :mod:`agentstream.context` (the context
  library), the model formats of :mod:`agentstream.models`, :mod:`agentstream.steps` (the step
  decision and the fold); subagents (:mod:`agentstream.delegation`);
- :mod:`agentstream.runtime`, the only layer that sends Redis commands, as named operations;
- MCP tools (:mod:`agentstream.mcp_tools`), running an app (:mod:`agentstream.app`: tools in
  threads, loading an app), the services, then :mod:`agentstream.cli`, the testing kit
  (:mod:`agentstream.testing`) and the demo.

This package imports the public names lazily, so importing a pure layer loads only it.

The public API is what this package exports (``__all__``), with each layer package's own
``__all__``; a module whose name starts with an underscore (``agentstream.context._context_fold``)
is internal and may change without notice.
The services (``agentstream_services``) import the runtime and the pure layers, never ``redis``.
``tests/unit/test_layers.py`` checks these rules.
"""

import importlib
from typing import TYPE_CHECKING, Any

from agentstream.errors import AgentStreamError, AgentStreamSignal, ToolCancelled
from agentstream.wire.events import (
    TRACE_SCHEMA_VERSION,
    CitedSource,
    Document,
    Element,
    Image,
    ModelOutput,
    Passage,
    Source,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream.wire.failures import FailureCode

if TYPE_CHECKING:
    from agentstream.app.base import load_app
    from agentstream.declarations.agents import Agent, AgentSettings
    from agentstream.declarations.apps import App
    from agentstream.declarations.inputs import ChatTurnInput, Text, ToolDeclaration, ToolState, TurnDenied
    from agentstream.declarations.tool_context import CallContext, current_call
    from agentstream.declarations.tools import Tool, ToolResult, ToolResultValue, tool
    from agentstream.delegation import Delegation
    from agentstream.mcp_tools import McpServer

_LAZY = {
    "load_app": "agentstream.app.base",
    "Agent": "agentstream.declarations.agents",
    "AgentSettings": "agentstream.declarations.agents",
    "App": "agentstream.declarations.apps",
    "ChatTurnInput": "agentstream.declarations.inputs",
    "Text": "agentstream.declarations.inputs",
    "ToolDeclaration": "agentstream.declarations.inputs",
    "ToolState": "agentstream.declarations.inputs",
    "TurnDenied": "agentstream.declarations.inputs",
    "CallContext": "agentstream.declarations.tool_context",
    "current_call": "agentstream.declarations.tool_context",
    "Tool": "agentstream.declarations.tools",
    "ToolResult": "agentstream.declarations.tools",
    "ToolResultValue": "agentstream.declarations.tools",
    "tool": "agentstream.declarations.tools",
    "Delegation": "agentstream.delegation",
    "McpServer": "agentstream.mcp_tools",
}
"""Public names imported on first use, so that ``import agentstream.wire`` (which runs this
package first) loads only the wire, not the app surface with its threads and HTTP clients."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "TRACE_SCHEMA_VERSION",
    "Agent",
    "AgentSettings",
    "AgentStreamError",
    "AgentStreamSignal",
    "App",
    "CallContext",
    "ChatTurnInput",
    "CitedSource",
    "Delegation",
    "Document",
    "Element",
    "FailureCode",
    "Image",
    "McpServer",
    "ModelOutput",
    "Passage",
    "Source",
    "Text",
    "Tool",
    "ToolCancelled",
    "ToolCall",
    "ToolDeclaration",
    "ToolOutput",
    "ToolResult",
    "ToolResultValue",
    "ToolState",
    "TurnDenied",
    "TurnEnded",
    "TurnFailed",
    "TurnInput",
    "TurnMessage",
    "current_call",
    "load_app",
    "tool",
]
