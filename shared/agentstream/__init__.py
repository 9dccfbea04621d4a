"""agentstream: run LLM agents as services that talk over Redis Streams.

The public API of the shared library: declare an :class:`App` of :class:`Agent` s and
:func:`tool` s (and :class:`Delegation` s, tools that run a subagent); the events of a trace
are in :mod:`agentstream.wire.events`; the context library is :mod:`agentstream.context`.

The library is a folder per layer (README "Layout"):

- pure layers, no Redis, no asyncio, nothing of the runtime: :mod:`agentstream.wire` (events,
  codec, keys, the checks on what a client publishes), :mod:`agentstream.context` (the context
  library), :mod:`agentstream.steps` (the step decision and the fold);
- the model adapters (:mod:`agentstream.models`), subagents (:mod:`agentstream.delegation`),
  MCP tools (:mod:`agentstream.mcp_tools`), the app surface (:mod:`agentstream.app`) and
  operations (:mod:`agentstream.ops`: settings, logs, metrics, tracing);
- :mod:`agentstream.runtime`, the only layer that sends Redis commands, as named operations;
- :mod:`agentstream.cli`, the ``agentstream`` command.

The services (``agentstream_services``) import the runtime and the pure layers, never ``redis``.
``tests/unit/test_layers.py`` checks these rules.
"""

from agentstream.app.base import Agent, AgentSettings, App, Tool, ToolResult, ToolResultValue, load_app, tool
from agentstream.app.inputs import ChatTurnInput, Text, ToolDeclaration, ToolState, TurnDenied
from agentstream.app.tool_context import CallContext, current_call
from agentstream.delegation import Delegation
from agentstream.errors import AgentStreamError, AgentStreamSignal, ToolCancelled
from agentstream.mcp_tools import McpServer
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
