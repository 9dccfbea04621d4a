"""The ``agentstream`` command (typer).

Commands:

- ``run "question"``: the main job on a laptop: Redis (REDIS_URL or embedded), a model
  (OPENAI_* or the local SmolLM2), and every service (agent loop, tool worker, delegation,
  compaction) as separate processes; asks, prints each step as it happens, verifies the trace's
  fingerprints, and stops everything.
- ``serve <service> --app mod:app``: one service (``agent-loop``, ``tool-worker``,
  ``delegation``, ``compaction`` or ``gateway``, the HTTP gateway and web console); scale a
  service by running more of them.
- ``gateway-key --name N --agent A [--backend B]``: a new API key for the gateway, and its
  keys-file entry.
- ``dev --app mod:app``: every service in one process.
- ``ask "question"``: publish a turn to running services and follow it.
- ``approve|deny <trace id> <call id>``: decide a tool call that awaits a person's approval.
- ``cancel <trace id>``: stop the running turn of a conversation (or ``--turn-id``) and wait
  until it has ended.
- ``trace show <id>`` / ``trace verify <id>``: print a stored trace / rebuild its requests (with
  the app and model settings given, else those the agent loops recorded when they started);
  without REDIS_URL they read the embedded Redis's data that ``run`` kept (``--data-dir``).
- ``trace explain <id> --step N [--turn-id ID]``: one model call's exact request, and why each
  old result in it was shortened (which shrink, at which call).
- ``partition <trace id>``: the partition a trace's work goes to (``AGENTSTREAM_PARTITIONS``)
  and the turns stream a backend publishes its turns to.
- ``schema turn [--app]`` / ``schema reply``: the JSON schemas of the turn message other backends
  publish (with ``--app``, one per agent, with its typed input) and of the reply they read;
  ``schema events [--app]``: of every stored trace event and element (built-in and the app's),
  for backends that follow a trace with XREAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import msgspec
import typer

from agentstream.app.base import App, load_app
from agentstream.cli.apppath import answering_agent, apps_named, file_path_mistake
from agentstream.cli.helptext import plain_help
from agentstream.cli.interrupts import Interrupts, die_with_parent
from agentstream.cli.watch import terminal_safe, watch_turn
from agentstream.errors import AgentStreamError, ConfigError
from agentstream.ops.redact import redact_url
from agentstream.ops.settings import Settings
from agentstream.runtime import conversations, operations
from agentstream.runtime.connection import DATA_DIR_ENV, REDIS_ERROR, EmbeddedRedis, connect, default_data_dir
from agentstream.runtime.deltas import last_entry_id
from agentstream.runtime.store import TraceStore
from agentstream.steps.forking import fork_line
from agentstream.wire import codec
from agentstream.wire.checks import WireLimits, id_refusal, quoted
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    CancelMessage,
    CancelRequested,
    Compaction,
    CompactionFailed,
    Event,
    ForkedFrom,
    ModelOutput,
    TaskInput,
    ToolOutput,
    ToolsOffered,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
    UnknownEvent,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.jsontext import control_character

DEFAULT_APP = "agentstream.demo.app:app"

EXIT_CODES = """Exit codes: 0 done (the turn ended with an answer, the fingerprints match, the cancel
took effect); 1 the work did not succeed (the turn failed or got no answer in time, a fingerprint
mismatch, nothing to cancel) or an unexpected error (one line; AGENTSTREAM_LOG_LEVEL=debug adds
its traceback); 2 a usage or configuration error (a bad option, REDIS_URL, app path
or setting such as AGENTSTREAM_CONCURRENCY), printed as one line; 130 interrupted (Ctrl-C); 143
stopped by SIGTERM, 129 by SIGHUP (`run`)."""

cli = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    no_args_is_help=True,
    help="Run LLM agents as services over Redis Streams.",
    epilog=EXIT_CODES,
)
trace_cli = typer.Typer(no_args_is_help=True, help="Read stored traces.")
schema_cli = typer.Typer(no_args_is_help=True, help="Print wire-format schemas.")
cli.add_typer(trace_cli, name="trace")
cli.add_typer(schema_cli, name="schema")


class Service(StrEnum):
    agent_loop = "agent-loop"
    tool_worker = "tool-worker"
    delegation = "delegation"
    compaction = "compaction"
    gateway = "gateway"


WORKER_SERVICES = [s for s in Service if s is not Service.gateway]
"""The services that consume work streams (what ``run`` and ``dev`` start; the gateway is HTTP)."""


def _filled(what: str, *, name: bool = False):
    """A typer callback that refuses an empty or blank value of ``what`` (each one, for a
    repeated option; None, an option not given, passes), and with ``name`` (an id that names
    Redis keys or a record: trace, turn, agent) one that holds a control or invisible character,
    as the wire refuses it (:func:`agentstream.wire.jsontext.control_character`). The parsing
    library reports it as a usage error: one line and exit code 2 (:func:`main`)."""

    def check(value):
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if one is None:
                continue
            if not one.strip():
                raise typer.BadParameter(f"{what} cannot be empty or only spaces (got {one!r})")
            control = control_character(one) if name else None
            if control is not None:
                raise typer.BadParameter(f"{what} may not hold {control} (got {one!r})")
        return value

    return check


def _wire_limits() -> WireLimits:
    """The wire's limits from the settings (the defaults when a setting is wrong: the command
    itself then reports that setting)."""
    try:
        return _settings().wire_limits
    except AgentStreamError:
        return WireLimits()


def _an_id(what: str, *, names_trace: bool = False):
    """A typer callback that refuses what the wire would refuse as an id (a trace, turn, fork
    or call id, an agent name): :func:`agentstream.wire.checks.id_refusal` under the configured
    ``AGENTSTREAM_MAX_ID_BYTES``, checked before anything is published or read, so a command
    fails at once (usage error, exit code 2, naming the argument or flag) where a turn would be
    refused behind it."""

    def check(value):
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if one is None:
                continue
            refusal = id_refusal(one, what, _wire_limits(), names_trace=names_trace)
            if refusal is not None:
                raise typer.BadParameter(f"{refusal} (got {quoted(one)})")
        return value

    return check


AppOption = Annotated[
    str,
    typer.Option(
        "--app",
        envvar="AGENTSTREAM_APP",
        callback=_filled("the app path"),
        help="The app, as module:attribute (the module is looked up from the current directory first).",
    ),
]
AgentOption = Annotated[str, typer.Option(callback=_an_id("an agent name"), help="The agent that answers.")]
RunAgentOption = Annotated[
    str | None,
    typer.Option(
        callback=_an_id("an agent name"),
        show_default=False,
        help="The agent that answers (default: the app's only agent; the demo app's is demo).",
    ),
]


class LogLevel(StrEnum):
    critical = "CRITICAL"
    error = "ERROR"
    warning = "WARNING"
    info = "INFO"
    debug = "DEBUG"


LogLevelOption = Annotated[
    LogLevel, typer.Option("--log-level", envvar="AGENTSTREAM_LOG_LEVEL", case_sensitive=False, help="Log level.")
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("agentstream")
        except PackageNotFoundError:
            ours = "unknown"
        typer.echo(f"agentstream {ours} (Python {sys.version.split()[0]})")
        raise typer.Exit(0)


@cli.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Run LLM agents as services over Redis Streams."""


def _settings() -> Settings:
    """The settings from the environment, or AgentStreamError naming the variable that is wrong."""
    import pydantic

    try:
        return Settings()
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors():
            if not error["loc"]:  # settings that contradict each other: the message names them
                problems.append(str(error["msg"]).removeprefix("Value error, "))
                continue
            name = str(error["loc"][0])
            variable = name if name.isupper() else f"AGENTSTREAM_{name.upper()}"
            problems.append(f"{variable}={os.environ.get(variable, '')!r}: {error['msg']}")
        raise AgentStreamError("bad setting: " + "; ".join(problems)) from None


def _setup_logging(level: LogLevel | str) -> None:
    from agentstream.ops import logs

    logs.setup(
        level.value if isinstance(level, LogLevel) else level, fmt=os.environ.get("AGENTSTREAM_LOG_FORMAT", "json")
    )


def _fail(exc: Exception) -> NoReturn:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _shown_url(url: str) -> str:
    """A Redis URL without its credentials, for messages (see :mod:`agentstream.ops.redact`)."""
    return redact_url(url)


def _connect(settings: Settings):
    """A client for REDIS_URL, or AgentStreamError with a one-line reason (unset, malformed)."""
    if not settings.redis_url:
        raise AgentStreamError(
            "REDIS_URL is not set; point it at the Redis of the services (`agentstream dev` prints it)"
        )
    try:
        return connect(settings.redis_url, block_ms=settings.block_ms)
    except ConfigError:
        raise  # a setting that does not go with the URL: its own message (ConfigError is a ValueError)
    except ValueError as exc:
        raise AgentStreamError(f"REDIS_URL {_shown_url(settings.redis_url)!r} is not a Redis URL: {exc}") from None


def _unreachable(settings: Settings, exc: Exception) -> AgentStreamError:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return AgentStreamError(f"cannot reach Redis at {_shown_url(settings.redis_url or '')} (REDIS_URL): {detail}")


REDIS_ERRORS = (REDIS_ERROR, OSError, ValueError)
"""What a command's Redis calls may raise for a bad URL or an unreachable server."""

REACH_TIMEOUT_S = 10.0
"""How long :func:`_check_redis` waits for Redis to answer a PING."""


def _check_redis(settings: Settings) -> None:
    """REDIS_URL is set, is a Redis URL and its server answers (with its password): else
    AgentStreamError with one line. Commands call it before they print or start anything."""

    async def ping() -> None:
        client = _connect(settings)
        try:
            await asyncio.wait_for(operations.ping(client), REACH_TIMEOUT_S)
        except TimeoutError:
            raise AgentStreamError(
                f"cannot reach Redis at {_shown_url(settings.redis_url or '')} (REDIS_URL): no answer within "
                f"{REACH_TIMEOUT_S:g} s"
            ) from None
        except REDIS_ERRORS as exc:
            raise _unreachable(settings, exc) from None
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await client.aclose()

    asyncio.run(ping())


