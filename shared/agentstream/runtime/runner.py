"""Running consumers as a service process: signals, graceful drain, health and metrics.

Probes (on ``AGENTSTREAM_METRICS_PORT``): ``/healthz`` (liveness) answers from the service's own
event loop, so it answers exactly while the loop runs; ``/readyz`` (readiness) is 200 only when
the service is connected and authenticated to Redis (a PING answers), every consumer group it
reads is in place and every consumer and listener is running, else 503 with the reason
(:class:`Readiness`). A bad ``REDIS_URL`` password therefore rolls out as not Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from agentstream.errors import ConfigError, ServiceFailed
from agentstream.ops import metrics
from agentstream.ops.redact import redact_url, url_secrets
from agentstream.runtime import stream_gauges
from agentstream.runtime.connection import COMMAND_ERRORS

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger("agentstream.runtime.runner")

_REDIS_OR_SOCKET_ERRORS: tuple[type[Exception], ...] = (*COMMAND_ERRORS, OSError)
"""What the startup check waits out and tries again: a Redis error, or the socket's."""


class Runner(Protocol):
    """What a service runs: a consumer or a listener of one stream (``stream``). One that works on
    several streams (the gateway publishes to every partition of the turns stream) also has
    ``streams: list[str]``, which the stream gauges then cover instead of ``stream``. ``redis``
    is its client (the readiness probe pings it)."""

    stream: str
    redis: aioredis.Redis

    async def run(self, stop: asyncio.Event) -> None: ...


class Readiness:
    """What ``/readyz`` says, refreshed every ``interval_s`` by :meth:`run` (a probe never waits on Redis).

    Ready means: not stopping; every consumer task running; a PING answers (connected and
    authenticated); each consumer's group exists on its stream (``XINFO GROUPS``).
    """

    def __init__(
        self, consumers: Sequence[Runner], stop: asyncio.Event, *, interval_s: float = 2.0, timeout_s: float = 2.0
    ):
        self.consumers = consumers
        self.stop = stop
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.tasks: Sequence[asyncio.Task] = ()
        self.state: tuple[bool, str] = (False, "starting")
        self.redis = next((c.redis for c in consumers if getattr(c, "redis", None) is not None), None)

    def __call__(self) -> tuple[bool, str]:
        if self.stop.is_set():
            return False, "stopping"
        stopped = [t.get_name() for t in self.tasks if t.done()]
        if stopped:
            return False, f"stopped: {', '.join(stopped)}"
        return self.state

    async def check(self) -> tuple[bool, str]:
        """Look now → ``(ready, reason)``."""
        stopped = [t.get_name() for t in self.tasks if t.done()]
        if stopped:
            return False, f"stopped: {', '.join(stopped)}"
        if self.redis is None:
            return True, "ready"
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.redis.ping()
                for consumer in self.consumers:
                    group = getattr(consumer, "group", None)
                    if group is None:
                        continue
                    names = {_text(g["name"]) for g in await self.redis.xinfo_groups(consumer.stream)}
                    if group not in names:
                        return False, f"consumer group {group!r} of {consumer.stream} is missing (being recreated)"
        except TimeoutError:
            return False, f"Redis did not answer within {self.timeout_s:g} s"
        except Exception as exc:  # not connected, not authenticated, no such stream yet
            return False, f"Redis: {type(exc).__name__}: {_masked(str(exc), self.redis)}"
        return True, "ready"

    async def run(self) -> None:
        while not self.stop.is_set():
            self.state = await self.check()
            try:
                await asyncio.wait_for(self.stop.wait(), self.interval_s)
            except TimeoutError:
                pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _masked(text: str, redis) -> str:
    kwargs = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", {}) or {}
    for secret in (kwargs.get("password"), *url_secrets(kwargs.get("url"))):
        if secret:
            text = text.replace(str(secret), "***")
    return redact_url(text) if "://" in text and " " not in text else text


def runner_connections(runner: object) -> tuple[int, int]:
    """``(blocking reads it holds at once, entries it handles at once)`` of a runner: its own
    ``connections`` attribute when it is such a pair, else one blocking read (a stream consumer's
    XREADGROUP, a listener's XREAD) and its consumer config's concurrency (0 without one). (An
    attribute of that name that is something else, the MCP host's list of its servers, is not a
    declaration: read as one, it stopped every tool worker with an MCP server at startup.)"""
    declared = getattr(runner, "connections", None)
    if isinstance(declared, tuple) and len(declared) == 2 and all(isinstance(n, int) for n in declared):
        return declared
    config = getattr(runner, "config", None)
    return 1, int(getattr(config, "concurrency", 0) or 0)


