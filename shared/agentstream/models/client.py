"""The HTTP client the model adapters share in a process: httpx, with a pool that keeps a
connection per call in flight and a network stream that costs little per request.

With httpx's defaults a busy agent loop paid for its model calls twice over (issue 35: 3.1 ms of
CPU per call over loopback, more than the rest of a step):

- the pool kept 20 idle connections, so at 64 calls at once 44 connections were closed after
  each answer and opened again for the next call (a name lookup in a worker thread, a TCP
  handshake): :func:`model_client` keeps as many as calls run at once;
- httpcore asks each pooled connection's stream, before every request, whether its socket is
  readable (a server that closed it), which anyio answers by building a dict of the socket's
  attributes each time; and it writes a request's head and body in two sends. The stream here
  (:class:`CoalescingStream`, around httpcore's own) keeps the socket, and sends what a request
  writes in one send, when the response is first read.

``bench/model_call.py`` measures the CPU per call with httpx's defaults and with this client.
"""

from __future__ import annotations

import select
import socket
import ssl
import typing

import httpcore
import httpx

DEFAULT_KEEPALIVE_EXPIRY_S = 60.0
"""How long an idle connection to a model server is kept, in seconds (httpx's default is 5: a
turn's tools often take longer than that between two model calls)."""


def _readable(sock: socket.socket | None) -> bool:
    """Whether an idle connection's socket has something to read, which for a connection with
    no request in flight means its server closed it (httpcore's own check, on the socket kept)."""
    if sock is None or sock.fileno() < 0:
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])  # pragma: no cover - Windows


class CoalescingStream(httpcore.AsyncNetworkStream):
    """httpcore's network stream, whose writes are held until the next read (or close), then
    sent in one write; and whose socket is looked up once, not at each question httpcore asks.

    HTTP/1.1 writes a whole request before it reads its response, so a request leaves in one
    send. A write error then surfaces on the read that sends it (``httpcore.WriteError``, an
    ``httpx.TransportError`` as before: retried by :func:`agentstream.models.http.with_retries`).
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream):
        self._inner = inner
        self._socket = inner.get_extra_info("socket")
        self._held: list[bytes] = []
        self._held_timeout: float | None = None

    async def _send_held(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            await self._inner.write(data, timeout=self._held_timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._send_held()
        return await self._inner.read(max_bytes, timeout=timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._held.append(buffer)
            self._held_timeout = timeout

    async def aclose(self) -> None:
        self._held.clear()
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._send_held()  # a proxy's CONNECT is answered before TLS starts
        return CoalescingStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "socket":
            return self._socket
        if info == "is_readable":
            return _readable(self._socket)
        return self._inner.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """A network backend (httpcore's own, as its pool made it) whose streams are wrapped in
    :class:`CoalescingStream`."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend):
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return CoalescingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return CoalescingStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


SHARD_CONNECTIONS = 8
"""Calls in flight per pool of :class:`ShardedTransport` (on average): httpcore's pool looks at
every connection it holds, for every connection, each time a request comes or goes (httpcore
1.0: 18,600 checks a call at 64 connections, 5.2 ms of CPU a call over loopback); in pools of 8
that work is 64 times smaller."""


class ShardedTransport(httpx.AsyncBaseTransport):
    """Requests spread in turn over several httpx transports (pools of connections), each with
    its share of the calls in flight; see :data:`SHARD_CONNECTIONS`.

    Args:
        transports: the pools, each an ``httpx.AsyncHTTPTransport``.
    """

    def __init__(self, transports: list[httpx.AsyncBaseTransport]):
        if not transports:
            raise ValueError("ShardedTransport needs at least one transport")
        self._transports = transports
        self._next = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self._transports[self._next]
        self._next = (self._next + 1) % len(self._transports)
        return await transport.handle_async_request(request)

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()


def model_client(
    *, concurrency: int = 64, keepalive_expiry_s: float = DEFAULT_KEEPALIVE_EXPIRY_S, coalesce: bool = True
) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` for model calls (close it with ``aclose``): a connection kept
    open for each call in flight, in pools of about :data:`SHARD_CONNECTIONS`.

    Args:
        concurrency: the model calls that run at once (``AGENTSTREAM_CONCURRENCY`` summed over
            the consumers that call models): that many connections stay open between calls.
        keepalive_expiry_s: how long an idle connection stays open, in seconds.
        coalesce: send each request in one write (:class:`CoalescingStream`).

    Raises:
        ValueError: ``concurrency`` below 1 or ``keepalive_expiry_s`` negative.
    """
    if concurrency < 1:
        raise ValueError(f"model_client: concurrency must be at least 1, not {concurrency}")
    if keepalive_expiry_s < 0:
        raise ValueError(f"model_client: keepalive_expiry_s must be 0 or more, not {keepalive_expiry_s}")
    shards = -(-concurrency // SHARD_CONNECTIONS)
    # httpcore closes an idle connection whenever its pool holds more than this many (in use or
    # not): at least every call in flight, so none is closed only to be opened again
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=concurrency, keepalive_expiry=keepalive_expiry_s
    )
    # one TLS context for every pool: each would load the CA bundle again (0.1 s; 0.8 s for 8 pools
    # on a loaded machine, which held up a service's start)
    verify = httpx.create_ssl_context()  # what each transport would make for itself
    transports: list[httpx.AsyncBaseTransport] = []
    for _ in range(shards):
        transport = httpx.AsyncHTTPTransport(limits=limits, verify=verify)
        if coalesce:
            pool = transport._pool  # httpx's pool (private): given the backend below, as httpcore's signature allows
            pool._network_backend = CoalescingBackend(pool._network_backend)
        transports.append(transport)
    return httpx.AsyncClient(transport=ShardedTransport(transports), limits=limits)