def _data_dir_help(what: str) -> str:
    return (
        f"The embedded Redis's data folder (when REDIS_URL is unset): {what} "
        f"(default {_shown_path(default_data_dir())}, under XDG_CACHE_HOME)."
    )


def _shown_path(path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + os.sep) else text


DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar=DATA_DIR_ENV,
        file_okay=False,
        help=_data_dir_help(
            "where `run` and `dev` keep what they stored, so `agentstream trace ...` reads it afterwards"
        ),
    ),
]


# --- services --------------------------------------------------------------------------------


def _load_app(app_path: str):
    """The App at ``app_path`` (:func:`agentstream.app.base.load_app`), or ConfigError with what
    to do: a file name given for a module (``weather.py:app``) is named before anything imports,
    and a missing attribute lists the module's App objects."""
    mistake = file_path_mistake(app_path)
    if mistake is not None:
        raise ConfigError(mistake)
    try:
        return load_app(app_path)
    except ConfigError as exc:
        module_name, _, attr = app_path.partition(":")
        module = sys.modules.get(module_name)
        if module is None or not attr or hasattr(module, attr):
            raise
        names = [name for name, value in vars(module).items() if isinstance(value, App) and not name.startswith("_")]
        raise ConfigError(f"{exc}; {apps_named(module_name, names)}") from None


def _load_checked(app_path: str, agent: str | None = None):
    """The app (imported now, before anything starts) and the agent that answers
    (:func:`agentstream.cli.apppath.answering_agent`: ``agent``, else the app's only one), or ConfigError."""
    app = _load_app(app_path)
    return app, answering_agent(app_path, [a.name for a in app.agents], agent)


async def _when_groups_exist(redis, consumers, on_ready) -> None:
    """Call ``on_ready()`` once every consumer's group exists on its stream."""
    pending = [c for c in consumers if getattr(c, "group", None)]
    while pending:
        still = []
        for c in pending:
            try:
                names = await operations.group_names(redis, c.stream)
            except Exception:
                names = set()
            if c.group not in names:
                still.append(c)
        pending = still
        if pending:
            await asyncio.sleep(0.05)
    on_ready()


async def _serve(
    services: list[Service], app_path: str, queues: list[str] | None, settings: Settings, *, on_ready=None
) -> None:
    from agentstream.runtime.runner import Runner, run_consumers
    from agentstream_services.agent_loop.service import build as build_loop
    from agentstream_services.tool_worker.service import build as build_worker

    app = _load_app(app_path)
    if not settings.redis_url:
        raise AgentStreamError(
            "REDIS_URL is not set (use `agentstream dev` or `agentstream run` for an embedded Redis)"
        )
    try:
        redis = connect(settings.redis_url, block_ms=settings.block_ms)
    except ConfigError:
        raise  # a setting that does not go with the URL: its own message (ConfigError is a ValueError)
    except ValueError as exc:
        raise AgentStreamError(f"REDIS_URL {_shown_url(settings.redis_url)!r} is not a Redis URL: {exc}") from None
    store = TraceStore(redis, settings.keys, codec=app.codec)  # reads the app's own types
    consumers: list[Runner] = []
    from agentstream.models.client import model_client

    async with model_client(concurrency=settings.concurrency) as http:
        if Service.agent_loop in services:
            consumers += build_loop(app, settings, store, http)[1]
        if Service.tool_worker in services:
            consumers += build_worker(app, settings, store, queues)[1]
        if Service.delegation in services:
            from agentstream_services.delegation.service import build as build_delegation

            consumers += build_delegation(app, settings, store)[1]
        if Service.compaction in services:
            from agentstream_services.compaction.service import build as build_compaction

            consumers += build_compaction(app, settings, store, http)[1]
        if Service.gateway in services:
            from agentstream_services.gateway.service import build as build_gateway

            consumers += build_gateway(app, settings, store)[1]
        expected = {}
        if Service.agent_loop in services:  # the tool queues it publishes to, for the no-consumer alert
            from agentstream.wire.keys import TOOL_WORKER_GROUP

            expected = {
                s: TOOL_WORKER_GROUP
                for q in app.tool_queues
                for s in settings.keys.partitions_of(settings.keys.tools(q))
            }
        announce = asyncio.create_task(_when_groups_exist(redis, consumers, on_ready)) if on_ready else None
        recording = (
            asyncio.create_task(_record_settings(redis, settings, app_path)) if Service.agent_loop in services else None
        )
        from agentstream.ops.collector import tune_for_service

        tune_for_service()  # the app and the services are built: what a step allocates is what remains
        try:
            await run_consumers(
                consumers,
                grace_s=settings.shutdown_grace_s,
                metrics_port=settings.metrics_port,
                metrics_host=settings.metrics_host,
                metrics_interval_s=settings.metrics_interval_s,
                expected_streams=expected,
                service=",".join(s.value for s in services),
            )
        finally:
            for task in (announce, recording):
                if task is not None:
                    task.cancel()
            await redis.aclose()


async def _record_settings(redis, settings: Settings, app_path: str) -> None:
    """Record the app and the model endpoints this agent loop serves (for ``trace verify``,
    see :mod:`agentstream.runtime.service_settings`); retried until Redis answers."""
    import logging

    from agentstream.models.endpoints import load_endpoints
    from agentstream.runtime import service_settings

    # the models file is read in a thread: this runs beside the service's consumers
    endpoints = await asyncio.to_thread(load_endpoints, settings, require_keys=False)
    while True:
        try:
            await service_settings.record(redis, settings.keys, app_path, endpoints)
            return
        except REDIS_ERRORS as exc:
            logging.getLogger("agentstream.cli.commands").warning("cannot record the service settings yet: %s", exc)
            await asyncio.sleep(1.0)


def _queue_names(value):
    """A tool queue name, filled and usable in stream keys (:func:`agentstream.wire.keys.check_queue_name`:
    no ``{``/``}``, no partition suffix ``:p<k>`` at its end), or a usage error naming it and why."""
    from agentstream.wire.keys import check_queue_name

    value = _filled("a tool queue name", name=True)(value)
    for one in value or []:
        try:
            check_queue_name(one)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


@cli.command()
def serve(
    service: Annotated[Service, typer.Argument(help="Which service to run.")],
    app: AppOption = DEFAULT_APP,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            envvar="AGENTSTREAM_QUEUES",
            callback=_queue_names,
            help="Tool queue(s) to consume (tool-worker); AGENTSTREAM_QUEUES takes several, separated by spaces.",
        ),
    ] = None,
    log_level: LogLevelOption = LogLevel.warning,
) -> None:
    """Run one service until SIGTERM (then drain within AGENTSTREAM_SHUTDOWN_GRACE_S).

    Every option has an environment variable (AGENTSTREAM_APP, AGENTSTREAM_QUEUES,
    AGENTSTREAM_LOG_LEVEL); every setting is an AGENTSTREAM_* variable (see docs/reference/settings.md).
    """
    _setup_logging(log_level)
    try:
        asyncio.run(_serve([service], app, queue, _settings()))
    except AgentStreamError as exc:
        _fail(exc)


@contextlib.contextmanager
def _environment(
    settings: Settings,
    data_dir: Path | None = None,
    interrupts: Interrupts | None = None,
    *,
    app_path: str = DEFAULT_APP,
    command: str = "run",
):
    """Redis and a model: the configured ones, or an embedded Redis (its data kept in
    ``data_dir``, default :func:`~agentstream.runtime.connection.default_data_dir`) and the local model.

    A configured REDIS_URL is checked first (one line and exit 2 when it is wrong or its server
    does not answer), before the local model starts or anything is printed. Whatever has started
    is stopped on the way out, however the block ends (the model first, then Redis); with
    ``interrupts``, a hurried stop SIGKILLs the local model instead of waiting for it.

    The embedded Redis's folder is claimed for ``app_path`` (served by ``command``) first: a
    folder that a command of another app uses is refused with one line
    (:mod:`agentstream.cli.claims`), so two apps never take each other's turns."""
    if settings.redis_url:
        _check_redis(settings)
    endpoints = _check_models(settings)
    claim = None if settings.redis_url else _claim_folder(data_dir or default_data_dir(), app_path, command)
    try:
        embedded = (
            None
            if settings.redis_url
            else EmbeddedRedis(data_dir=data_dir or default_data_dir(), services_grace_s=settings.shutdown_grace_s)
        )
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    local = None
    try:
        url = settings.redis_url
        if embedded is not None:
            url = embedded.start()
            os.environ.setdefault("AGENTSTREAM_EMBEDDED_REDIS", "1")
            typer.secho(
                f"embedded Redis (pid {embedded.pid}), its data kept in {_shown_path(embedded.data_dir)} (--data-dir)",
                fg=typer.colors.BRIGHT_BLACK,
                err=True,
            )
        base_url, model = settings.openai_base_url, settings.openai_model
        if base_url and "default" in endpoints:
            model = endpoints["default"].model  # what will be called (OPENAI_MODEL, else the default's)
        if not base_url:
            from agentstream.cli.localmodel import LocalModelServer

            if settings.openai_api_key is not None:
                typer.secho(
                    "note: OPENAI_API_KEY is set but OPENAI_BASE_URL is not, so the local model answers "
                    "(OPENAI_BASE_URL=https://api.openai.com/v1 calls OpenAI)",
                    fg=typer.colors.YELLOW,
                    err=True,
                )

            typer.secho("starting the local model (SmolLM2-135M on llama.cpp)…", fg=typer.colors.BRIGHT_BLACK, err=True)
            local = LocalModelServer()
            if interrupts is not None:
                interrupts.on_hurry(local.kill)
            local.start()
            typer.secho(
                f"local model pid {local.pid}, ready in {local.ready_s or 0:.1f} s",
                fg=typer.colors.BRIGHT_BLACK,
                err=True,
            )
            base_url, model = local.base_url, local.model
            if not settings.default_model_options:  # the local server's quirks (see localmodel.py)
                os.environ["AGENTSTREAM_DEFAULT_MODEL_OPTIONS"] = json.dumps(local.endpoint_options())
        assert url  # the configured REDIS_URL (embedded is None only with one), or the embedded Redis's
        env = {"REDIS_URL": url, "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": model or ""}
        os.environ.update(env)
        yield _settings()
    finally:
        if interrupts is not None:
            interrupts.begin_stopping()  # a Ctrl-C now hurries the stop, never cuts it short
        try:
            if local is not None:
                if interrupts is not None and interrupts.hurried:
                    local.stop_grace_s = 0.0
                local.stop()
        finally:
            try:
                if embedded is not None:
                    embedded.stop()
            finally:
                if claim is not None:
                    claim.release()


