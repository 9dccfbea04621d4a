"""The ``agentstream`` command (typer).

Commands:

- ``run "question"``: the main job on a laptop: Redis (REDIS_URL or embedded), a model
  (OPENAI_* or the local SmolLM2), and every service (agent loop, tool worker, delegation,
  compaction) as separate processes; asks, prints each step as it happens, verifies the trace's
  fingerprints, and stops everything.
- ``serve <service> --app mod:app``: one service (``agent-loop``, ``tool-worker``,
  ``delegation`` or ``compaction``); scale a service by running more of them.
- ``dev --app mod:app``: every service in one process.
- ``ask "question"``: publish a turn to running services and follow it.
- ``cancel <trace id>``: stop the running turn of a conversation (or ``--turn-id``) and wait
  until it has ended.
- ``trace show <id>`` / ``trace verify <id>``: print a stored trace / rebuild its requests.
- ``trace explain <id> --step N [--turn ID]``: one model call's exact request, and why each
  old result in it was shortened (which shrink, at which call).
- ``schema turn`` / ``schema reply``: the JSON schemas of the turn message other backends
  publish and of the reply they read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from enum import Enum
from typing import Annotated, Optional

import httpx
import redis.exceptions
import typer

from agentstream import codec
from agentstream.app import load_app
from agentstream.errors import AgentStreamError, ConfigError
from agentstream.events import (
    CancelMessage,
    CancelRequested,
    Compaction,
    CompactionFailed,
    Event,
    ModelOutput,
    TaskInput,
    ToolOutput,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream.deltas import last_entry_id
from agentstream.keys import TURN_FIELD
from agentstream.redis_conn import connect, redis_url_or_embedded
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream.watch import watch_turn

DEFAULT_APP = "agentstream.demo.app:app"

cli = typer.Typer(add_completion=False, no_args_is_help=True, help="Run LLM agents as services over Redis Streams.")
trace_cli = typer.Typer(no_args_is_help=True, help="Read stored traces.")
schema_cli = typer.Typer(no_args_is_help=True, help="Print wire-format schemas.")
cli.add_typer(trace_cli, name="trace")
cli.add_typer(schema_cli, name="schema")


class Service(str, Enum):
    agent_loop = "agent-loop"
    tool_worker = "tool-worker"
    delegation = "delegation"
    compaction = "compaction"


AppOption = Annotated[str, typer.Option("--app", envvar="AGENTSTREAM_APP", help="The app, as module:attribute.")]


def _setup_logging(level: str) -> None:
    from agentstream import logs

    logs.setup(level, fmt=os.environ.get("AGENTSTREAM_LOG_FORMAT", "json"))


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _shown_url(url: str) -> str:
    """A Redis URL without its password, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "(unparsable)"


def _connect(settings: Settings, *, retries: int = 1):
    """A client for REDIS_URL, or AgentStreamError with a one-line reason (unset, malformed)."""
    if not settings.redis_url:
        raise AgentStreamError("REDIS_URL is not set; point it at the Redis of the services (`agentstream dev` prints it)")
    try:
        return connect(settings.redis_url, retries=retries)
    except ValueError as exc:
        raise AgentStreamError(f"REDIS_URL {_shown_url(settings.redis_url)!r} is not a Redis URL: {exc}") from None


def _unreachable(settings: Settings, exc: Exception) -> AgentStreamError:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return AgentStreamError(f"cannot reach Redis at {_shown_url(settings.redis_url or '')} (REDIS_URL): {detail}")


REDIS_ERRORS = (redis.exceptions.RedisError, OSError, ValueError)
"""What a command's Redis calls may raise for a bad URL or an unreachable server."""


# --- services --------------------------------------------------------------------------------


async def _serve(services: list[Service], app_path: str, queues: list[str] | None, settings: Settings) -> None:
    from agentstream.service import run_consumers
    from agentstream_services.agent_loop.service import build as build_loop
    from agentstream_services.tool_worker.service import build as build_worker

    app = load_app(app_path)
    if not settings.redis_url:
        raise AgentStreamError("REDIS_URL is not set (use `agentstream dev` or `agentstream run` for an embedded Redis)")
    redis = connect(settings.redis_url)
    store = TraceStore(redis, settings.keys)
    consumers = []
    async with httpx.AsyncClient() as http:
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
        try:
            await run_consumers(
                consumers,
                grace_s=settings.shutdown_grace_s,
                metrics_port=settings.metrics_port,
                metrics_interval_s=settings.metrics_interval_s,
            )
        finally:
            await redis.aclose()


