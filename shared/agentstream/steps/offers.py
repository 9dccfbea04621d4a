"""Which MCP tools an agent offers, and what the trace recorded of them (pure: no I/O).

The tool workers of a server publish its **catalog** (the tools it lists, their schemas
normalised, the tools refused and why). Before each model call the agent loop works out what
the agent should offer from the catalogs of its servers (:func:`desired_offer`: the allow-list,
the prompt file's descriptions, the agent's own tools first) and compares it with the last
:class:`~agentstream.wire.events.ToolsOffered` the trace holds for the agent
(:func:`latest_offer`); when they differ it records the new one before the call. The context
library offers what the trace recorded, so replay needs no server.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from agentstream.wire.events import Event, OfferedTool, ToolsOffered

if TYPE_CHECKING:
    from agentstream.declarations.agents import Agent


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A tool of a server that is not offered: its name, the schema keyword at fault and why."""

    tool: str
    keyword: str
    reason: str


class Catalog(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool worker last read of an MCP server's tools (stored as JSON in Redis).

    Attributes:
        server: the server's name in the app.
        tools: the tools it lists that may be offered (schemas normalised), in its order.
        refused: the tools whose schemas cannot be offered.
        digest: :func:`offer_digest` of ``tools``.
        listed_at_ms: when it was read (Unix time in milliseconds).
        worker: the consumer name of the tool worker that read it.
    """

    server: str
    tools: tuple[OfferedTool, ...] = ()
    refused: tuple[Refusal, ...] = ()
    digest: str = ""
    listed_at_ms: int = 0
    worker: str = ""


_encoder = msgspec.json.Encoder(order="sorted")


def offer_digest(tools: Sequence[OfferedTool]) -> str:
    """16 hex characters of the sha256 of the tools as canonical JSON (keys sorted)."""
    return hashlib.sha256(_encoder.encode(tuple(tools))).hexdigest()[:16]


def latest_offer(events: Sequence[Event], agent_name: str) -> ToolsOffered | None:
    """The last ``tools_offered`` event of the agent in ``events``, or None."""
    for event in reversed(events):
        if isinstance(event, ToolsOffered) and event.agent == agent_name:
            return event
    return None


def offered_tool(events: Sequence[Event], agent_name: str, name: str) -> OfferedTool | None:
    """The MCP tool ``name`` as the agent's calls last offered it, or None."""
    offer = latest_offer(events, agent_name)
    if offer is None:
        return None
    return next((t for t in offer.tools if t.name == name), None)


def described(tool: OfferedTool, prompts: Any) -> OfferedTool:
    """``tool`` with the texts a prompt file's ``tools`` entry gives it (description, arguments).

    ``prompts`` is an :class:`agentstream.declarations.prompts.Prompts` (or anything with a ``tools``
    mapping of :class:`~agentstream.declarations.prompts.ToolTexts`); an argument the schema does not have
    is left alone (the tool workers log the mismatch).
    """
    texts = getattr(prompts, "tools", {}).get(tool.name) if prompts is not None else None
    if texts is None:
        return tool
    parameters = tool.parameters
    if texts.arguments:
        parameters = copy.deepcopy(parameters)
        properties = parameters.get("properties", {})
        for arg, text in texts.arguments.items():
            if isinstance(properties.get(arg), dict):
                properties[arg]["description"] = text
    description = texts.description if texts.description is not None else tool.description
    return OfferedTool(name=tool.name, description=description, parameters=parameters, server=tool.server)


def desired_offer(agent: Agent, catalogs: Mapping[str, Catalog | None]) -> tuple[tuple[OfferedTool, ...], list[str]]:
    """The MCP tools the agent should offer now, and why any listed tool is left out.

    Servers in the agent's order, tools in each server's order; a tool the allow-list does not
    name is left out silently, one named like one of the agent's own tools or an earlier
    server's tool is left out with a reason.

    Args:
        agent: the agent (its ``tools`` and ``mcp_servers``).
        catalogs: each server's catalog by name (None: no tool worker has published one yet).

    Returns:
        ``(tools, problems)``: the offer, and one line per tool left out by a name clash.
    """
    taken = {t.name for t in agent.tools}
    out: list[OfferedTool] = []
    problems: list[str] = []
    for server in agent.mcp_servers:
        catalog = catalogs.get(server.name)
        if catalog is None:
            continue
        for tool in catalog.tools:
            if not server.allows(tool.name):
                continue
            if tool.name in taken:
                problems.append(
                    f"MCP server {server.name!r} lists tool {tool.name!r}, but agent {agent.name!r} already has a tool "
                    "of that name: not offered"
                )
                continue
            taken.add(tool.name)
            out.append(
                described(
                    OfferedTool(
                        name=tool.name, description=tool.description, parameters=tool.parameters, server=server.name
                    ),
                    server.prompts,
                )
            )
    return tuple(out), problems