def _claim_folder(folder: Path, app_path: str, command: str):
    """This command's claim on the embedded Redis's data folder for its app (taken), or
    AgentStreamError naming the app that holds it (:mod:`agentstream.cli.claims`)."""
    from agentstream.cli.claims import Claim, FolderClaim, app_identity

    module = sys.modules.get(app_path.partition(":")[0])
    identity = app_identity(app_path, getattr(module, "__file__", None))
    claim = Claim(app=app_path, app_id=identity, command=command, pid=os.getpid(), cwd=os.getcwd())
    return FolderClaim(folder, claim, shown=_shown_path(folder)).take()


def _check_models(settings: Settings) -> dict:
    """The configured model endpoints (OPENAI_BASE_URL, AGENTSTREAM_MODELS_FILE; {} when none is,
    and the local model will answer), each checked before anything starts: its key is there
    and it answers (:mod:`agentstream.cli.preflight`); else AgentStreamError, one line."""
    from agentstream.cli.preflight import check_endpoints
    from agentstream.models.endpoints import load_endpoints

    if not (settings.openai_base_url or settings.models_file):
        return {}
    endpoints = load_endpoints(settings, require_keys=True)
    check_endpoints(endpoints.values())
    return endpoints


SHARED_VARIABLES = (
    "REDIS_URL",
    "AGENTSTREAM_REDIS_CLUSTER",
    "AGENTSTREAM_NAMESPACE",
    "AGENTSTREAM_PARTITIONS",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "AGENTSTREAM_DEFAULT_MODEL_OPTIONS",
)
"""What another shell needs to reach the same services (and publish to the same partitions) and
rebuild their requests exactly."""


def environment_lines(environ) -> list[str]:
    """``export NAME=value`` lines (shell-quoted) of :data:`SHARED_VARIABLES` that are set.

    ``AGENTSTREAM_DEFAULT_MODEL_OPTIONS`` carries the model server's quirks: without it,
    ``trace verify`` rebuilds other bodies than were sent, and services started elsewhere send
    requests the server refuses.
    """
    return [f"export {name}={shlex.quote(environ[name])}" for name in SHARED_VARIABLES if environ.get(name)]


def _gateway_if_keys() -> list[Service]:
    """The gateway, when its API keys are configured (``agentstream dev`` runs it then)."""
    from agentstream_services.gateway.settings import GatewaySettings

    gateway = GatewaySettings()
    if not (gateway.keys or gateway.keys_file):
        return []
    typer.secho(f"# the gateway and console: http://127.0.0.1:{gateway.port}/", err=True)
    return [Service.gateway]


@cli.command()
def dev(
    app: AppOption = DEFAULT_APP, log_level: LogLevelOption = LogLevel.info, data_dir: DataDirOption = None
) -> None:
    """Every service in one process, on REDIS_URL / OPENAI_* or the embedded defaults (and the
    HTTP gateway when AGENTSTREAM_GATEWAY_KEYS_FILE or AGENTSTREAM_GATEWAY_KEYS is set).

    On stdout: the ``export`` lines another shell needs, then one line ``# ready: ...`` once
    every consumer group exists (so ``agentstream dev > env.sh`` gives a file to source)."""
    _setup_logging(log_level)
    try:
        _load_app(app)  # a bad app path fails before the embedded Redis or the local model starts
        with _environment(_settings(), data_dir, app_path=app, command="dev") as settings:
            typer.echo("# for `agentstream ask` and `agentstream trace ...` in another shell:")
            for line in environment_lines(os.environ):
                typer.echo(line)
            services = WORKER_SERVICES + _gateway_if_keys()

            def ready() -> None:
                typer.echo(f"# ready: {', '.join(s.value for s in services)} (pid {os.getpid()})")
                sys.stdout.flush()

            asyncio.run(_serve(services, app, None, settings, on_ready=ready))
    except AgentStreamError as exc:
        _fail(exc)


# --- asking ----------------------------------------------------------------------------------


def describe(event: Event) -> str:
    """One line per event, for people following a trace: the line of the nearest class of the
    event in :data:`DESCRIPTIONS` (a task input's, not a turn input's), else its ``repr``."""
    for cls in type(event).__mro__:
        line = DESCRIPTIONS.get(cls)
        if line is not None:
            return line(event)
    return repr(event)


def _shown(text: str) -> str:
    return text if len(text) <= 300 else text[:300] + "…"


def _task_line(event: TaskInput) -> str:
    return (
        f"» task for {event.agent} (depth {event.depth}, for call {event.call_id} of trace "
        f"{event.parent_trace_id}): {event.text}"
    )


def _turn_line(event: TurnInput) -> str:
    rolled = f" (rolls back turn {event.rolls_back}: left out of later contexts)" if event.rolls_back else ""
    return f"» turn for {event.agent}{rolled}: {event.text}"


def _model_output_lines(event: ModelOutput) -> str:
    lines = [f"· model call {event.step} ({event.latency_ms / 1000:.1f} s, {event.stop_reason})"]
    for call in event.tool_calls:
        lines.append(f"  → tool call {call.name}({call.arguments}) [{call.id}]")
    if event.content and event.tool_calls:
        lines.append(f"  text: {event.content}")
    return "\n".join(lines)


def _tool_output_lines(event: ToolOutput) -> str:
    line = f"  ← tool result {event.name} [{event.call_id}]{' (error)' if event.error else ''}: {_shown(event.text)}"
    elements = event.elements
    if elements:
        kinds = ", ".join(f"{getattr(type(e).__struct_config__, 'tag', '?')} {e.id}" for e in elements[:8])
        more = f", … {len(elements) - 8} more" if len(elements) > 8 else ""
        line += f"\n    elements: {kinds}{more}"
    return line


def _answer_lines(event: TurnEnded) -> str:
    lines = [f"✓ answer: {event.answer}"]
    for cited in event.citations:
        where = " — ".join(p for p in (cited.title, cited.url or cited.id) if p)
        lines.append(f"  [{cited.number}] {where}")
    return "\n".join(lines)


def _unknown_line(event: UnknownEvent) -> str:
    return (
        f"? {event.stored_type} (a type this app does not register; as stored): "
        f"{json.dumps(event.raw, ensure_ascii=False)}"
    )


def _approval_line(event: ApprovalAwaited | ApprovalDecided) -> str:
    from agentstream.steps.approvals import describe_approval

    return describe_approval(event)


DESCRIPTIONS: dict[type, Callable[[Any], str]] = {
    TaskInput: _task_line,
    TurnInput: _turn_line,
    ModelOutput: _model_output_lines,
    ToolOutput: _tool_output_lines,
    TurnEnded: _answer_lines,
    UnknownEvent: _unknown_line,
    TurnFailed: lambda e: f"✗ turn failed ({e.code}): {e.reason}",
    ToolStarted: lambda e: f"  ▸ tool started {e.name} [{e.call_id}] on {e.worker or '?'}",
    CancelRequested: lambda e: f"■ cancel of turn {e.turn_id} requested by {e.by}{': ' + e.reason if e.reason else ''}",
    Compaction: lambda e: (
        f"⋯ a summary now replaces {e.replaced_turns} earlier turn(s) (kept from turn {e.kept_from_turn}): "
        f"{_shown(e.summary)}"
    ),
    CompactionFailed: lambda e: f"⚠ compaction failed ({e.code}): {e.reason}",
    ToolsOffered: lambda e: (
        f"  ⚙ MCP tools offered to {e.agent} from here on: {', '.join(f'{t.server}/{t.name}' for t in e.tools) or 'none'}"
    ),
    ForkedFrom: lambda e: f"⑂ {fork_line(e)}",
    ApprovalAwaited: _approval_line,
    ApprovalDecided: _approval_line,
}
"""The line of each event type :func:`describe` knows (by class; a subclass takes its nearest base's)."""


CUT_OFF = "cut off by the output limit"


class Describer:
    """:func:`describe` with what earlier events of the trace say: an answer whose last model
    output hit the output token limit, and a tool result that arrived after its turn ended
    (the model never saw it)."""

    def __init__(self) -> None:
        self.cut_off: set[str] = set()  # turns whose last model output stopped on ``length``
        self.ended: set[str] = set()

    def __call__(self, event: Event) -> str:
        line = describe(event)
        match event:
            case ModelOutput(turn_id=turn_id, stop_reason=stop):
                if stop == "length":
                    self.cut_off.add(turn_id)
                    line = line.replace(f", {stop})", f", {stop}: {CUT_OFF})", 1)
                else:
                    self.cut_off.discard(turn_id)
            case TurnEnded(turn_id=turn_id) | TurnFailed(turn_id=turn_id):
                if turn_id in self.cut_off and isinstance(event, TurnEnded):
                    line = line.replace("✓ answer:", f"✓ answer ({CUT_OFF}):", 1)
                self.ended.add(turn_id)
            case ToolOutput(turn_id=turn_id) if turn_id in self.ended:
                line = f"{line}\n    (late: it arrived after its turn had ended; no model call saw it)"
        return line


ASK_HINT = (
    "is the agent loop running (`agentstream serve agent-loop`, or `agentstream dev`) on this REDIS_URL and namespace?"
)


