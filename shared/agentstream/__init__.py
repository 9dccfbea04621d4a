"""agentstream: run LLM agents as services that talk over Redis Streams.

The public API of the shared library: declare an :class:`App` of :class:`Agent` s and
:func:`tool` s (and :class:`Delegation` s, tools that run a subagent); the events of a trace
are in :mod:`agentstream.events`; the context library is :mod:`agentstream.context`.
"""

from agentstream.app import Agent, App, Tool, ToolResultValue, load_app, tool
from agentstream.delegation import Delegation
from agentstream.errors import AgentStreamError, ToolCancelled
from agentstream.events import (
    TRACE_SCHEMA_VERSION,
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream.tool_context import CallContext, current_call

__all__ = [
    "TRACE_SCHEMA_VERSION",
    "Agent",
    "AgentStreamError",
    "App",
    "Delegation",
    "CallContext",
    "ModelOutput",
    "Tool",
    "ToolCancelled",
    "ToolCall",
    "ToolOutput",
    "ToolResultValue",
    "TurnEnded",
    "TurnFailed",
    "TurnInput",
    "TurnMessage",
    "current_call",
    "load_app",
    "tool",
]
