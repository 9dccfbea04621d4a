"""Declaring an MCP server as a tool source of an app (pure: no SDK, no I/O at import).

An :class:`McpServer` names a Model Context Protocol server and how to reach it: a command that
the tool worker starts and keeps (stdio), or a URL (streamable HTTP) with headers whose values
come from the environment. Its tools go to one tool queue, so a pool of tool workers serves that
server and scales on its own.

The transport may also come from the environment of the tool worker, so one app image runs
against different servers (the Helm chart sets these for a pool):

- ``AGENTSTREAM_MCP_<NAME>_COMMAND``: the stdio command, as a JSON array or shell words;
- ``AGENTSTREAM_MCP_<NAME>_URL``: the streamable-HTTP URL;
- ``AGENTSTREAM_MCP_<NAME>_INHERIT_ENV``: comma-separated names of the worker's environment
  variables passed on to the stdio command (its secrets, for instance);
- ``AGENTSTREAM_MCP_<NAME>_HEADER_<HEADER>``: an HTTP header's value (``_HEADER_AUTHORIZATION``
  gives ``authorization``, ``_HEADER_X_API_KEY`` gives ``x-api-key``: header names are
  case-insensitive), beside those the declaration's ``headers_env`` names;

where ``<NAME>`` is the server's name upper-cased with every other character than a letter or a
digit made ``_``. A variable that is set wins over the declaration.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentstream.errors import ConfigError
from agentstream.wire.keys import check_queue_name

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def env_prefix(server_name: str) -> str:
    """``AGENTSTREAM_MCP_<NAME>_``: the prefix of the variables that configure a server's transport."""
    return "AGENTSTREAM_MCP_" + re.sub(r"[^A-Za-z0-9]", "_", server_name).upper() + "_"


@dataclass(frozen=True)
class Transport:
    """How a tool worker reaches the server, resolved from the declaration and the environment.

    Exactly one of ``command`` (stdio) and ``url`` (streamable HTTP) is set. ``env`` holds the
    values for the stdio command and ``headers`` the HTTP headers' values; both are read from the
    environment when the worker starts and live only in its memory (never in Redis, a trace or a
    log: their repr hides the values).
    """

    command: tuple[str, ...] = ()
    url: str = ""
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command else "http"

    def describe(self) -> str:
        """A line for logs: the command or the URL, never a header or environment value."""
        if self.command:
            return f"stdio command {shlex.join(self.command)!r}" + (f" (env: {sorted(self.env)})" if self.env else "")
        return f"streamable HTTP {self.url}" + (f" (headers: {sorted(self.headers)})" if self.headers else "")


def _names(value: bool | Collection[str]) -> bool | frozenset[str]:
    return value if isinstance(value, bool) else frozenset(value)