async def _ask(
    settings: Settings,
    agent: str,
    text: str,
    trace_id: str,
    timeout_s: float,
    echo=typer.echo,
    *,
    hint: str = ASK_HINT,
    on_published=None,
) -> TurnEnded | TurnFailed | None:
    """Publish a turn and print its steps until it ends → its ending, or None after ``timeout_s``
    (then one line saying so, with ``hint``: what to check). ``on_published(turn_id)`` is
    called once the turn is on the turns stream."""
    redis = _connect(settings)
    try:
        turn_id = uuid.uuid4().hex
        start = await last_entry_id(redis, settings.keys.trace(trace_id))  # "0-0": a new conversation
        deltas_start = await last_entry_id(redis, settings.keys.deltas(trace_id))
        message = TurnMessage(trace_id=trace_id, turn_id=turn_id, agent=agent, text=text)
        errors_after = await last_entry_id(redis, settings.keys.errors)
        entry = await conversations.publish_turn(TraceStore(redis, settings.keys), message)
        if on_published is not None:
            on_published(turn_id)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(timeout_s, stop.set)
        # the steps from the trace, and the reply's tokens as they arrive (agentstream.cli.watch);
        # a turn refused before it had a trace (reported on the errors stream) ends the wait
        ending, refusal = await _unless_refused(
            redis,
            settings,
            watch_turn(
                redis,
                settings.keys,
                trace_id,
                turn_id,
                after=start,
                deltas_after=deltas_start,
                stop=stop,
                echo=echo,
                describe=Describer(),
                outage_s=timeout_s,  # a Redis restart is ridden out
            ),
            source=settings.keys.turns_for(trace_id),
            entry=entry,
            after=errors_after,
            stop=stop,
        )
        if ending is not None:
            return ending
        if refusal is not None:
            echo(f"the agent loop refused the turn: {refusal}")
            return None
        echo(f"no answer within {timeout_s:.0f} s (trace {trace_id}); {hint}")
        return None
    finally:
        await redis.aclose()


async def _served_agent(settings: Settings) -> str:
    """The agent ``ask`` asks when none is named: the only agent of the app the running agent
    loops recorded when they started (the demo's ``demo`` when none did), or AgentStreamError
    saying to name one."""
    records = await _recorded(settings)
    app_path = records[0].app if records else DEFAULT_APP
    try:
        return _load_checked(app_path)[1]
    except ConfigError as exc:
        raise AgentStreamError(
            f"name the agent with --agent: the agent loops serve the app {app_path!r} ({exc}; an app path is "
            "relative to the folder the services run in)"
        ) from None


TimeoutOption = typer.Option("--timeout-s", min=0.1, help="Give up waiting for the answer after this many seconds.")


@cli.command()
def ask(
    text: Annotated[str, typer.Argument(callback=_filled("the message"), help="The user's message.")],
    agent: Annotated[
        str | None,
        typer.Option(
            callback=_an_id("an agent name"),
            show_default=False,
            help="The agent that answers (default: the only agent of the app the running agent loops serve).",
        ),
    ] = None,
    trace_id: Annotated[
        str | None, typer.Option(callback=_an_id("a trace id", names_trace=True), help="Continue this conversation.")
    ] = None,
    timeout_s: Annotated[float, TimeoutOption] = 300.0,
) -> None:
    """Publish a turn to running services (REDIS_URL) and print each step until the answer."""
    settings = _settings()
    if not settings.redis_url:
        _fail(AgentStreamError("REDIS_URL is not set; `agentstream run` runs everything on a laptop"))
    try:
        _check_redis(settings)  # before anything is printed
    except AgentStreamError as exc:
        _fail(exc)
    trace_id = trace_id or uuid.uuid4().hex
    try:
        agent = agent or asyncio.run(_served_agent(settings))
    except AgentStreamError as exc:
        _fail(exc)
    typer.secho(f"trace {trace_id}", fg=typer.colors.BRIGHT_BLACK, err=True)
    try:
        ending = asyncio.run(_ask(settings, agent, text, trace_id, timeout_s))
    except AgentStreamError as exc:
        _fail(exc)
    except REDIS_ERRORS as exc:
        _fail(_unreachable(settings, exc))
    raise typer.Exit(0 if isinstance(ending, TurnEnded) else 1)


async def _cancel(
    settings: Settings, message: CancelMessage, wait_s: float, echo=typer.echo
) -> TurnFailed | TurnEnded | None:
    from agentstream.runtime.cancel import cancel_target, publish_cancel

    redis = _connect(settings)
    store = TraceStore(redis, settings.keys)
    try:
        entries = await store.read(message.trace_id)
        if not entries:
            echo(
                f"trace {message.trace_id!r} is unknown: it has no events in namespace "
                f"{settings.keys.namespace!r}; nothing to cancel"
            )
            return None
        start = entries[-1][0]
        # the turn running now when none is named, so the wait below follows that one; a turn id
        # the trace does not hold (or that ended) is not published: it would cancel a later turn
        target = cancel_target([e for _, e in entries], message.turn_id)
        if target.turn_id is None:
            if not message.turn_id:  # an idle conversation: say how its last turn ended
                ended = [e for _, e in entries if isinstance(e, (TurnEnded, TurnFailed))]
                last = (
                    f" (its last turn {ended[-1].turn_id} {'ended' if isinstance(ended[-1], TurnEnded) else 'failed'})"
                    if ended
                    else ""
                )
                echo(f"trace {message.trace_id!r} is idle: no turn is running{last}; nothing to cancel")
                return None
            echo(f"trace {message.trace_id!r}: {target.reason}; nothing to cancel")
            return target.ending
        message.turn_id = target.turn_id
        errors_after = await last_entry_id(redis, settings.keys.errors)
        entry = await publish_cancel(redis, settings.keys, message)
        echo(f"cancel of turn {message.turn_id} published ({settings.keys.cancel} {entry})")
        if wait_s <= 0:
            return None
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(wait_s, stop.set)

        turn_end = _first_event(
            store,
            message.trace_id,
            start,
            stop,
            lambda e: isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == message.turn_id,
        )
        ending, refusal = await _unless_refused(
            redis, settings, turn_end, source=settings.keys.cancel, entry=entry, after=errors_after, stop=stop
        )
        if ending is not None:
            return ending
        if refusal is not None:
            raise AgentStreamError(f"the agent loop refused the cancel: {refusal}")
        echo(f"turn {message.turn_id} did not end within {wait_s:.0f} s; is the agent loop running?")
        return None
    finally:
        await redis.aclose()


@cli.command()
def cancel(
    trace_id: Annotated[
        str,
        typer.Argument(callback=_an_id("a trace id", names_trace=True), help="The conversation whose turn to stop."),
    ],
    turn_id: Annotated[
        str | None,
        typer.Option(
            callback=_an_id("a turn id"),
            show_default=False,
            help="The turn to stop (default: the one running now).",
        ),
    ] = None,
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    by: Annotated[str, typer.Option(callback=_filled("who asks (--by)"), help="Who asks.")] = "user",
    wait_s: Annotated[float, typer.Option(min=0, help="Wait this long for the turn to end (0: do not wait).")] = 60.0,
) -> None:
    """Cancel a turn (REDIS_URL): publish a cancel request and wait until the turn has ended.

    The in-flight model request is aborted, queued tool jobs are skipped, running tools are
    told, and every call without a result gets a cancelled result; the turn ends with
    ``turn_failed`` code ``cancelled``. Exit code 0 when the turn ended as cancelled.
    """
    settings = _settings()
    if not settings.redis_url:
        _fail(AgentStreamError("REDIS_URL is not set"))
    message = CancelMessage(trace_id=trace_id, turn_id=turn_id or "", by=by, reason=reason)
    try:
        _check_redis(settings)
        ending = asyncio.run(_cancel(settings, message, wait_s))
    except AgentStreamError as exc:
        _fail(exc)
    except REDIS_ERRORS as exc:
        _fail(_unreachable(settings, exc))
    if ending is not None:
        typer.echo(describe(ending))
    raise typer.Exit(0 if isinstance(ending, TurnFailed) and ending.code == FailureCode.CANCELLED else 1)


@cli.command("fork")
def fork(
    trace_id: Annotated[
        str, typer.Argument(callback=_an_id("a trace id", names_trace=True), help="The conversation to fork.")
    ],
    turn_id: Annotated[
        str,
        typer.Option("--turn", callback=_an_id("a turn id"), show_default=False, help="The turn to fork at."),
    ],
    step: Annotated[
        int | None,
        typer.Option(min=0, show_default=False, help="Fork before this model call of the turn (0-based)."),
    ] = None,
    text: Annotated[
        str | None,
        typer.Option(
            callback=_filled("the new input (--text)"),
            show_default=False,
            help="Replace the turn's input with this text (published to the fork).",
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            callback=_an_id("a fork id", names_trace=True),
            show_default=False,
            help="The fork's trace id, its idempotency key (default: <trace id>.fork-<random>).",
        ),
    ] = None,
    by: Annotated[str, typer.Option(callback=_filled("who forks (--by)"), help="Who forks, for the record.")] = "cli",
) -> None:
    """Fork a conversation (REDIS_URL): a new one whose history is this one's up to a turn.

    After the turn (it must have ended); before one of its model calls (--step: the fork's agent
    loop makes that call again); or before it, with its input replaced (--text: published to the
    fork as the same turn). The fork's first event names its source; its copied model calls
    rebuild byte for byte (`agentstream trace verify <fork>`). Asking again with the same --to is
    the same fork. Prints the fork's trace id.
    """
    from agentstream.runtime.forks import fork_conversation

    settings = _settings()

    async def run():
        redis = _connect(settings)
        try:
            return await fork_conversation(
                TraceStore(redis, settings.keys),
                trace_id,
                turn_id=turn_id,
                step=step,
                text=text,
                fork_id=to,
                by=by,
                limits=settings.wire_limits,
                expire_ms=int(settings.trace_retention_s * 1000) if settings.trace_retention_s else None,
            )
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await redis.aclose()

    try:
        _check_redis(settings)
        forked = asyncio.run(run())
    except AgentStreamError as exc:
        _fail(exc)
    except REDIS_ERRORS as exc:
        _fail(_unreachable(settings, exc))
    typer.echo(forked.trace_id)
    typer.echo(
        f"{fork_line(forked.forked_from)}{'' if forked.created else ' (made before; nothing written now)'}", err=True
    )


RUN_HINT = "the services' log lines above say what they did (`--log-level info` shows more)"


