"""The provider-neutral chat request that the context library builds from a trace.

Shapes (all frozen msgspec Structs, so a request encodes to the same bytes in any process):

- :class:`ChatRequest`: system prompt, messages, tool definitions, tool choice, output limit.
- messages: :class:`UserMessage`, :class:`AssistantMessage`, :class:`ToolResultMessage`.

Each provider adapter turns a ChatRequest into its own body (see ``agentstream.models``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentstream.wire.events import Image, ToolCall, ToolsOffered


class UserMessage(msgspec.Struct, frozen=True, kw_only=True, tag="user"):
    """A user's message.

    ``images`` are the images sent with it (an adapter that cannot send images leaves them out).
    """

    text: str
    images: tuple[Image, ...] = ()


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True, tag="assistant"):
    """A model's earlier output, replayed.

    ``replay_blocks`` and ``reasoning`` are passed on only to the provider and model that made
    them (the adapter decides; the builder keeps them with their origin).
    """

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    provider: str = ""
    model: str = ""
    replay_blocks: tuple[dict[str, Any], ...] = ()


class ToolResultMessage(msgspec.Struct, frozen=True, kw_only=True, tag="tool"):
    """The result of one tool call; always right after its call's assistant message."""

    call_id: str
    name: str
    text: str
    is_error: bool = False
    images: tuple[Image, ...] = ()


Message = UserMessage | AssistantMessage | ToolResultMessage


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


def offered_definitions(event: ToolsOffered) -> tuple[ToolDefinition, ...]:
    """The definitions of the MCP tools a ``tools_offered`` event records, in its order."""
    return tuple(ToolDefinition(name=t.name, description=t.description, parameters=t.parameters) for t in event.tools)


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One model call's whole input, provider-neutral.

    Attributes:
        system: the system prompt.
        messages: the history, starting on a user message.
        tools: the tools offered (empty when none are).
        tool_choice: ``auto``, ``required`` or ``none``.
        max_output_tokens: the output limit in tokens.
        temperature: sampling temperature.
    """

    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: str = "auto"
    max_output_tokens: int = 512
    temperature: float = 0.0
