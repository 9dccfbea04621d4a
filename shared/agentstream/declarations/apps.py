"""An app's declaration: the agents and tools of one deployment (every service loads the same one).

Loading an app from ``module:attribute`` is :func:`agentstream.app.base.load_app`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from agentstream.declarations.inputs import (
    TurnDenied,
)
from agentstream.declarations.mcp_servers import McpServer
from agentstream.errors import ConfigError
from agentstream.wire.failures import FailureCode

if TYPE_CHECKING:
    pass


from agentstream.declarations.agents import Agent
from agentstream.declarations.tools import Tool


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
            known = servers.setdefault(server.name, server)
            if known is not server:
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
                the agent does not allow (:func:`agentstream.declarations.inputs.tool_states`); the code the
                settings function's :class:`~agentstream.declarations.inputs.TurnDenied` gives; ``config``:
                the settings it returned are not valid.
        """
        from agentstream.declarations.inputs import payload_text, required_instructions, tool_states
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
            approval=tuple(getattr(message, "approval", ())),
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