STOP_MARGIN_S = 5.0
"""How long past the services' shutdown grace ``run`` waits for them to exit before SIGKILL, in
seconds (a drained service still releases what it held, closes its connections and exits)."""


CANCEL_WAIT_S = 10.0
"""How long an interrupted ``run`` waits for the turn it published to end as cancelled, in seconds."""


def _cancel_on_stop(settings: Settings, trace_id: str, turn_id: str, interrupts: Interrupts) -> None:
    """Cancel the turn an interrupted ``run`` published and wait (up to :data:`CANCEL_WAIT_S`, or
    until a second signal) for it to end, so that no service carries it on later (the next
    ``run`` or ``dev`` on the same Redis did, minutes after). The cancel names the turn: one
    that no agent loop has taken yet is cancelled when it is taken."""
    typer.secho(
        f"\nstopping: cancelling turn {turn_id} (Ctrl-C again to stop at once)", fg=typer.colors.BRIGHT_BLACK, err=True
    )
    try:
        ending = asyncio.run(_cancel_published(settings, trace_id, turn_id, CANCEL_WAIT_S, lambda: interrupts.hurried))
    except REDIS_ERRORS as exc:  # Redis is gone: nothing of the turn can go on there either
        typer.secho(f"the cancel of turn {turn_id} was not published: {exc}", fg=typer.colors.YELLOW, err=True)
        return
    if ending is not None:
        typer.secho(describe(ending), fg=typer.colors.BRIGHT_BLACK, err=True)
    elif not interrupts.hurried:
        typer.secho(
            f"turn {turn_id} did not end within {CANCEL_WAIT_S:g} s; its cancel is recorded, so no service "
            "carries it on",
            fg=typer.colors.YELLOW,
            err=True,
        )


async def _cancel_published(
    settings: Settings, trace_id: str, turn_id: str, wait_s: float, hurried
) -> TurnEnded | TurnFailed | None:
    """Cancel ``turn_id`` and follow the trace until that turn ends → its ending; None after
    ``wait_s`` seconds or once ``hurried()`` is true.

    The cancel is written into the trace first (the truth: an agent loop that takes the turn
    later finds it and ends the turn at once, with no model call; the agent loop's own handler
    of the cancel stream records nothing for a turn it has not admitted yet), then published
    (every running agent loop aborts its model call of the turn)."""
    from agentstream.runtime.cancel import publish_cancel

    redis = _connect(settings)
    try:
        by, reason = "agentstream run", "run was interrupted"
        await TraceStore(redis, settings.keys).append(trace_id, CancelRequested(turn_id=turn_id, by=by, reason=reason))
        message = CancelMessage(trace_id=trace_id, turn_id=turn_id, by=by, reason=reason)
        await publish_cancel(redis, settings.keys, message)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(wait_s, stop.set)

        async def on_hurry() -> None:
            while not hurried():
                await asyncio.sleep(0.05)
            stop.set()

        watcher = asyncio.create_task(on_hurry())
        try:
            async for _, event in TraceStore(redis, settings.keys).follow(trace_id, block_ms=100, stop=stop):
                if isinstance(event, (TurnEnded, TurnFailed)) and event.turn_id == turn_id:
                    return event
        finally:
            watcher.cancel()
        return None
    finally:
        with contextlib.suppress(*REDIS_ERRORS):
            await redis.aclose()


def _stop_processes(
    procs: list[tuple[Service, subprocess.Popen]], grace_s: float = 15.0, interrupts: Interrupts | None = None
) -> None:
    """SIGTERM every service process, then wait for all of them: SIGKILL past ``grace_s``
    seconds, or at once when ``interrupts`` is hurried (a second Ctrl-C); every process is
    reaped before this returns."""
    for _, proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    while any(proc.poll() is None for _, proc in procs):
        if time.monotonic() >= deadline or (interrupts is not None and interrupts.hurried):
            break
        time.sleep(0.05)
    for _, proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _kill_processes(procs: list[tuple[Service, subprocess.Popen]]) -> None:
    """SIGKILL the service processes still running (from a signal handler: it does not wait)."""
    for _, proc in procs:
        if proc.returncode is None:  # not reaped: the pid is still this process's child
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


def _exited(procs: list[tuple[Service, subprocess.Popen]]) -> str:
    """``"; agent-loop (pid 12) exited with code 2"``: the service processes that stopped early."""
    gone = [
        f"{service.value} (pid {proc.pid}) exited with code {proc.returncode}"
        for service, proc in procs
        if proc.poll() is not None
    ]
    return f"; {', '.join(gone)}" if gone else ""


@cli.command()
def run(
    text: Annotated[
        str, typer.Argument(callback=_filled("the message"), help="The user's message.")
    ] = "What is 365 * 24?",
    app: AppOption = DEFAULT_APP,
    agent: RunAgentOption = None,
    turns: Annotated[
        int,
        typer.Option(
            min=1, help="Ask the message this many times in one conversation (a long conversation, to see compaction)."
        ),
    ] = 1,
    timeout_s: Annotated[float, TimeoutOption] = 300.0,
    log_level: LogLevelOption = LogLevel.warning,
    data_dir: DataDirOption = None,
) -> None:
    """The main job: start everything, answer one turn end to end, stop everything.

    It starts Redis (REDIS_URL, else an embedded one) and a model (OPENAI_*, else the local
    SmolLM2-135M on llama.cpp), then the agent loop, a tool worker, the delegation and the
    compaction service, each as a process of its own; it publishes the message as a turn, prints
    each step as it happens, checks that every model call's request rebuilt from the stored trace
    matches its recorded fingerprint, and stops what it started.

    Without REDIS_URL, the embedded Redis keeps its data in --data-dir, so ``agentstream trace
    show <id>`` (with the same --data-dir, or none for the default) reads the trace afterwards.
    The service processes stop before the local model and the embedded Redis do, so a turn in
    flight is not recorded as a model error.

    Ctrl-C, SIGTERM or SIGHUP stops the services (within AGENTSTREAM_SHUTDOWN_GRACE_S), then the
    local model and the embedded Redis, and exits with 130, 143 or 129; a second one SIGKILLs
    what still runs instead of waiting (see :mod:`agentstream.cli.interrupts`)."""
    _setup_logging(log_level)
    procs: list[tuple[Service, subprocess.Popen]] = []
    ending = None
    interrupts = Interrupts()
    try:
        with interrupts.handled():
            _, agent = _load_checked(app, agent)  # a bad app path or agent fails before anything starts
            with _environment(_settings(), data_dir, interrupts, app_path=app, command="run") as settings:
                interrupts.on_hurry(lambda: _kill_processes(procs))
                interrupted = False
                asking: list[str] = []  # the turn published and not ended yet (its id)
                trace_id = ""
                try:
                    for service in WORKER_SERVICES:
                        procs.append(
                            (
                                service,
                                subprocess.Popen(
                                    [
                                        sys.executable,
                                        "-P",
                                        "-m",
                                        "agentstream",
                                        "serve",
                                        service.value,
                                        "--app",
                                        app,
                                        "--log-level",
                                        log_level.value,
                                    ],
                                    # -P: the current directory is not put first on sys.path (a file there
                                    # must not shadow a dependency; load_app finds the --app module there)
                                    env={**os.environ, "AGENTSTREAM_CONSUMER": f"{service.value}-{os.getpid()}"},
                                    stdin=subprocess.DEVNULL,
                                    # a session of its own: a terminal's Ctrl-C reaches run alone, which
                                    # stops the services (SIGTERM) before the model and Redis they use;
                                    # should run be killed, the kernel sends them SIGTERM
                                    start_new_session=True,
                                    preexec_fn=die_with_parent,
                                ),
                            )
                        )
                    typer.secho(
                        f"{', '.join(f'{s.value} pid {p.pid}' for s, p in procs)}, model {settings.openai_model} "
                        f"at {redact_url(settings.openai_base_url or '')}",
                        fg=typer.colors.BRIGHT_BLACK,
                        err=True,
                    )
                    trace_id = uuid.uuid4().hex
                    # one event loop for every turn, made before the trace line: a Ctrl-C between
                    # two turns never lands in a loop half made (its __del__ then printed a traceback)
                    with asyncio.Runner() as runner:
                        runner.get_loop()
                        typer.secho(f"trace {trace_id}", fg=typer.colors.BRIGHT_BLACK, err=True)
                        for _ in range(turns):
                            try:
                                ending = runner.run(
                                    _ask(
                                        settings,
                                        agent,
                                        text,
                                        trace_id,
                                        timeout_s,
                                        hint=RUN_HINT + _exited(procs),
                                        on_published=asking.append,
                                    )
                                )
                            except REDIS_ERRORS as exc:
                                raise _unreachable(settings, exc) from None
                            asking.clear()  # it ended (or run gave up waiting: its services stop with it)
                            if not isinstance(ending, TurnEnded):
                                break
                        if ending is not None:
                            runner.run(_verify(settings, app, trace_id, quiet=True))
                except KeyboardInterrupt:
                    interrupted = True
                    raise
                finally:  # the services first: the model and Redis they use stop after them
                    interrupts.begin_stopping()  # from here a signal hurries the stop, never cuts it short
                    cancelled = interrupted and asking and any(p.poll() is None for _, p in procs)
                    if cancelled:
                        _cancel_on_stop(settings, trace_id, asking[-1], interrupts)
                    grace_s = settings.shutdown_grace_s + STOP_MARGIN_S
                    if interrupted and any(p.poll() is None for _, p in procs):
                        typer.secho(
                            f"{'' if cancelled else chr(10)}stopping: the services finish what they hold (up to {grace_s:g} s); "
                            "Ctrl-C again to stop at once",
                            fg=typer.colors.BRIGHT_BLACK,
                            err=True,
                        )
                    _stop_processes(procs, grace_s, interrupts)
    except AgentStreamError as exc:
        if interrupts.signum is None:
            _fail(exc)
    except KeyboardInterrupt:
        raise typer.Exit(interrupts.exit_code) from None
    if interrupts.signum is not None:  # a signal while stopping, or one that an error hid
        raise typer.Exit(interrupts.exit_code)
    raise typer.Exit(0 if isinstance(ending, TurnEnded) else 1)


