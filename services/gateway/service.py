"""``agentstream serve gateway``: the HTTP gateway and its web console (uvicorn).

It runs under :func:`agentstream.runtime.runner.run_consumers` like the other services (SIGTERM drains
it, ``AGENTSTREAM_METRICS_PORT`` serves ``/metrics``), and answers ``/healthz`` and ``/readyz``
on its own port too. It holds no state: run as many replicas as you like.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import uvicorn
from fastapi import FastAPI
from sse_starlette.sse import AppStatus

from agentstream.declarations.apps import App
from agentstream.errors import ConfigError
from agentstream.models.endpoints import load_endpoints
from agentstream.ops import metrics
from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.runtime.store import TraceStore
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.settings import GatewaySettings

log = logging.getLogger("agentstream.gateway")


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: the service's runner owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


class GatewayRunner:
    """Serves the gateway's ASGI app until ``stop`` is set, then lets open requests finish.

    Attributes:
        stream: partition 0 of the turns stream it publishes on (its name in logs and tasks).
        streams: every partition of the turns stream (``Keys.partitions_of``), what the
            service's stream gauges observe (length, and the agent loop's pending entries, lag
            and live consumers, labelled by partition stream).
        redis: its Redis client.
        port: the port it listens on (the real one once started, when configured as 0).
    """

    def __init__(self, api: FastAPI, store: TraceStore, gateway: GatewaySettings, *, grace_s: float = 30.0):
        self.api = api
        self.redis = store.redis
        self.stream = store.keys.turns
        self.streams = store.keys.partitions_of(store.keys.turns)
        self.gateway = gateway
        self.port = gateway.port
        self.started = asyncio.Event()
        config = uvicorn.Config(
            api,
            host=gateway.host,
            port=gateway.port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=max(1, int(grace_s)),
            proxy_headers=True,
        )
        self.server = _Server(config)

    async def run(self, stop: asyncio.Event) -> None:
        serving = asyncio.create_task(self.server.serve())
        while not self.server.started and not serving.done():
            await asyncio.sleep(0.02)
        if self.server.started:
            sockets = [s for server in self.server.servers for s in server.sockets]
            if sockets:
                self.port = sockets[0].getsockname()[1]
            log.info("gateway listening on %s:%d", self.gateway.host, self.port)
            self.started.set()
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not serving.done():
            AppStatus.should_exit = True  # open event streams end now (clients resume with Last-Event-ID)
            self.server.should_exit = True  # requests in progress get the grace period
            await serving
        stopping.cancel()
        serving.result()  # an error starting it (port in use) fails the service


def build(
    app: App, settings: Settings, store: TraceStore, gateway: GatewaySettings | None = None
) -> tuple[FastAPI, list[GatewayRunner]]:
    """The gateway's ASGI app and its runner.

    Raises:
        ConfigError: no API keys are configured, or the keys document is not valid.
    """
    gateway = gateway or GatewaySettings()
    keyring = load_keys(text=gateway.keys, path=gateway.keys_file)
    if not keyring.keys:
        raise ConfigError("the gateway's keys document lists no keys; without one, nobody could use it")
    try:
        endpoints = load_endpoints(settings, require_keys=False)
    except ConfigError as exc:
        log.warning("no model endpoints for explain (%s): calls are rebuilt for their recorded provider", exc)
        endpoints = {}
    api = create_api(app, settings, gateway, store, keyring, endpoints=endpoints)
    _count_requests(api)
    log.info(
        "gateway: %d API key(s); rate limit %s; CORS %s",
        len(keyring.keys),
        f"{gateway.rate_limit_per_min}/min per key" if gateway.rate_limit_per_min else "off",
        ", ".join(gateway.cors_origin_list) or "off",
    )
    return api, [GatewayRunner(api, store, gateway, grace_s=settings.shutdown_grace_s)]


class _RequestMetrics:
    """ASGI middleware counting every request by route template and status (never by raw path:
    ids stay out of the labels). Pure ASGI, so event streams pass through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                route = scope.get("route")
                template = getattr(route, "path", "other") if route is not None else "other"
                metrics.GATEWAY_REQUESTS.labels(
                    method=scope["method"], route=template, status=str(status["code"])
                ).inc()
                metrics.GATEWAY_REQUEST_SECONDS.labels(route=template).observe(time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, sending)


def _count_requests(api: FastAPI) -> None:
    api.add_middleware(_RequestMetrics)