@dataclass(frozen=True, eq=False)
class McpServer:
    """An MCP server whose tools an agent offers; the tool workers of ``queue`` run them.

    Put it among an agent's tools (``Agent(tools=[my_tool, McpServer(...)])``) or in
    ``Agent(mcp_servers=[...])``. The tools are offered with the names, descriptions and input
    schemas the server lists (read by the tool workers at startup and again on the server's
    list-changed notification); each model call records the tools it was offered in the trace,
    so ``agentstream trace verify`` rebuilds the request byte for byte.

    Args:
        name: the server's name in this app (letters, digits, ``_ . -``; at most 64).
        command: stdio: the command and its arguments; the tool worker starts it and keeps it
            running, restarting it with backoff when it dies.
        env: stdio: variables set for the command, ``NAME -> value`` (plain configuration; put
            secrets in ``inherit_env``).
        inherit_env: stdio: names of the worker's environment variables passed on to the
            command (their values are read at startup, never stored).
        cwd: stdio: the command's working directory.
        url: streamable HTTP: the server's endpoint, e.g. ``https://mcp.example.com/mcp``.
        headers_env: streamable HTTP: ``header name -> environment variable name``; the header's
            value is that variable's, read by the tool worker at startup and never stored.
        queue: the tool queue of its calls (default ``mcp-<name>``).
        tools: an allow-list of tool names; None offers every tool the server lists.
        timeout_s: the longest one call may run, in seconds; then the MCP request is cancelled
            and the model gets a timeout error result.
        tool_timeouts_s: per-tool ``timeout_s`` overrides, by tool name.
        side_effects: which tools change the world: True for all, or a collection of names (see
            :class:`agentstream.Tool`: a ``tool_started`` event is recorded before each such
            call, and a call whose worker died mid-run is not run again).
        retry_safe: which tools are safe to run again after a crash (True, or names).
        needs_approval: which tools' calls wait for a person's approval before they run (True
            for all, or a collection of names); their arguments cannot be edited.
        prompts: a prompt file's texts for one model (``load_prompt_file(...).for_model(...)``):
            its ``tools`` entries replace the descriptions of the server's tools of those names
            (and of their arguments), as for any tool.
        connect_timeout_s: how long a worker waits for the server to start and answer its first
            listing, in seconds, before it retries with backoff.
        probe_interval_s: how often a worker lists a live session's tools again, in seconds (a
            session that does not answer is taken as dead and started again); None: 5 s for stdio,
            30 s for streamable HTTP.

    Raises:
        ConfigError: a bad name, both or neither of ``command`` and ``url``, or a bad timeout.
    """

    name: str
    command: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: Sequence[str] = ()
    cwd: str | None = None
    url: str = ""
    headers_env: Mapping[str, str] = field(default_factory=dict)
    queue: str = ""
    tools: Sequence[str] | None = None
    timeout_s: float = 60.0
    tool_timeouts_s: Mapping[str, float] = field(default_factory=dict)
    side_effects: bool | Collection[str] = False
    retry_safe: bool | Collection[str] = False
    needs_approval: bool | Collection[str] = False
    prompts: Any = None
    connect_timeout_s: float = 20.0
    probe_interval_s: float | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name or ""):
            raise ConfigError(f"MCP server name {self.name!r}: use 1-64 letters, digits, '_', '.', '-'")
        if isinstance(self.command, str):
            object.__setattr__(self, "command", tuple(shlex.split(self.command)))
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "inherit_env", tuple(self.inherit_env))
        if self.command and self.url:
            raise ConfigError(
                f"MCP server {self.name!r}: give either command (stdio) or url (streamable HTTP), not both"
            )
        if not self.queue:
            object.__setattr__(self, "queue", f"mcp-{self.name}")
        try:
            check_queue_name(self.queue)  # no name may stand for another queue's partition
        except ConfigError as exc:
            raise ConfigError(f"MCP server {self.name!r}: {exc}") from None
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "side_effects", _names(self.side_effects))
        object.__setattr__(self, "retry_safe", _names(self.retry_safe))
        object.__setattr__(self, "needs_approval", _names(self.needs_approval))
        checked = [
            ("timeout_s", self.timeout_s),
            ("connect_timeout_s", self.connect_timeout_s),
            *((f"tool_timeouts_s[{k!r}]", v) for k, v in self.tool_timeouts_s.items()),
        ]
        if self.probe_interval_s is not None:
            checked.append(("probe_interval_s", self.probe_interval_s))
        for what, value in checked:
            if not value > 0:
                raise ConfigError(f"MCP server {self.name!r}: {what} must be positive, got {value!r}")

    def __repr__(self) -> str:
        where = f"command={list(self.command)!r}" if self.command else f"url={self.url!r}"
        return f"McpServer({self.name!r}, {where}, queue={self.queue!r})"

    # --- per-tool settings -------------------------------------------------------------------

    def allows(self, tool_name: str) -> bool:
        """Whether the allow-list (if any) lets the tool be offered."""
        return self.tools is None or tool_name in self.tools

    def timeout_for(self, tool_name: str) -> float:
        """The call timeout of one tool, in seconds."""
        return float(self.tool_timeouts_s.get(tool_name, self.timeout_s))

    def has_side_effects(self, tool_name: str) -> bool:
        return self.side_effects if isinstance(self.side_effects, bool) else tool_name in self.side_effects

    def approves(self, tool_name: str) -> bool:
        """Whether calls of the tool wait for a person's approval."""
        return self.needs_approval if isinstance(self.needs_approval, bool) else tool_name in self.needs_approval

    def is_retry_safe(self, tool_name: str) -> bool:
        return self.retry_safe if isinstance(self.retry_safe, bool) else tool_name in self.retry_safe

    # --- transport ---------------------------------------------------------------------------

    def transport(self, environ: Mapping[str, str] | None = None) -> Transport:
        """The transport from the declaration and the environment (see the module docstring).

        Raises:
            ConfigError: no command and no URL, a malformed command variable, or a variable
                named by ``inherit_env`` or ``headers_env`` that is not set (named, never its value).
        """
        environ = os.environ if environ is None else environ
        prefix = env_prefix(self.name)
        command = self.command
        url = self.url
        raw_command = environ.get(prefix + "COMMAND", "").strip()
        if raw_command:
            command = _parse_command(raw_command, prefix + "COMMAND")
            url = ""
        raw_url = environ.get(prefix + "URL", "").strip()
        if raw_url:
            url, command = raw_url, ()
        if not command and not url:
            raise ConfigError(
                f"MCP server {self.name!r} has neither a command nor a URL: declare one in the app, "
                f"or set {prefix}COMMAND or {prefix}URL for the tool worker"
            )
        inherit = list(self.inherit_env)
        inherit += [n.strip() for n in environ.get(prefix + "INHERIT_ENV", "").split(",") if n.strip()]
        if command:
            env = dict(self.env)
            for var in inherit:
                if var not in environ:
                    raise ConfigError(
                        f"MCP server {self.name!r}: inherit_env names {var!r}, which is not set in the tool worker's environment"
                    )
                env[var] = environ[var]
            return Transport(command=tuple(command), cwd=self.cwd, env=env)
        headers = {
            name[len(prefix + "HEADER_") :].lower().replace("_", "-"): value
            for name, value in environ.items()
            if name.startswith(prefix + "HEADER_") and len(name) > len(prefix + "HEADER_")
        }
        for header, var in self.headers_env.items():
            if var not in environ:
                raise ConfigError(
                    f"MCP server {self.name!r}: header {header!r} takes its value from {var!r}, which is not set "
                    "in the tool worker's environment"
                )
            headers[header] = environ[var]
        return Transport(url=url, headers=headers)


def _parse_command(raw: str, variable: str) -> tuple[str, ...]:
    if raw.startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{variable} is not a valid JSON array ({exc.msg}); give a JSON array of strings or shell words"
            ) from None
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{variable} must be a non-empty JSON array of strings")
        return tuple(value)
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise ConfigError(f"{variable} is not valid shell words: {exc}") from None