# --- traces ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _stored(settings: Settings, data_dir: Path | None = None):
    """The settings to read stored traces with: as they are when REDIS_URL is set; else with
    REDIS_URL pointing at an embedded Redis opened on ``data_dir`` (default
    :func:`~agentstream.runtime.connection.default_data_dir`), where ``agentstream run`` kept its data.

    Raises:
        AgentStreamError: REDIS_URL is unset and the folder holds no embedded Redis data.
    """
    if settings.redis_url:
        yield settings
        return
    folder = data_dir or default_data_dir()
    if not EmbeddedRedis.has_data(folder):
        raise AgentStreamError(
            f"REDIS_URL is not set, and {_shown_path(folder)} holds no embedded Redis data (`agentstream run` keeps "
            "its data there; --data-dir or AGENTSTREAM_DATA_DIR names another folder)"
        )
    embedded = EmbeddedRedis(data_dir=folder)
    url = embedded.start()
    try:
        yield settings.model_copy(update={"redis_url": url})
    finally:
        embedded.stop()


async def _read(settings: Settings, trace_id: str, codec=None):
    """The stored trace's entries (read with an app's ``codec``, or for built-in types only);
    AgentStreamError when Redis is not reachable or the trace is empty."""
    redis = _connect(settings)
    try:
        entries = await TraceStore(redis, settings.keys, codec=codec).read(trace_id)
    except REDIS_ERRORS as exc:
        raise _unreachable(settings, exc) from None
    finally:
        with contextlib.suppress(*REDIS_ERRORS):
            await redis.aclose()
    if not entries:
        raise AgentStreamError(f"trace {trace_id!r} has no events (namespace {settings.keys.namespace!r})")
    return entries


TraceIdArgument = Annotated[
    str, typer.Argument(callback=_an_id("a trace id", names_trace=True), help="The trace (conversation) id.")
]
StoredDataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", envvar=DATA_DIR_ENV, file_okay=False, help=_data_dir_help("where `agentstream run` kept its data")
    ),
]


@trace_cli.command("show")
def trace_show(
    trace_id: TraceIdArgument,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON event per line.")] = False,
    data_dir: StoredDataDirOption = None,
) -> None:
    """Print a stored trace (REDIS_URL, or the embedded Redis's data that `agentstream run` kept)."""
    try:
        with _stored(_settings(), data_dir) as settings:
            entries = asyncio.run(_read(settings, trace_id))
    except AgentStreamError as exc:
        _fail(exc)
    describer = Describer()
    for entry_id, event in entries:
        if as_json:
            stored = event.raw if isinstance(event, UnknownEvent) else json.loads(codec.encode(event))
            typer.echo(json.dumps({"id": entry_id, **stored}))
        else:
            typer.echo(terminal_safe(f"{entry_id}  {describer(event)}"))


def _endpoints(settings: Settings):
    """The configured model endpoints (keys not required: nothing is sent), or none."""
    from agentstream.models.endpoints import load_endpoints

    try:
        return load_endpoints(settings, require_keys=False)
    except ConfigError:
        return {}  # rebuild each call for its recorded provider and model


MISMATCH_HINT = (
    "a rebuilt body differs from the one sent when the app or the endpoint settings differ from the services' "
    "(OPENAI_MODEL, AGENTSTREAM_DEFAULT_MODEL_OPTIONS, AGENTSTREAM_MODELS_FILE): the agent loops record theirs "
    "in Redis when they start, and they were tried too; else use the lines `agentstream dev` or "
    "`python -m agentstream.cli.localmodel` printed"
)


async def _recorded(settings: Settings):
    """The settings the agent loops recorded at start, newest first ([] when Redis has none or fails)."""
    from agentstream.runtime import service_settings

    client = _connect(settings)
    try:
        return await service_settings.recorded(client, settings.keys)
    except REDIS_ERRORS:
        return []
    finally:
        with contextlib.suppress(*REDIS_ERRORS):
            await client.aclose()


async def _rebuild_setup(settings: Settings, app_path: str | None):
    """The app to rebuild with (``app_path``, else the newest recorded one, else the demo) and the
    endpoint settings to try, in order: the configured ones (when any are), then every recorded
    set (see :mod:`agentstream.runtime.service_settings`); at least one (possibly empty) set."""
    records = await _recorded(settings)
    try:
        app = _load_app(app_path or (records[0].app if records else DEFAULT_APP))
    except ConfigError as exc:
        if app_path or not records:
            raise
        raise ConfigError(
            f"{exc} (the app path {records[0].app!r} that the agent loops recorded is relative to the folder they "
            f"ran in, and this command runs in {os.getcwd()}: run it from that folder, or give --app)"
        ) from None
    configured = await asyncio.to_thread(_endpoints, settings)  # the models file, read off the event loop
    sets = ([configured] if configured else []) + [dict(r.endpoints) for r in records]
    return app, sets or [{}]


async def _verify(settings: Settings, app_path: str | None, trace_id: str, *, quiet: bool = False) -> bool:
    """Rebuild every model call of a trace and compare fingerprints → whether all match.

    Each call is rebuilt with each candidate endpoint set (:func:`_rebuild_setup`) until one
    matches; a call none matches is reported with the first set's settings."""
    from agentstream.steps.replay import endpoint_settings, rebuild_calls

    app, sets = await _rebuild_setup(settings, app_path)
    events = [e for _, e in await _read(settings, trace_id, app.codec)]
    calls = rebuild_calls(events, app.agent, endpoints=sets[0], model_name=settings.openai_model)
    if not calls and quiet:  # `run`'s turn failed before any model call: "0/0 match" says nothing
        return True
    for endpoints in sets[1:]:
        if all(c.matches for c in calls):
            break
        again = rebuild_calls(events, app.agent, endpoints=endpoints, model_name=settings.openai_model)
        calls = [c if c.matches else other for c, other in zip(calls, again, strict=True)]
    good = sum(c.matches for c in calls)
    if not quiet:
        for c in calls:
            typer.echo(f"turn {c.turn_id} step {c.step}: {'match' if c.matches else 'MISMATCH'} {c.rebuilt_sha256}")
            if not c.matches and c.endpoint is not None:
                typer.echo(f"  rebuilt with {endpoint_settings(c.endpoint, configured=c.configured)}")
            if not c.matches and c.prompt_changed:
                typer.echo(
                    f"  the prompt file's texts changed since the call: digest {c.recorded_prompt_digest or '(none)'} "
                    f"recorded, {c.rebuilt_prompt_digest or '(none)'} now"
                )
    typer.secho(
        f"fingerprints: {good}/{len(calls)} model calls rebuilt from the stored trace match",
        fg=typer.colors.GREEN if good == len(calls) else typer.colors.RED,
        err=True,
    )
    if good != len(calls) and not quiet:
        typer.secho(MISMATCH_HINT, err=True)
    return good == len(calls)


RecordedAppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        envvar="AGENTSTREAM_APP",
        show_default=False,
        callback=_filled("the app path"),
        help="The app, as module:attribute (default: the one the agent loops recorded when they started, else the demo).",
    ),
]


@trace_cli.command("verify")
def trace_verify(
    trace_id: TraceIdArgument, app: RecordedAppOption = None, data_dir: StoredDataDirOption = None
) -> None:
    """Rebuild every model call's request from the stored trace and compare fingerprints.

    The app and the model endpoint settings are the ones given (--app, OPENAI_*,
    AGENTSTREAM_DEFAULT_MODEL_OPTIONS, AGENTSTREAM_MODELS_FILE), else those the agent loops
    recorded in Redis when they started."""
    try:
        with _stored(_settings(), data_dir) as settings:
            ok = asyncio.run(_verify(settings, app, trace_id))
    except (AgentStreamError, KeyError) as exc:
        _fail(exc)
    raise typer.Exit(0 if ok else 1)


