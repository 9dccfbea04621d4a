"""What the commands tell a person about ``--app`` and ``--agent`` (pure: no I/O, no imports of apps).

- :func:`file_path_mistake`: ``--app weather.py:app`` (a file name where a module name goes);
- :func:`apps_named`: the module's App objects, for ``--app weather:nope``;
- :func:`answering_agent`: the agent that answers when ``--agent`` is not given (an app with one
  agent needs none).
"""

from __future__ import annotations

from collections.abc import Sequence

from agentstream.errors import ConfigError

DEMO_APP = "agentstream.demo.app:app"
DEMO_AGENT = "demo"
"""The agent of the demo app that answers when ``--agent`` is not given (the demo app has several)."""


def file_path_mistake(app_path: str) -> str | None:
    """The one-line advice for an app path that names a file (``weather.py:app``,
    ``src/weather.py:app``) instead of a module, or None when it does not."""
    module, sep, attr = app_path.partition(":")
    if not module.endswith(".py") and "/" not in module and "\\" not in module:
        return None
    parts = [p for p in module.removesuffix(".py").replace("\\", "/").split("/") if p not in ("", ".")]
    name = ".".join(parts)
    return (
        f"the app path {app_path!r} names a file; give the module instead: --app {name}:{attr or 'app'} "
        "(drop the .py; the module is looked up from the current folder)"
    )


def apps_named(module_name: str, names: Sequence[str]) -> str:
    """What to say after "module X has no attribute Y": the module's App objects to choose from."""
    if not names:
        return f"module {module_name!r} has no App object at its top level"
    listed = ", ".join(f"{module_name}:{n}" for n in sorted(names))
    return f"its App object{'s' if len(names) > 1 else ''}: {listed}"


def answering_agent(app_path: str, agents: Sequence[str], given: str | None) -> str:
    """The agent a command asks: ``given`` when it is given, else the app's only agent (the demo
    app's ``demo`` agent for the demo app).

    Raises:
        ConfigError: ``given`` is not an agent of the app, or it is not given and the app has
            several agents (the message lists them).
    """
    listed = ", ".join(sorted(agents))
    if given is not None:
        if given not in agents:
            raise ConfigError(f"the app {app_path!r} has no agent {given!r} (its agents: {listed})")
        return given
    if len(agents) == 1:
        return agents[0]
    if app_path == DEMO_APP and DEMO_AGENT in agents:
        return DEMO_AGENT
    raise ConfigError(
        f"the app {app_path!r} has {len(agents)} agents ({listed}): name the one that answers with --agent"
    )
