"""Tools from MCP servers, run by the tool workers.

An app declares a Model Context Protocol server as a tool source of an agent::

    from agentstream import Agent, App, McpServer

    files = McpServer(name="files", command=["python", "-m", "my_files_server"], side_effects=["write"])
    search = McpServer(name="search", url="https://mcp.example.com/mcp",
                       headers_env={"Authorization": "SEARCH_MCP_TOKEN"}, tools=["web_search"])
    app = App(agents=[Agent(name="helper", system_prompt="...", tools=[files, search])])

How it runs (every piece uses the official ``mcp`` SDK; install ``agentstream[mcp]`` where
tool workers run):

- a tool worker serving a server's queue (``mcp-<name>`` by default) connects to it at startup
  (stdio: starts the command and keeps it; streamable HTTP: the URL with its headers), lists its
  tools, normalises their input schemas (:mod:`~agentstream.mcp_tools.schemas`: a schema the
  endpoints would reject is fixed or the tool refused, named in the log) and publishes the
  server's catalog in Redis (:mod:`~agentstream.runtime.mcp_catalogs`); it lists them again on the
  server's list-changed notification;
- the agent loop offers the catalog's tools after the agent's own, recording what it offers in
  the trace when it changes (:mod:`~agentstream.steps.offers`), so ``trace verify`` still
  rebuilds every request;
- calls go through the tool queue like any tool call: once per call, with the server's timeouts,
  ``side_effects`` per tool, cancellation (the MCP request is cancelled); a result's text is the
  result text, images and embedded resources become elements, an MCP error result is an error
  result the model sees (:mod:`~agentstream.mcp_tools.results`); a server that dies is restarted
  with backoff and its calls in flight get an error result (:mod:`~agentstream.mcp_tools.host`).
"""

from agentstream.declarations.mcp_servers import McpServer, Transport
from agentstream.mcp_tools.schemas import SchemaRefused, normalise_input_schema

__all__ = ["McpServer", "SchemaRefused", "Transport", "normalise_input_schema"]