def _queue_names(value: Optional[list[str]]) -> Optional[list[str]]:
    if value and any(not name.strip() for name in value):
        raise typer.BadParameter("a tool queue name cannot be empty")
    return value


@cli.command()
def serve(
    service: Annotated[Service, typer.Argument(help="Which service to run.")],
    app: AppOption = DEFAULT_APP,
    queue: Annotated[Optional[list[str]], typer.Option(help="Tool queue(s) to consume (tool-worker).", callback=_queue_names)] = None,
    log_level: str = "INFO",
) -> None:
    """Run one service until SIGTERM (then drain within AGENTSTREAM_SHUTDOWN_GRACE_S)."""
    _setup_logging(log_level)
    try:
        asyncio.run(_serve([service], app, queue, Settings()))
    except AgentStreamError as exc:
        _fail(exc)


@contextlib.contextmanager
def _environment(settings: Settings):
    """Redis and a model: the configured ones, or an embedded Redis and the local model."""
    url, embedded = redis_url_or_embedded(settings.redis_url)
    local = None
    try:
        base_url, model = settings.openai_base_url, settings.openai_model
        if not base_url:
            from agentstream.localmodel import LocalModelServer

            typer.secho("starting the local model (SmolLM2-135M on llama.cpp)…", fg=typer.colors.BRIGHT_BLACK, err=True)
            local = LocalModelServer()
            local.start()
            base_url, model = local.base_url, local.model
            if not settings.default_model_options:  # the local server's quirks (see localmodel.py)
                os.environ["AGENTSTREAM_DEFAULT_MODEL_OPTIONS"] = json.dumps(local.endpoint_options())
        env = {"REDIS_URL": url, "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": model or ""}
        os.environ.update(env)
        yield Settings()
    finally:
        if local is not None:
            local.stop()
        if embedded is not None:
            embedded.stop()