CHECK_RETRY_MAX_S = 5.0
"""The longest wait between two tries of the start-up checks while Redis cannot be reached."""


async def startup_checks(consumers: Sequence[Runner], stop: asyncio.Event, readiness: Readiness | None = None) -> None:
    """What must hold before a service takes any work, for each Redis client its runners use:

    - the client's pool holds the connections they need at once
      (:func:`agentstream.ops.startup.pool_refusal`: blocking readers per stream and partition,
      the shared connection or one per handler);
    - the server is in the mode the URL says, a Redis Cluster or a single Redis
      (:func:`agentstream.runtime.connection.cluster_mode_refusal`).

    While Redis cannot be reached (or refuses the password) the check is tried again (waits
    doubling up to :data:`CHECK_RETRY_MAX_S`) until it answers or ``stop`` is set, as the
    consumers would wait; ``readiness`` (what ``/readyz`` says) then gives the reason.

    Raises:
        ConfigError: a check failed; the message says what to change, in one line.
    """
    from agentstream.ops.startup import connections_needed, pool_refusal
    from agentstream.runtime.connection import cluster_mode_refusal, pool_size

    clients: dict[int, tuple[object, list[Runner]]] = {}
    for c in consumers:
        client = getattr(c, "redis", None)
        if client is not None:
            clients.setdefault(id(client), (client, []))[1].append(c)
    for client, runners in clients.values():
        if hasattr(client, "connection_pool") or hasattr(client, "nodes_manager"):
            cap, per_node, multiplexed = pool_size(client)  # type: ignore[arg-type]
            need = connections_needed((runner_connections(r) for r in runners), multiplexed=multiplexed)
            refusal = pool_refusal(need, cap, per_node=per_node)
            if refusal:
                raise ConfigError(refusal)
        wait_s = 0.25
        while not stop.is_set():
            try:
                refusal = await cluster_mode_refusal(client)  # type: ignore[arg-type]
            except _REDIS_OR_SOCKET_ERRORS as exc:
                reason = f"Redis: {type(exc).__name__}: {_masked(str(exc), client)}"
                if readiness is not None:
                    readiness.state = (False, reason)
                log.warning("cannot check Redis before starting (%s); trying again in %.1f s", reason, wait_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait_s)
                wait_s = min(wait_s * 2, CHECK_RETRY_MAX_S)
                continue
            if refusal:
                raise ConfigError(refusal)
            break


async def run_consumers(
    consumers: Sequence[Runner],
    *,
    stop: asyncio.Event | None = None,
    grace_s: float = 30.0,
    metrics_port: int = 0,
    metrics_host: str = "0.0.0.0",
    metrics_interval_s: float = 15.0,
    handle_signals: bool = True,
    expected_streams: dict[str, str] | None = None,
    service: str = "",
) -> None:
    """Run consumers until ``stop`` is set or SIGTERM/SIGINT arrives, then drain.

    On stop, consumers take no new entries and finish what they hold within ``grace_s``
    seconds; what is still running after that is cancelled and released: it stays pending in
    its group, marked idle so another worker claims it at once (nothing is acknowledged that
    did not finish), and a trace lease it held is given back.

    A consumer that stops with an error (or returns before ``stop``) stops the others the same
    way, and then :class:`~agentstream.errors.ServiceFailed` is raised (the error chained), so
    the process exits non-zero and an orchestrator restarts it.

    With ``metrics_port``, /metrics, /healthz and /readyz are served on ``metrics_host`` (an
    address of this machine; ``AGENTSTREAM_METRICS_HOST``) and the stream gauges cover the consumers' streams (each runner's
    ``streams`` when it has that attribute, else its ``stream``) and
    ``expected_streams`` (stream → the group that should consume it, e.g. the tool queues the
    agent loop publishes to, so a queue nobody consumes shows 0 live consumers), and
    ``agentstream_build_info`` names ``service``.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if handle_signals:
        _on_signals(loop, stop.set)
    streams = _stream_observer(consumers, expected_streams) if metrics_port and consumers else None
    readiness = Readiness(consumers, stop)
    server = await _serve_metrics(metrics_port, metrics_host, service, readiness, streams) if metrics_port else None
    helpers: list[asyncio.Task] = []
    failures: list[tuple[str, BaseException | None]] = []
    try:
        await startup_checks(consumers, stop, readiness)  # before any work is taken; /readyz says why meanwhile
        tasks = [asyncio.create_task(c.run(stop), name=f"consume:{c.stream}") for c in consumers]
        readiness.tasks = tasks
        if metrics_port:
            helpers.append(asyncio.create_task(readiness.run(), name="readiness"))
        if streams is not None:
            helpers.append(asyncio.create_task(streams.run(interval_s=metrics_interval_s, stop=stop)))
        failures += await _until_stopped_or_failed(tasks, stop)
        stop.set()
        failures += await _drain(tasks, grace_s, reported={name for name, _ in failures})
    finally:
        for helper in helpers:
            helper.cancel()
            await asyncio.gather(helper, return_exceptions=True)
        if server is not None:
            server.close()
            await server.wait_closed()
        if handle_signals:
            _on_signals(loop, None)
    if failures:
        _raise_failed(failures)


def _on_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[], object] | None) -> None:
    """Call ``handler`` on SIGTERM and SIGINT (None: remove the handlers); where the loop cannot
    (not the main thread, Windows), nothing."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            if handler is None:
                loop.remove_signal_handler(sig)
            else:
                loop.add_signal_handler(sig, handler)