async def _explain(
    settings: Settings, app_path: str | None, trace_id: str, step: int, turn_id: str | None, as_json: bool
) -> None:
    from agentstream.steps.explaining import explain_call
    from agentstream.steps.replay import endpoint_settings

    app, sets = await _rebuild_setup(settings, app_path)
    events = [e for _, e in await _read(settings, trace_id, app.codec)]
    explanation = None
    try:
        for endpoints in sets:  # the first set that rebuilds the recorded body, else the first
            candidate = explain_call(
                events, app.agent, step=step, turn_id=turn_id, endpoints=endpoints, model_name=settings.openai_model
            )
            explanation = explanation or candidate
            if candidate.recorded_sha256 and candidate.recorded_sha256 == candidate.rebuilt_sha256:
                explanation = candidate
                break
    except (LookupError, KeyError) as exc:
        raise AgentStreamError(f"trace {trace_id!r}: {exc}") from exc
    assert explanation is not None
    sha256, body, endpoint, configured = (
        explanation.rebuilt_sha256,
        explanation.body,
        explanation.endpoint,
        explanation.configured,
    )
    if as_json:
        typer.echo(json.dumps(explanation.as_json(trace_id), indent=2))
        return
    state = "made" if explanation.made else "not made yet (the next call)"
    typer.echo(
        f"trace {trace_id}, turn {explanation.turn_id}, step {step}: model call {explanation.call} of the trace, {state}"
    )
    if explanation.forked_from:
        typer.echo(explanation.forked_from)
    if explanation.left_out:
        typer.echo(f"left out as rolled back (busy policy rollback): turn {', '.join(explanation.left_out)}")
    if explanation.size_tokens is not None:
        typer.echo(
            f"estimated size: {explanation.size_tokens} tokens (prompt and output reserve) of a "
            f"{explanation.window_tokens}-token window"
        )
    if explanation.recorded_sha256:
        verdict = "matches" if explanation.recorded_sha256 == sha256 else "DOES NOT match"
        typer.echo(f"fingerprint: rebuilt {sha256} {verdict} the recorded {explanation.recorded_sha256}")
        if verdict != "matches" and endpoint is not None:
            typer.echo(f"  rebuilt with {endpoint_settings(endpoint, configured=configured)}; {MISMATCH_HINT}")
    typer.echo("request body:")
    typer.echo(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
    from agentstream.steps.approvals import approval_history

    decided = approval_history(await _read(settings, trace_id, app.codec), explanation.turn_id)
    if decided:
        typer.echo("approvals of the turn's tool calls (who decided what, and when):")
        for line in decided:
            typer.echo(f"  {line}")
    if explanation.shrunk:
        typer.echo("shortened results (handle, call, tool: form, by which shrink, at which model call):")
        for shrunk in explanation.shrunk:
            typer.echo(f"  {shrunk}")
    else:
        typer.echo("shortened results: none; every result is shown as recorded")


@trace_cli.command("explain")
def trace_explain(
    trace_id: TraceIdArgument,
    step: Annotated[int, typer.Option("--step", min=0, help="The model call's step within its turn (0-based).")],
    turn_id: Annotated[
        str | None,
        typer.Option(
            "--turn-id",
            "--turn",
            callback=_an_id("a turn id"),
            help="The turn id, as `cancel --turn-id` and the gateway's "
            "`?turn_id=` take it (default: the newest turn; `--turn` "
            "is the old spelling).",
        ),
    ] = None,
    app: RecordedAppOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    data_dir: StoredDataDirOption = None,
) -> None:
    """Show the exact request of one model call, and which shrink shortened each old result and when
    (rebuilt with the settings given, else those the agent loops recorded, as ``trace verify``)."""
    try:
        with _stored(_settings(), data_dir) as settings:
            asyncio.run(_explain(settings, app, trace_id, step, turn_id, as_json))
    except AgentStreamError as exc:
        _fail(exc)


def _backend_name(value: str | None) -> str | None:
    """``--backend``: a name that may name a backend (:func:`agentstream.wire.backends.backend_name_problem`),
    and one of ``AGENTSTREAM_BACKENDS`` when that is set (a usage error otherwise). With the setting
    unset the key is written, with a warning: the services confine nothing until it names the backend."""
    from agentstream.wire.backends import backend_name_problem

    if value is None:
        return None
    _filled("a backend name", name=True)(value)
    problem = backend_name_problem(value)
    if problem is not None:
        raise typer.BadParameter(f"{value!r} cannot name a backend: {problem}")
    configured = [b for b in os.environ.get("AGENTSTREAM_BACKENDS", "").replace(",", " ").split() if b]
    if configured and value not in configured:
        raise typer.BadParameter(f"{value!r} is not one of AGENTSTREAM_BACKENDS ({', '.join(configured)})")
    if not configured:
        typer.secho(
            f"warning: AGENTSTREAM_BACKENDS is not set here; the services must name {value!r} in it for the key's "
            "backend to have its own streams",
            err=True,
        )
    return value


@cli.command("gateway-key")
def gateway_key(
    name: Annotated[
        str,
        typer.Option(
            callback=_filled("a key name", name=True),
            help="The key's name (shown in logs and in the cancels it makes).",
        ),
    ],
    agent: Annotated[
        list[str],
        typer.Option(callback=_an_id("an agent name"), help="An agent the key may use (repeat it; '*' for all)."),
    ],
    keys_file: Annotated[
        str | None,
        typer.Option(callback=_filled("the keys file"), help="Add the entry to this keys file (made if missing)."),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            callback=_backend_name,
            help="Confine the key to this backend's conversations (one of AGENTSTREAM_BACKENDS).",
        ),
    ] = None,
) -> None:
    """Make a new API key for the HTTP gateway. Prints the key (once: the gateway stores only its
    SHA-256) and, without --keys-file, the keys-file entry to put in the gateway's Secret. With
    --backend the key publishes to, reads and cancels only that backend's conversations
    (:mod:`agentstream.ops.apikeys`); a name that is not a backend name is refused as the keys
    file's parser refuses it."""
    import yaml

    from agentstream.ops.apikeys import hash_key, new_key, parse_keys

    key = new_key()
    entry: dict[str, object] = {"name": name, "sha256": hash_key(key), "agents": list(agent)}
    if backend is not None:
        entry["backend"] = backend
    document: dict = {"keys": []}
    try:
        if keys_file and os.path.exists(keys_file):
            with open(keys_file, encoding="utf-8") as f:
                document = yaml.safe_load(f) or {"keys": []}
            parse_keys(document, source=keys_file)
        document.setdefault("keys", []).append(entry)
        parse_keys(document, source=keys_file or "--name/--agent")
    except (ConfigError, yaml.YAMLError, OSError) as exc:
        _fail(exc)
    if keys_file:
        with open(keys_file, "w", encoding="utf-8") as f:
            yaml.safe_dump(document, f, sort_keys=False)
        typer.secho(f"# added key {name!r} to {keys_file}; the key (shown once):", err=True)
        typer.echo(key)
        return
    typer.secho("# the key (shown once; the gateway stores only its hash):", err=True)
    typer.echo(key)
    typer.secho("# its entry in the gateway's keys file (AGENTSTREAM_GATEWAY_KEYS_FILE):", err=True)
    typer.echo(yaml.safe_dump({"keys": [entry]}, sort_keys=False).rstrip())


def _variables(value: list[str] | None) -> list[str] | None:
    """``--var`` values: each ``NAME=VALUE`` with a name (one without ``=`` was dropped unsaid)."""
    for one in value or []:
        if not one.partition("=")[0].strip() or "=" not in one:
            raise typer.BadParameter(f"a template variable is NAME=VALUE with a name (got {one!r})")
    return value


@cli.command("prompt")
def prompt_show(
    name: Annotated[
        str,
        typer.Argument(
            callback=_filled("the prompt file"),
            help="A prompt file: a path, or a name in AGENTSTREAM_PROMPTS_DIR or the shipped prompts/.",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            callback=_filled("a model endpoint id", name=True), help="The model endpoint id whose layer applies."
        ),
    ] = None,
    var: Annotated[list[str] | None, typer.Option(callback=_variables, help="A template variable, NAME=VALUE.")] = None,
) -> None:
    """Print what one model reads from a prompt file: its system prompt, texts and tool texts."""
    from agentstream.declarations.prompts import load_prompt_file

    variables = dict(v.split("=", 1) for v in (var or []))
    try:
        prompts = load_prompt_file(name, variables=variables).for_model(model)
        typer.echo(f"# digest {prompts.digest}\n# system\n{prompts.system(**variables)}")
    except AgentStreamError as exc:
        _fail(exc)
    for key, text in sorted(prompts.texts.items()):
        typer.echo(f"# text {key}\n{text}")
    for tool_name, texts in sorted(prompts.tools.items()):
        typer.echo(f"# tool {tool_name}\n{texts.model_dump_json(exclude_defaults=True)}")


@schema_cli.command("turn")
def schema_turn(
    app: Annotated[
        str | None,
        typer.Option(
            "--app", help="An app (module:attribute): print one schema per agent, reflecting the agent's typed input"
        ),
    ] = None,
) -> None:
    """The JSON schema of the turn message other backends publish; with --app, one per agent
    (``{"<agent>": <schema>}``), each with the agent's typed input."""
    if app is None:
        typer.echo(json.dumps(codec.turn_message_schema(), indent=2))
        return
    try:
        loaded = _load_app(app)
    except AgentStreamError as exc:
        _fail(exc)
    typer.echo(json.dumps({a.name: codec.agent_turn_schema(a.name, a.input) for a in loaded.agents}, indent=2))


@schema_cli.command("asyncapi")
def schema_asyncapi() -> None:
    """The AsyncAPI 3.0 document of every public channel (turns, replies, cancel, errors, traces,
    deltas) under AGENTSTREAM_NAMESPACE, made with FastStream's AsyncAPI support."""
    from agentstream.cli.asyncapi import asyncapi_document
    from agentstream.wire.keys import Keys

    namespace = os.environ.get("AGENTSTREAM_NAMESPACE") or Keys().namespace
    typer.echo(json.dumps(asyncapi_document(Keys(namespace)), indent=2))


