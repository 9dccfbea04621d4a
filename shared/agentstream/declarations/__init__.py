"""What an app declares: agents, tools, their inputs and prompts, MCP servers, the app itself.

Pure declarations (no asyncio, redis or httpx), so the context library and the step decision
import them: :mod:`~agentstream.declarations.agents` (:class:`Agent`, :class:`AgentSettings`),
:mod:`~agentstream.declarations.tools` (:func:`tool`, :class:`Tool`, :class:`ToolResult`),
:mod:`~agentstream.declarations.apps` (:class:`App`), :mod:`~agentstream.declarations.inputs`
(typed turn inputs, tool declarations), :mod:`~agentstream.declarations.prompts` (prompt files),
:mod:`~agentstream.declarations.tool_schemas`, :mod:`~agentstream.declarations.tool_context`
(what a running tool knows of its call) and :mod:`~agentstream.declarations.mcp_servers`.
Running them (tools in threads, loading an app) is :mod:`agentstream.app`.
"""