def _stream_observer(
    consumers: Sequence[Runner], expected_streams: dict[str, str] | None
) -> stream_gauges.StreamObserver:
    """The gauges of the consumers' streams."""
    # the gauges cover streams, not keys of another type that a runner is named by (the
    # watchdog's sorted set says so with ``stream_gauges = False``); a runner that works on
    # several streams (the gateway publishes to every partition of the turns stream) lists
    # them all in ``streams``
    observed = [
        s for c in consumers if getattr(c, "stream_gauges", True) for s in getattr(c, "streams", None) or [c.stream]
    ]
    return stream_gauges.StreamObserver(consumers[0].redis, observed, expected=expected_streams)


async def _serve_metrics(
    port: int,
    host: str,
    service: str,
    readiness: Readiness,
    streams: stream_gauges.StreamObserver | None,
) -> asyncio.Server:
    """Serve /metrics, /healthz and /readyz → the server; raises ConfigError when it cannot listen."""
    # the package's version is looked up on disk (importlib.metadata scans sys.path): off the loop,
    # which may already run other services' consumers (several services in one process)
    await asyncio.to_thread(metrics.set_build_info, service)
    try:
        return await metrics.serve_http(
            port,
            ready=readiness,
            host=host,
            before_scrape=streams.refresh if streams is not None else None,
        )
    except OSError as exc:  # cannot heal by restarting: a configuration error
        raise ConfigError(
            f"cannot serve /metrics, /healthz and /readyz on {host}:{port} "
            "(AGENTSTREAM_METRICS_HOST, AGENTSTREAM_METRICS_PORT): "
            f"{exc.strerror or exc}"
        ) from None


async def _until_stopped_or_failed(
    tasks: list[asyncio.Task], stop: asyncio.Event
) -> list[tuple[str, BaseException | None]]:
    """Wait until ``stop`` is set or a consumer's task ends → the consumers that stopped by
    themselves or with an error (name, error or None)."""
    failures: list[tuple[str, BaseException | None]] = []
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    for task in done:
        if task is waiter:
            continue
        error = task.exception()
        if error is None and stop.is_set():
            continue  # it returned because the service is stopping
        if error is not None:
            log.error("consumer %s stopped with an error; stopping the service", task.get_name(), exc_info=error)
        else:
            log.error("consumer %s stopped by itself; stopping the service", task.get_name())
        failures.append((task.get_name(), error))
    return failures


async def _drain(
    tasks: list[asyncio.Task], grace_s: float, *, reported: set[str]
) -> list[tuple[str, BaseException | None]]:
    """Let the consumers finish what they hold within ``grace_s``, then cancel the rest → the
    consumers (not in ``reported``) that stopped with an error meanwhile."""
    _, still = await asyncio.wait(tasks, timeout=grace_s)
    for task in still:
        log.warning(
            "%s did not drain within %.1f s; cancelling what it holds and releasing it to other workers",
            task.get_name(),
            grace_s,
        )
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures: list[tuple[str, BaseException | None]] = []
    for task, result in zip(tasks, results, strict=True):
        if task.get_name() not in reported and isinstance(result, Exception):
            log.error("consumer %s stopped with an error while draining", task.get_name(), exc_info=result)
            failures.append((task.get_name(), result))
    return failures


def _raise_failed(failures: list[tuple[str, BaseException | None]]) -> None:
    """Raise :class:`~agentstream.errors.ServiceFailed` for the first failure (its error chained)."""
    name, error = failures[0]
    what = f"{type(error).__name__}: {error}" if error is not None else "it returned before the service was stopped"
    raise ServiceFailed(
        f"consumer {name} stopped ({what}); the service stopped so that it is restarted"
        + (f" ({len(failures) - 1} more consumer(s) failed too)" if len(failures) > 1 else "")
    ) from error
