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

import h11
import uvicorn
from fastapi import FastAPI
from sse_starlette.sse import AppStatus
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentstream.declarations.apps import App
from agentstream.errors import ConfigError
from agentstream.models.endpoints import load_endpoints
from agentstream.ops import metrics
from agentstream.ops.apikeys import load_keys
from agentstream.ops.settings import Settings
from agentstream.runtime.store import TraceStore
from agentstream_services.gateway.api import create_api
from agentstream_services.gateway.perimeter import HeadCounter, header_block_answer
from agentstream_services.gateway.settings import GatewaySettings

log = logging.getLogger("agentstream.gateway")


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: the service's runner owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


DRAIN_S = 2.0
"""How long a connection whose request was refused for its header block is still read (and its
bytes dropped) before it is closed: closing at once, with the rest of the request unread, resets
the connection, and the client may lose the answer."""


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the two timeouts it lacks (issue 33: six slow-header
    connections stayed open 70 s, an idle one 80 s), and the header block's limit:

    - a connection that has no request in progress, a new one too, is closed after
      ``idle_timeout_s`` without a byte (uvicorn arms its keep-alive timer only after a response);
    - a request's headers must be whole within ``header_timeout_s`` of its first byte (uvicorn
      disarms every timer at each byte, so one byte every few seconds held a connection for ever);
    - a request whose header block (request line and headers, as received, to the blank line
      that ends them) is over ``max_header_bytes`` is answered 431 with a JSON reason and the
      connection closed, before any route or the key is looked at
      (:class:`~agentstream_services.gateway.perimeter.HeadCounter`). uvicorn's own limit,
      ``h11_max_incomplete_event_size``, only bounds what is still buffered: a block that
      arrived whole in one read (up to 64 KiB) passed it.
    """

    header_timeout_s = 10.0
    idle_timeout_s = 5.0
    max_header_bytes = 16_384

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._head = HeadCounter(self.max_header_bytes)
        self._refused = False
        self.timeout_keep_alive_task = self.loop.call_later(self.idle_timeout_s, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # the rest of a refused request: read and dropped, so the answer is not lost to a reset
            return
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # a request's head
            state, _ = self._head.feed(data)
            if state == "over":
                self._refuse_head(self._head.refusal or "the request's header block is over the limit")
                return
        super().data_received(data)
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            self._disarm_header_deadline()
        elif self._header_deadline is None:  # a request begun, its headers not whole yet
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def on_response_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _refuse_head(self, reason: str) -> None:
        self.logger.warning("refusing a request: %s", reason)
        self._disarm_header_deadline()
        self._refused = True
        self.transport.write(header_block_answer(reason))
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then FIN; closing with unread bytes would send a reset
        self.loop.call_later(DRAIN_S, self.transport.close)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.warning("closing a connection whose request headers took more than %g s", self.header_timeout_s)
            self.transport.close()


def guarded_protocol(gateway: GatewaySettings) -> type[H11Protocol]:
    """The HTTP protocol class of the gateway's server, with its header and idle timeouts and its
    header block limit."""
    return type(
        "GatewayH11",
        (_GuardedH11,),
        {
            "header_timeout_s": gateway.header_timeout_s,
            "idle_timeout_s": gateway.idle_timeout_s,
            "max_header_bytes": gateway.max_header_bytes,
        },
    )


class GatewayRunner:
    """Serves the gateway's ASGI app until ``stop`` is set, then lets open requests finish.

    Attributes:
        stream: partition 0 of the turns stream it publishes on (its name in logs and tasks).
        streams: every partition of the turns stream (``Keys.partitions_of``), what the
            service's stream gauges observe (length, and the agent loop's pending entries, lag
            and live consumers, labelled by partition stream).
        redis: its Redis client.
        port: the port it listens on (the real one once started, when configured as 0).
        connections: ``(blocking reads at once, handlers)`` for the start-up check of the pool
            (:func:`agentstream.runtime.runner.runner_connections`): each event stream or
            long-poll holds one blocking read, and at most ``AGENTSTREAM_GATEWAY_MAX_STREAMS`` are
            open at once (the rest are refused with 429).
    """

    def __init__(self, api: FastAPI, store: TraceStore, gateway: GatewaySettings, *, grace_s: float = 30.0):
        self.api = api
        self.redis = store.redis
        self.stream = store.keys.turns
        self.streams = store.keys.partitions_of(store.keys.turns)
        self.gateway = gateway
        self.port = gateway.port
        self.connections = (gateway.max_streams, 0)
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
            http=guarded_protocol(gateway),
            timeout_keep_alive=gateway.idle_timeout_s,  # type: ignore[arg-type]  # a float works (call_later)
            limit_concurrency=gateway.max_connections,  # past it: 503
            h11_max_incomplete_event_size=gateway.max_header_bytes,  # a backstop: the protocol answers 431 first
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