@cli.command()
def partition(
    trace_id: TraceIdArgument,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Which partition a trace's work goes to under AGENTSTREAM_PARTITIONS, and the streams a
    backend publishes its turns to (CRC-32 of the trace id's UTF-8 bytes, mod the partitions);
    for a conversation of a backend of AGENTSTREAM_BACKENDS, that backend's own streams."""
    keys = _settings().keys
    out = {
        "trace_id": trace_id,
        "partitions": keys.partitions,
        "partition": keys.partition(trace_id),
        "turns": keys.turns_for(trace_id),
        "wake": keys.wake_for(trace_id),
    }
    backend = keys.backend_of_trace(trace_id)
    if backend is not None:  # a confined backend's conversation: its own streams (AGENTSTREAM_BACKENDS)
        out |= {
            "backend": backend,
            "backend_turns": keys.backend_turns_for(backend, trace_id),
            "backend_cancel": keys.backend_cancel(backend),
            "backend_replies": keys.backend_replies(backend),
        }
    if as_json:
        typer.echo(json.dumps(out))
        return
    if backend is not None:
        typer.echo(
            f"partition {out['partition']} of {keys.partitions}: backend {backend!r} publishes its turns to "
            f"{out['backend_turns']}, its cancels to {out['backend_cancel']}, and reads {out['backend_replies']}"
        )
        return
    typer.echo(f"partition {out['partition']} of {keys.partitions}: publish its turns to {out['turns']}")


@schema_cli.command("reply")
def schema_reply() -> None:
    """The JSON schema of the reply message the agent loop publishes when a turn ends."""
    typer.echo(json.dumps(codec.reply_schema(), indent=2))


@schema_cli.command("events")
def schema_events(app: AppOption = DEFAULT_APP) -> None:
    """The JSON schema of every stored trace event and element (built-in and the app's), for this trace schema version."""
    from agentstream.wire.schemas import trace_events_schema

    try:
        types = _load_app(app).types
    except AgentStreamError as exc:
        _fail(exc)
    typer.echo(json.dumps(trace_events_schema(types), indent=2))


def _plain_helps(*groups: typer.Typer) -> None:
    """Every command's and group's ``--help`` text without reST markup and with whole lines
    (:func:`agentstream.cli.helptext.plain_help`), made from its docstring."""
    for group in groups:
        for command in group.registered_commands:
            command.help = plain_help(command.help or (command.callback.__doc__ if command.callback else None))
        infos = [sub for sub in group.registered_groups] + [group.info]
        if group.registered_callback is not None:
            infos.append(group.registered_callback)
        for info in infos:  # the rest are typer's placeholders for "not given"
            for name in ("help", "epilog"):
                if isinstance(getattr(info, name, None), str):
                    setattr(info, name, plain_help(getattr(info, name)))


_plain_helps(cli, trace_cli, schema_cli)


def main(args: list[str] | None = None) -> None:
    """The console script: the CLI, with a usage error (a bad argument or option, as the parsing
    library finds it), a setting or a configuration error anywhere printed as one line and exit
    code 2 (see EXIT_CODES); any other exception is one line ``error: unexpected <type>: ...``
    and exit code 1, its traceback printed too at log level debug (:func:`_debugging`).

    Args:
        args: the command line after the program name (default ``sys.argv[1:]``).
    """
    try:
        code = cli(args=args, prog_name="agentstream", standalone_mode=False)
    except typer.TyperException as exc:  # what the parsing library raises (typer's own click)
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `agentstream` alone, `agentstream trace`: the help
            typer.echo(exc.format_message())
        else:
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.secho(f"error: {exc.format_message()}{where}", fg=typer.colors.RED, err=True)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        raise SystemExit(1) from None
    except AgentStreamError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(2) from None
    except Exception as exc:  # a bug or an environment nobody foresaw: one line, the traceback on request
        if _debugging(args):
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        detail = str(exc).splitlines()[0] if str(exc) else ""
        typer.secho(
            f"error: unexpected {type(exc).__name__}{': ' + detail if detail else ''} "
            f"({'the traceback is above' if _debugging(args) else DEBUG_HINT})",
            fg=typer.colors.RED,
            err=True,
        )
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


DEBUG_HINT = "AGENTSTREAM_LOG_LEVEL=debug shows the traceback"


def _debugging(args: list[str] | None) -> bool:
    """Whether the command runs at log level debug (AGENTSTREAM_LOG_LEVEL, or ``--log-level``
    on its command line): then an unexpected error's traceback is printed."""
    words = list(sys.argv[1:] if args is None else args)
    level = os.environ.get("AGENTSTREAM_LOG_LEVEL", "")
    for i, word in enumerate(words):
        if word == "--log-level" and i + 1 < len(words):
            level = words[i + 1]
        elif word.startswith("--log-level="):
            level = word.partition("=")[2]
    return level.strip().lower() == "debug"


if __name__ == "__main__":
    main()


# --- approvals --------------------------------------------------------------------------------


async def _decide(
    settings: Settings, message: ApprovalMessage, wait_s: float, echo=typer.echo
) -> ApprovalDecided | None:
    """Publish an approval or denial on the approvals stream once the trace shows the agent loop
    would take it (:func:`agentstream.steps.approvals.decide_message`, the rule the agent loop and
    the gateway apply: the call awaits approval, its turn is open, an edit is allowed and matches
    the tool's schema); wait up to ``wait_s`` for the decision that stands (None: none seen).

    Raises:
        AgentStreamError: the decision would be refused (the reason, before anything is
            published), or the agent loop refused it after all (the errors stream's reason).
    """
    from agentstream.runtime.operations import publish_approval
    from agentstream.steps.approvals import AlreadyDecided, Refused, decide_message
    from agentstream.steps.trace_fold import fold_events

    redis = _connect(settings)
    store = TraceStore(redis, settings.keys)
    try:
        entries = await store.read(message.trace_id)
        fold = fold_events(message.trace_id, entries)
        awaited, decided, turn_open = fold.approval_of(message.call_id)
        if awaited is None and decided is None:
            raise AgentStreamError(
                f"trace {message.trace_id!r} holds no call {message.call_id!r} awaiting approval "
                "(`agentstream trace show` lists the calls that do)"
            )
        outcome = decide_message(message, awaited=awaited, decided=decided, turn_open=turn_open, by=message.by)
        if isinstance(outcome, AlreadyDecided):
            echo(f"call {message.call_id!r} was decided already:")
            return outcome.decision
        if isinstance(outcome, Refused):
            raise AgentStreamError(outcome.reason.replace("; nothing was decided, send the decision again", ""))
        errors_after = await last_entry_id(redis, settings.keys.errors)
        entry = await publish_approval(redis, settings.keys, message)
        what = "approval" if message.approved else "denial"
        echo(f"{what} of call {message.call_id} published ({settings.keys.approvals} {entry})")
        if wait_s <= 0:
            return None
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(wait_s, stop.set)
        start = entries[-1][0] if entries else "0-0"

        recorded = _first_event(
            store,
            message.trace_id,
            start,
            stop,
            lambda e: isinstance(e, ApprovalDecided) and e.call_id == message.call_id,
        )
        decision, refusal = await _unless_refused(
            redis, settings, recorded, source=settings.keys.approvals, entry=entry, after=errors_after, stop=stop
        )
        if decision is not None:
            return decision
        if refusal is not None:
            raise AgentStreamError(f"the agent loop refused the {what}: {refusal}")
        echo(f"no decision on call {message.call_id} was recorded within {wait_s:.0f} s; is the agent loop running?")
        return None
    finally:
        await redis.aclose()


async def _first_event(store: TraceStore, trace_id: str, after: str, stop: asyncio.Event, match) -> Any:
    """The first event of trace ``trace_id`` appended after entry ``after`` for which
    ``match(event)`` is true, followed as it is appended; None once ``stop`` is set."""
    async for _, event in store.follow(trace_id, after=after, block_ms=500, stop=stop):
        if match(event):
            return event
    return None


async def _unless_refused(redis, settings: Settings, outcome, *, source: str, entry: str, after: str, stop):
    """Await ``outcome`` (a coroutine that ends with what the command waits for, or None once
    ``stop`` is set) while watching the errors stream for a refusal of entry ``entry`` of
    ``source`` (:func:`agentstream.runtime.reports.refusal_of`, from ``after``): a refusal sets
    ``stop``, so the wait ends at once → (the outcome or None, the refusal's reason or None)."""
    from agentstream.runtime.reports import refusal_of

    watch = asyncio.create_task(refusal_of(redis, settings.keys, source=source, entry=entry, after=after, stop=stop))
    watch.add_done_callback(lambda t: None if t.cancelled() or t.exception() or t.result() is None else stop.set())
    try:
        got = await outcome
    finally:
        if not watch.done():
            watch.cancel()
        await asyncio.wait({watch})
    refusal = None if watch.cancelled() or watch.exception() else watch.result()
    return got, refusal


APPROVAL_FLAGS = {
    "$.trace_id": "TRACE_ID",
    "$.call_id": "CALL_ID",
    "$.reason": "--reason",
    "$.by": "--by (or $USER)",
    "$.arguments": "--arguments",
}
"""Where each field of an approval message comes from on ``approve``/``deny``'s command line."""


def _named_flag(error: str, flags: dict[str, str]) -> str:
    """A wire check's message about a message the CLI built (``... - at `$.reason```), with the
    command-line flag or argument that gave that field named first."""
    for path, flag in flags.items():
        if error.endswith(f"`{path}`"):
            return f"{flag}: {error}"
    return error


def _approve_or_deny(
    approved: bool, trace_id: str, call_id: str, reason: str, by: str | None, arguments: str | None, wait_s: float
) -> None:
    by = by or os.environ.get("USER") or "cli"
    settings = _settings()
    if not settings.redis_url:
        _fail(AgentStreamError("REDIS_URL is not set"))
    try:
        message = codec.decode_approval(
            msgspec.json.encode(
                ApprovalMessage(
                    trace_id=trace_id, call_id=call_id, approved=approved, by=by, reason=reason, arguments=arguments
                )
            )
        )
    except msgspec.DecodeError as exc:
        _fail(AgentStreamError(_named_flag(str(exc), APPROVAL_FLAGS)))
    try:
        _check_redis(settings)
        decision = asyncio.run(_decide(settings, message, wait_s))
    except AgentStreamError as exc:
        _fail(exc)
    except REDIS_ERRORS as exc:
        _fail(_unreachable(settings, exc))
    if decision is not None:
        typer.echo(describe(decision).strip())
    raise typer.Exit(0 if decision is not None and decision.approved == approved and decision.by == by else 1)


_CallIdArgument = Annotated[
    str, typer.Argument(callback=_an_id("a call id"), help="The tool call (its `approval_awaited` event).")
]
_ByOption = Annotated[
    str | None,
    typer.Option(callback=_filled("who decides (--by)"), help="Who decides (recorded in the trace; default $USER)."),
]


@cli.command()
def approve(
    trace_id: TraceIdArgument,
    call_id: _CallIdArgument,
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    by: _ByOption = None,
    arguments: Annotated[
        str | None,
        typer.Option(help="Run the call with these arguments (a JSON object) instead, where the tool allows it."),
    ] = None,
    wait_s: Annotated[float, typer.Option(min=0, help="Wait this long for the decision to be recorded.")] = 30.0,
) -> None:
    """Approve a tool call that awaits a person (REDIS_URL): publish the approval on the approvals
    stream and wait until the trace records the decision. Exit code 0 when this approval stands."""
    _approve_or_deny(True, trace_id, call_id, reason, by, arguments, wait_s)


@cli.command()
def deny(
    trace_id: TraceIdArgument,
    call_id: _CallIdArgument,
    reason: Annotated[str, typer.Option(help="Why (the model sees it in the call's error result).")] = "",
    by: _ByOption = None,
    wait_s: Annotated[float, typer.Option(min=0, help="Wait this long for the decision to be recorded.")] = 30.0,
) -> None:
    """Deny a tool call that awaits a person (REDIS_URL): the call does not run and the model sees
    an error result with the reason. Exit code 0 when this denial stands."""
    _approve_or_deny(False, trace_id, call_id, reason, by, None, wait_s)
