"""The agent loop's part in MCP tools: record what each model call offers, route calls to queues.

Before a model call of an agent with MCP servers, the loop reads the servers' catalogs (one
MGET), works out the tools to offer (:func:`agentstream.steps.offers.desired_offer`) and,
when they differ from the last ones the trace recorded for the agent, appends a
:class:`~agentstream.wire.events.ToolsOffered` event first (fenced, once per turn, step and digest):
the context library then offers what the trace says. A catalog that no tool worker has
published yet makes the step wait (the hint is deferred) up to ``wait_s`` from the turn's start;
after that the turn fails with code ``tools_unavailable`` and a reason naming the queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from agentstream.declarations.agents import Agent
from agentstream.errors import Deferred
from agentstream.runtime.mcp_catalogs import read_catalogs
from agentstream.runtime.store import TraceStore
from agentstream.steps.machine import KeepOffer, WaitForCatalogs, offer_before_call, turn_started_s
from agentstream.steps.offers import offered_tool
from agentstream.wire.events import Event, TurnFailed, TurnInput
from agentstream.wire.failures import FailureCode

log = logging.getLogger("agentstream.agent_loop")

TOOLS_UNAVAILABLE = FailureCode.TOOLS_UNAVAILABLE
"""TurnFailed code: an MCP server of the agent never published its tools."""


class McpOffers:
    """What the agent loop does about MCP tools.

    Args:
        store: the trace store (its Redis holds the catalogs).
        wait_s: how long a turn waits for a server's first catalog, in seconds.
    """

    def __init__(self, store: TraceStore, *, wait_s: float = 30.0):
        self.store = store
        self.wait_s = wait_s
        self._reported: set[str] = set()

    async def before_call(
        self,
        trace_id: str,
        token: int,
        turn: TurnInput,
        agent: Agent,
        step: int,
        entries: Sequence[tuple[str, Event]],
        events: Sequence[Event],
    ) -> bool | TurnFailed:
        """Make the trace record the MCP tools this call offers, if they changed.

        Returns:
            True when a ``tools_offered`` event was appended (take the step again), False when
            the trace already says what to offer, or the TurnFailed that ends the turn.

        Raises:
            Deferred: a server's catalog is missing and the turn has waited less than ``wait_s``.
        """
        catalogs = None
        if agent.mcp_servers:
            catalogs = await read_catalogs(self.store.redis, self.store.keys, [s.name for s in agent.mcp_servers])
        started_s = turn_started_s(entries, turn.turn_id)
        waited_s = time.time() - started_s if started_s is not None else 0.0
        decision, problems = offer_before_call(
            events, agent, turn, step, catalogs, waited_s=waited_s, wait_s=self.wait_s
        )
        for problem in problems:
            if problem not in self._reported:
                self._reported.add(problem)
                log.error("%s", problem)
        match decision:
            case KeepOffer():
                return False
            case WaitForCatalogs(delay_s=delay_s, reason=reason):
                raise Deferred(delay_s, reason)
            case TurnFailed():
                return decision
        appended = await self.store.append(trace_id, decision, fence=token)
        if appended.created:
            log.info(
                "trace %s: agent %s offers %d MCP tool(s) from turn %s step %d on",
                trace_id,
                agent.name,
                len(decision.tools),
                turn.turn_id,
                step,
            )
        return appended.created

    @staticmethod
    def queue_of(agent: Agent, events: Sequence[Event], name: str) -> str | None:
        """The tool queue of a call of MCP tool ``name`` as the agent's calls last offered it, or None."""
        tool = offered_tool(events, agent.name, name)
        if tool is None:
            return None
        server = next((s for s in agent.mcp_servers if s.name == tool.server), None)
        return server.queue if server is not None else f"mcp-{tool.server}"
