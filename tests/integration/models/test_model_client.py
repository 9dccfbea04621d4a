"""The model adapters' HTTP client (agentstream.models.client.model_client) against a real HTTP
server on loopback: connections kept for every call in flight and reused, each request sent in
one write, a connection the server closed while idle never used again, and a write error a
retryable transport error (issue 35, item 3)."""

from __future__ import annotations

import asyncio
import json

import httpcore
import httpx
import pytest

from agentstream.context.request import ChatRequest, UserMessage
from agentstream.models.client import CoalescingBackend, model_client
from agentstream.models.endpoints import ModelEndpoint
from agentstream.models.openai import OpenAIChatModel

pytestmark = pytest.mark.integration

ANSWER = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
).encode()
REQUEST = ChatRequest(system="s", messages=(UserMessage(text="hello " * 50),))


class Server:
    """An HTTP/1.1 server that answers every request with ANSWER after ``delay_s``, counts the
    connections it accepted, and closes each connection after one answer when ``close_after``."""

    def __init__(self, *, delay_s: float = 0.0, close_after: bool = False):
        self.delay_s = delay_s
        self.close_after = close_after
        self.connections = 0
        self.answered = 0
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://localhost:{self._server.sockets[0].getsockname()[1]}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in request.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                await asyncio.sleep(self.delay_s)
                writer.write(head + ANSWER)
                await writer.drain()
                self.answered += 1
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()


def _model(base_url: str, client: httpx.AsyncClient, retries: int = 0) -> OpenAIChatModel:
    endpoint = ModelEndpoint(id="default", provider="openai", base_url=base_url, model="m", stream=False)
    return OpenAIChatModel(endpoint, client=client, retries=retries)


async def _round(model: OpenAIChatModel, calls: int) -> None:
    outputs = await asyncio.gather(*(model.complete(REQUEST, turn_id="t", step=n) for n in range(calls)))
    assert all(output.content == "hi" for output in outputs)


async def test_every_call_in_flight_keeps_its_connection_for_the_next_round():
    async with Server(delay_s=0.05) as server:
        client = model_client(concurrency=64)
        model = _model(server.base_url, client)
        try:
            await _round(model, 64)
            opened = server.connections
            assert opened <= 64
            for _ in range(3):
                await _round(model, 64)
            assert server.connections == opened  # no connection closed and opened again
        finally:
            await client.aclose()
        # (httpx's defaults, 20 connections kept, open some again each round: 15 in the second)


class _Recording(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, whose streams' writes (what reaches the socket) are recorded."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, writes: list[bytes]):
        self._inner = inner
        self._writes = writes

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        writes = self._writes
        original = stream.write

        async def write(buffer: bytes, timeout: float | None = None) -> None:
            writes.append(buffer)
            await original(buffer, timeout)

        stream.write = write  # type: ignore[method-assign]
        return stream

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):  # pragma: no cover - not used
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - not used
        await self._inner.sleep(seconds)


async def test_each_request_leaves_in_one_write():
    async with Server() as server:
        client = model_client(concurrency=4)
        writes: list[bytes] = []
        for transport in client._transport._transports:  # type: ignore[attr-defined]
            backend = transport._pool._network_backend
            assert isinstance(backend, CoalescingBackend)
            backend._inner = _Recording(backend._inner, writes)
        model = _model(server.base_url, client)
        try:
            for n in range(5):
                await model.complete(REQUEST, turn_id="t", step=n)
        finally:
            await client.aclose()
    assert len(writes) == 5, [w[:40] for w in writes]
    assert all(w.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and w.endswith(b"}") for w in writes)
    body = json.loads(writes[0].split(b"\r\n\r\n", 1)[1])
    assert body["model"] == "m"


async def test_a_connection_the_server_closed_while_idle_is_not_used_again():
    async with Server(close_after=True) as server:
        client = model_client(concurrency=1)
        model = _model(server.base_url, client, retries=0)  # a call on the dead connection would fail
        try:
            for n in range(4):
                server.closed.clear()
                await model.complete(REQUEST, turn_id="t", step=n)
                await asyncio.wait_for(server.closed.wait(), 5)
                for _ in range(100):  # the FIN reaches the client's socket
                    await asyncio.sleep(0.005)
                    if all(
                        conn._connection is None or conn._connection.has_expired()
                        for t in client._transport._transports  # type: ignore[attr-defined]
                        for conn in t._pool.connections
                    ):
                        break
        finally:
            await client.aclose()
    assert server.answered == 4 and server.connections == 4


async def test_a_request_that_cannot_be_written_is_a_transport_error():
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # reset at once: the held request cannot be sent, nothing answers

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    client = model_client(concurrency=1)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        with pytest.raises(httpx.TransportError):
            await client.post(url, content=b"x" * 100_000)
    finally:
        await client.aclose()
        server.close()


def test_bad_settings_are_refused_with_their_name():
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        model_client(concurrency=0)
    with pytest.raises(ValueError, match="keepalive_expiry_s"):
        model_client(keepalive_expiry_s=-1)


def test_the_pools_share_one_tls_context():
    # each pool loading the CA bundle again made a client for 64 calls take 0.8 s on a loaded
    # machine, which held up a service's start past a lease a test had set
    client = model_client(concurrency=64)
    transports = client._transport._transports  # type: ignore[attr-defined]
    assert len(transports) == 8
    assert len({id(t._pool._ssl_context) for t in transports}) == 1
