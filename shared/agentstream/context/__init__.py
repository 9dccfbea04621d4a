"""The shared context library: trace events → the exact request of any model call.

Pure: no Redis, no asyncio, no clock. The services call it; any worker rebuilds the
byte-identical request of any step from the stored trace.
"""

from agentstream.context.builder import build_messages, build_request, tool_definitions
from agentstream.context.request import (
    AssistantMessage,
    ChatRequest,
    Message,
    ToolDefinition,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "AssistantMessage",
    "ChatRequest",
    "Message",
    "ToolDefinition",
    "ToolResultMessage",
    "UserMessage",
    "build_messages",
    "build_request",
    "tool_definitions",
]
