"""Running consumers as a service process: signals, graceful drain, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import Protocol

from agentstream import metrics
from agentstream.errors import ServiceFailed

log = logging.getLogger("agentstream.service")


class Runner(Protocol):
    """What a service runs: a consumer or a listener of one stream."""

    stream: str

    async def run(self, stop: asyncio.Event) -> None: ...


async def run_consumers(
    consumers: Sequence[Runner],
    *,
    stop: asyncio.Event | None = None,
    grace_s: float = 30.0,
    metrics_port: int = 0,
    metrics_interval_s: float = 15.0,
    handle_signals: bool = True,
) -> None:
    """Run consumers until ``stop`` is set or SIGTERM/SIGINT arrives, then drain.

    On stop, consumers take no new entries and finish what they hold within ``grace_s``
    seconds; what is still running after that is cancelled and released: it stays pending in
    its group, marked idle so another worker claims it at once (nothing is acknowledged that
    did not finish), and a trace lease it held is given back.

    A consumer that stops with an error (or returns before ``stop``) stops the others the same
    way, and then :class:`~agentstream.errors.ServiceFailed` is raised (the error chained), so
    the process exits non-zero and an orchestrator restarts it.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
    server = None
    if metrics_port:
        server = await metrics.serve_http(metrics_port, ready=lambda: not stop.is_set())
    tasks = [asyncio.create_task(c.run(stop), name=f"consume:{c.stream}") for c in consumers]
    observer = None
    if metrics_port and consumers:
        observer = asyncio.create_task(
            metrics.observe_streams(consumers[0].redis, sorted({c.stream for c in consumers}), interval_s=metrics_interval_s, stop=stop)
        )
    failures: list[tuple[str, BaseException | None]] = []
    try:
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
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
        stop.set()
        waiter.cancel()
        _, still = await asyncio.wait(tasks, timeout=grace_s)
        for task in still:
            log.warning("%s did not drain within %.1f s; cancelling what it holds and releasing it to other workers", task.get_name(), grace_s)
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        reported = {name for name, _ in failures}
        for task, result in zip(tasks, results):
            if task.get_name() not in reported and isinstance(result, Exception):
                log.error("consumer %s stopped with an error while draining", task.get_name(), exc_info=result)
                failures.append((task.get_name(), result))
    finally:
        if observer is not None:
            observer.cancel()
            await asyncio.gather(observer, return_exceptions=True)
        if server is not None:
            server.close()
            await server.wait_closed()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
    if failures:
        name, error = failures[0]
        what = f"{type(error).__name__}: {error}" if error is not None else "it returned before the service was stopped"
        raise ServiceFailed(
            f"consumer {name} stopped ({what}); the service stopped so that it is restarted"
            + (f" ({len(failures) - 1} more consumer(s) failed too)" if len(failures) > 1 else "")
        ) from error