SHARED_VARIABLES = ("REDIS_URL", "AGENTSTREAM_NAMESPACE", "OPENAI_BASE_URL", "OPENAI_MODEL", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS")
"""What another shell needs to reach the same services and rebuild their requests exactly."""


def environment_lines(environ) -> list[str]:
    """``export NAME=value`` lines (shell-quoted) of :data:`SHARED_VARIABLES` that are set.

    ``AGENTSTREAM_DEFAULT_MODEL_OPTIONS`` carries the model server's quirks: without it,
    ``trace verify`` rebuilds other bodies than were sent, and services started elsewhere send
    requests the server refuses.
    """
    return [f"export {name}={shlex.quote(environ[name])}" for name in SHARED_VARIABLES if environ.get(name)]


@cli.command()
def dev(app: AppOption = DEFAULT_APP, log_level: str = "INFO") -> None:
    """Every service in one process, on REDIS_URL / OPENAI_* or the embedded defaults."""
    _setup_logging(log_level)
    try:
        with _environment(Settings()) as settings:
            typer.secho("# for `agentstream ask` and `agentstream trace ...` in another shell:", err=True)
            for line in environment_lines(os.environ):
                typer.secho(line, err=True)
            asyncio.run(_serve(list(Service), app, None, settings))
    except AgentStreamError as exc:
        _fail(exc)


# --- asking ----------------------------------------------------------------------------------


def describe(event: Event) -> str:
    """One line per event, for people following a trace."""
    match event:
        case TaskInput(agent=agent, text=text, depth=depth, parent_trace_id=parent, call_id=call_id):
            return f"» task for {agent} (depth {depth}, for call {call_id} of trace {parent}): {text}"
        case TurnInput(agent=agent, text=text):
            return f"» turn for {agent}: {text}"
        case ModelOutput(step=step, tool_calls=calls, content=content, stop_reason=stop, latency_ms=ms):
            head = f"· model call {step} ({ms / 1000:.1f} s, {stop})"
            lines = [head]
            for call in calls:
                lines.append(f"  → tool call {call.name}({call.arguments}) [{call.id}]")
            if content and calls:
                lines.append(f"  text: {content}")
            return "\n".join(lines)
        case ToolOutput(name=name, text=text, error=error, call_id=call_id):
            shown = text if len(text) <= 300 else text[:300] + "…"
            return f"  ← tool result {name} [{call_id}]{' (error)' if error else ''}: {shown}"
        case TurnEnded(answer=answer):
            return f"✓ answer: {answer}"
        case TurnFailed(code=code, reason=reason):
            return f"✗ turn failed ({code}): {reason}"
        case ToolStarted(name=name, call_id=call_id, worker=worker):
            return f"  ▸ tool started {name} [{call_id}] on {worker or '?'}"
        case CancelRequested(turn_id=turn_id, by=by, reason=reason):
            return f"■ cancel of turn {turn_id} requested by {by}{': ' + reason if reason else ''}"
        case Compaction(summary=summary, replaced_turns=replaced, kept_from_turn=kept):
            shown = summary if len(summary) <= 300 else summary[:300] + "…"
            return f"⋯ a summary now replaces {replaced} earlier turn(s) (kept from turn {kept}): {shown}"
        case CompactionFailed(code=code, reason=reason):
            return f"⚠ compaction failed ({code}): {reason}"
    return repr(event)


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


async def _ask(settings: Settings, agent: str, text: str, trace_id: str, timeout_s: float, echo=typer.echo) -> TurnEnded | TurnFailed | None:
    redis = _connect(settings, retries=6)
    try:
        turn_id = uuid.uuid4().hex
        start = "0-0"
        last = await redis.xrevrange(settings.keys.trace(trace_id), count=1)
        if last:
            start = last[0][0].decode()
        deltas_start = await last_entry_id(redis, settings.keys.deltas(trace_id))
        message = TurnMessage(trace_id=trace_id, turn_id=turn_id, agent=agent, text=text)
        await redis.xadd(settings.keys.turns, {TURN_FIELD: codec.encode(message)})
        deadline = time.monotonic() + timeout_s
        stop = asyncio.Event()

        async def watchdog() -> None:
            await asyncio.sleep(timeout_s)
            stop.set()

        guard = asyncio.create_task(watchdog())
        try:
            # the steps from the trace, and the reply's tokens as they arrive (agentstream.watch)
            ending = await watch_turn(
                redis, settings.keys, trace_id, turn_id, after=start, deltas_after=deltas_start,
                stop=stop, echo=echo, describe=Describer(), outage_s=timeout_s,  # a Redis restart is ridden out
            )
            if ending is not None:
                return ending
        finally:
            guard.cancel()
        echo(f"no answer within {timeout_s:.0f} s (trace {trace_id}); is `agentstream serve` running?")
        _ = deadline
        return None
    finally:
        await redis.aclose()


TimeoutOption = typer.Option("--timeout-s", min=0.1, help="Give up waiting for the answer after this many seconds.")


@cli.command()
def ask(
    text: Annotated[str, typer.Argument(help="The user's message.")],
    agent: str = "demo",
    trace_id: Annotated[Optional[str], typer.Option(help="Continue this conversation.")] = None,
    timeout_s: Annotated[float, TimeoutOption] = 300.0,
) -> None:
    """Publish a turn to running services (REDIS_URL) and print each step until the answer."""
    settings = Settings()
    if not settings.redis_url:
        _fail(AgentStreamError("REDIS_URL is not set; `agentstream run` runs everything on a laptop"))
    trace_id = trace_id or uuid.uuid4().hex
    typer.secho(f"trace {trace_id}", fg=typer.colors.BRIGHT_BLACK, err=True)
    try:
        ending = asyncio.run(_ask(settings, agent, text, trace_id, timeout_s))
    except AgentStreamError as exc:
        _fail(exc)
    except REDIS_ERRORS as exc:
        _fail(_unreachable(settings, exc))
    raise typer.Exit(0 if isinstance(ending, TurnEnded) else 1)


async def _cancel(settings: Settings, message: CancelMessage, wait_s: float, echo=typer.echo) -> TurnFailed | TurnEnded | None:
    from agentstream.cancel import cancel_target, publish_cancel

    redis = connect(settings.redis_url or "")
    store = TraceStore(redis, settings.keys)
    try:
        entries = await store.read(message.trace_id)
        start = entries[-1][0] if entries else "0-0"
        # the turn running now when none is named, so the wait below follows that one; a turn id
        # the trace does not hold (or that ended) is not published: it would cancel a later turn
        target = cancel_target([e for _, e in entries], message.turn_id)
        if target.turn_id is None:
            echo(f"trace {message.trace_id!r}: {target.reason}; nothing to cancel")
            return target.ending
        message.turn_id = target.turn_id
        entry = await publish_cancel(redis, settings.keys, message)
        echo(f"cancel of turn {message.turn_id} published ({settings.keys.cancel} {entry})")
        if wait_s <= 0:
            return None
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(wait_s, stop.set)
        async for _, event in store.follow(message.trace_id, after=start, block_ms=500, stop=stop):
            if isinstance(event, (TurnEnded, TurnFailed)) and event.turn_id == message.turn_id:
                return event
        echo(f"turn {message.turn_id} did not end within {wait_s:.0f} s; is the agent loop running?")
        return None
    finally:
        await redis.aclose()


@cli.command()
def cancel(
    trace_id: Annotated[str, typer.Argument(help="The conversation whose turn to stop.")],
    turn_id: Annotated[str, typer.Option(help="The turn to stop (default: the one running now).")] = "",
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    by: Annotated[str, typer.Option(help="Who asks.")] = "user",
    wait_s: Annotated[float, typer.Option(help="Wait this long for the turn to end (0: do not wait).")] = 60.0,
) -> None:
    """Cancel a turn (REDIS_URL): publish a cancel request and wait until the turn has ended.

    The in-flight model request is aborted, queued tool jobs are skipped, running tools are
    told, and every call without a result gets a cancelled result; the turn ends with
    ``turn_failed`` code ``cancelled``. Exit code 0 when the turn ended as cancelled.
    """
    settings = Settings()
    if not settings.redis_url:
        _fail(AgentStreamError("REDIS_URL is not set"))
    message = CancelMessage(trace_id=trace_id, turn_id=turn_id, by=by, reason=reason)
    ending = asyncio.run(_cancel(settings, message, wait_s))
    if ending is not None:
        typer.echo(describe(ending))
    raise typer.Exit(0 if isinstance(ending, TurnFailed) and ending.code == "cancelled" else 1)


@cli.command()
def run(
    text: Annotated[str, typer.Argument(help="The user's message.")] = "What is 365 * 24?",
    app: AppOption = DEFAULT_APP,
    agent: str = "demo",
    turns: Annotated[int, typer.Option(min=1, help="Ask the message this many times in one conversation "
                                       "(a long conversation, to see compaction).")] = 1,
    timeout_s: Annotated[float, TimeoutOption] = 300.0,
    log_level: str = "WARNING",
) -> None:
    """The main job: answer one turn end to end with the agent loop and a tool worker as
    separate processes, on REDIS_URL / OPENAI_* or the embedded defaults."""
    _setup_logging(log_level)
    procs: list[subprocess.Popen] = []
    try:
        with _environment(Settings()) as settings:
            load_app(app)  # fail fast on a bad app path, before starting processes
            for service in Service:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "agentstream", "serve", service.value, "--app", app, "--log-level", log_level],
                        env={**os.environ, "AGENTSTREAM_CONSUMER": f"{service.value}-{os.getpid()}"},
                    )
                )
            typer.secho(
                f"{', '.join(f'{s.value} pid {p.pid}' for s, p in zip(Service, procs))}, model {settings.openai_model} "
                f"at {settings.openai_base_url}",
                fg=typer.colors.BRIGHT_BLACK,
                err=True,
            )
            trace_id = uuid.uuid4().hex
            typer.secho(f"trace {trace_id}", fg=typer.colors.BRIGHT_BLACK, err=True)
            for _ in range(turns):
                ending = asyncio.run(_ask(settings, agent, text, trace_id, timeout_s))
                if not isinstance(ending, TurnEnded):
                    break
            if ending is not None:
                asyncio.run(_verify(settings, app, trace_id, quiet=True))
    except AgentStreamError as exc:
        _fail(exc)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    raise typer.Exit(0 if isinstance(ending, TurnEnded) else 1)


