"""The agent loop: turns in, the next step of a trace out (see :mod:`agentstream.agent_loop.loop`)."""

from agentstream.agent_loop.loop import AgentLoop

__all__ = ["AgentLoop"]