# --- traces ----------------------------------------------------------------------------------


async def _read(settings: Settings, trace_id: str):
    """The stored trace's entries; AgentStreamError when Redis is not reachable or the trace is empty."""
    redis = _connect(settings)
    try:
        entries = await TraceStore(redis, settings.keys).read(trace_id)
    except REDIS_ERRORS as exc:
        raise _unreachable(settings, exc) from None
    finally:
        with contextlib.suppress(*REDIS_ERRORS):
            await redis.aclose()
    if not entries:
        raise AgentStreamError(f"trace {trace_id!r} has no events (namespace {settings.keys.namespace!r})")
    return entries


@trace_cli.command("show")
def trace_show(trace_id: str, as_json: Annotated[bool, typer.Option("--json", help="One JSON event per line.")] = False) -> None:
    """Print a stored trace (REDIS_URL)."""
    try:
        entries = asyncio.run(_read(Settings(), trace_id))
    except AgentStreamError as exc:
        _fail(exc)
    describer = Describer()
    for entry_id, event in entries:
        if as_json:
            typer.echo(json.dumps({"id": entry_id, **json.loads(codec.encode(event))}))
        else:
            typer.echo(f"{entry_id}  {describer(event)}")


def _endpoints(settings: Settings):
    """The configured model endpoints (keys not required: nothing is sent), or none."""
    from agentstream.models.endpoints import load_endpoints

    try:
        return load_endpoints(settings, require_keys=False)
    except ConfigError:
        return {}  # rebuild each call for its recorded provider and model


MISMATCH_HINT = (
    "a rebuilt body differs from the one sent when the endpoint settings differ from the services' "
    "(OPENAI_MODEL, AGENTSTREAM_DEFAULT_MODEL_OPTIONS, AGENTSTREAM_MODELS_FILE): use the lines "
    "`agentstream dev` or `python -m agentstream.localmodel` printed"
)


async def _verify(settings: Settings, app_path: str, trace_id: str, *, quiet: bool = False) -> bool:
    from agentstream.replay import endpoint_settings, rebuild_calls

    app = load_app(app_path)
    events = [e for _, e in await _read(settings, trace_id)]
    calls = rebuild_calls(events, app.agent, endpoints=_endpoints(settings), model_name=settings.openai_model)
    good = sum(c.matches for c in calls)
    if not quiet:
        for c in calls:
            typer.echo(f"turn {c.turn_id} step {c.step}: {'match' if c.matches else 'MISMATCH'} {c.rebuilt_sha256}")
            if not c.matches and c.endpoint is not None:
                typer.echo(f"  rebuilt with {endpoint_settings(c.endpoint, configured=c.configured)}")
    typer.secho(
        f"fingerprints: {good}/{len(calls)} model calls rebuilt from the stored trace match",
        fg=typer.colors.GREEN if good == len(calls) else typer.colors.RED,
        err=True,
    )
    if good != len(calls) and not quiet:
        typer.secho(MISMATCH_HINT, err=True)
    return good == len(calls)


@trace_cli.command("verify")
def trace_verify(trace_id: str, app: AppOption = DEFAULT_APP) -> None:
    """Rebuild every model call's request from the stored trace and compare fingerprints."""
    try:
        ok = asyncio.run(_verify(Settings(), app, trace_id))
    except (AgentStreamError, KeyError) as exc:
        _fail(exc)
    raise typer.Exit(0 if ok else 1)


async def _explain(settings: Settings, app_path: str, trace_id: str, step: int, turn_id: str | None, as_json: bool) -> None:
    from agentstream.context import describe_shrunk, explain
    from agentstream.delegation import offered_agent
    from agentstream.models import formats, openai_format
    from agentstream.replay import endpoint_settings, rebuild_calls

    app = load_app(app_path)
    events = [e for _, e in await _read(settings, trace_id)]
    endpoints = _endpoints(settings)
    try:
        explanation = explain(events, app.agent, step=step, turn_id=turn_id, endpoints=endpoints)
        # the body as the call's endpoint renders it, as `trace verify` does
        if explanation.made:
            rebuilt = next(
                c for c in rebuild_calls(events, app.agent, endpoints=endpoints, model_name=settings.openai_model)
                if (c.turn_id, c.step) == (explanation.turn_id, step)
            )
            body, endpoint, configured = rebuilt.body, rebuilt.endpoint, rebuilt.configured
        else:  # the next call: as the agent's endpoint would get it
            turn = next(e for e in events if isinstance(e, TurnInput) and e.turn_id == explanation.turn_id)
            agent = offered_agent(app.agent(turn.agent), turn, endpoints)  # type: ignore[arg-type]
            endpoint = endpoints.get(agent.model)
            configured = endpoint is not None
            if endpoint is not None:
                body = formats.request_body(explanation.request, endpoint)
            else:
                body = openai_format.request_body(explanation.request, model=settings.openai_model or "gpt-4o-mini")
    except (LookupError, KeyError) as exc:
        raise AgentStreamError(f"trace {trace_id!r}: {exc}") from exc
    sha256 = openai_format.fingerprint(body)
    built = explanation.built
    if as_json:
        typer.echo(json.dumps({
            "trace_id": trace_id, "turn_id": explanation.turn_id, "step": step, "call": built.call,
            "made": explanation.made, "recorded_sha256": explanation.recorded_sha256, "rebuilt_sha256": sha256,
            "size_tokens": built.size_tokens, "window_tokens": built.window_tokens,
            "body": json.loads(body), "shrunk": [describe_shrunk(s) for s in built.shrunk],
        }, indent=2))
        return
    state = "made" if explanation.made else "not made yet (the next call)"
    typer.echo(f"trace {trace_id}, turn {explanation.turn_id}, step {step}: model call {built.call} of the trace, {state}")
    if built.size_tokens is not None:
        typer.echo(f"estimated size: {built.size_tokens} tokens (prompt and output reserve) of a {built.window_tokens}-token window")
    if explanation.recorded_sha256:
        verdict = "matches" if explanation.recorded_sha256 == sha256 else "DOES NOT match"
        typer.echo(f"fingerprint: rebuilt {sha256} {verdict} the recorded {explanation.recorded_sha256}")
        if verdict != "matches" and endpoint is not None:
            typer.echo(f"  rebuilt with {endpoint_settings(endpoint, configured=configured)}; {MISMATCH_HINT}")
    typer.echo("request body:")
    typer.echo(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
    if built.shrunk:
        typer.echo("shortened results (handle, call, tool: form, by which shrink, at which model call):")
        for shrunk in built.shrunk:
            typer.echo(f"  {describe_shrunk(shrunk)}")
    else:
        typer.echo("shortened results: none; every result is shown as recorded")


@trace_cli.command("explain")
def trace_explain(
    trace_id: str,
    step: Annotated[int, typer.Option("--step", help="The model call's step within its turn (0-based).")],
    turn: Annotated[Optional[str], typer.Option("--turn", help="The turn id (default: the newest turn).")] = None,
    app: AppOption = DEFAULT_APP,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show the exact request of one model call, and which shrink shortened each old result and when."""
    try:
        asyncio.run(_explain(Settings(), app, trace_id, step, turn, as_json))
    except AgentStreamError as exc:
        _fail(exc)


@cli.command("prompt")
def prompt_show(
    name: Annotated[str, typer.Argument(help="A prompt file: a path, or a name in AGENTSTREAM_PROMPTS_DIR or the shipped prompts/.")],
    model: Annotated[Optional[str], typer.Option(help="The model endpoint id whose layer applies.")] = None,
    var: Annotated[Optional[list[str]], typer.Option(help="A template variable, NAME=VALUE.")] = None,
) -> None:
    """Print what one model reads from a prompt file: its system prompt, texts and tool texts."""
    from agentstream.prompts import load_prompt_file

    variables = dict(v.split("=", 1) for v in (var or []) if "=" in v)
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
def schema_turn() -> None:
    """The JSON schema of the turn message other backends publish."""
    typer.echo(json.dumps(codec.turn_message_schema(), indent=2))


@schema_cli.command("reply")
def schema_reply() -> None:
    """The JSON schema of the reply message the agent loop publishes when a turn ends."""
    typer.echo(json.dumps(codec.reply_schema(), indent=2))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
