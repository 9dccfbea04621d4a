"""The gateway's perimeter against hostile clients, over real sockets to ``agentstream serve
gateway`` as a separate OS process (issue 33, items 3, 6 and 7): huge bodies with and without a
key on every route, slow headers, idle connections, many streams."""

from __future__ import annotations

import json
import select
import socket
import time
import uuid

import pytest

from tests.support.gateway import CALC_KEY, PLAN_KEY, auth, start_gateway
from tests.support.procs import Services

pytestmark = pytest.mark.e2e

LIMIT = 65_536
ROUTES = [
    ("POST", "/v1/turns"),
    ("POST", "/v1/traces/h-1/cancel"),
    ("GET", "/v1/traces/h-1"),
    ("GET", "/v1/traces/h-1/turns/t/reply?timeout_s=0"),
    ("GET", "/v1/traces/h-1/stream"),
    ("GET", "/v1/traces/h-1/explain?step=0"),
    ("GET", "/v1/conversations"),
    ("GET", "/v1/agents"),
    ("GET", "/v1/dead-letters"),
]


@pytest.fixture(scope="module")
def gateway(redis_url, tmp_path_factory):
    services = Services(
        redis_url=redis_url,
        namespace=f"gh-{uuid.uuid4().hex[:8]}",
        model_url="http://127.0.0.1:9",  # no model is called
        log_dir=tmp_path_factory.mktemp("gateway-hostile-logs"),
    )
    url = start_gateway(
        services,
        env={
            "AGENTSTREAM_GATEWAY_MAX_BODY_BYTES": str(LIMIT),
            "AGENTSTREAM_GATEWAY_HEADER_TIMEOUT_S": "2",
            "AGENTSTREAM_GATEWAY_IDLE_TIMEOUT_S": "2",
            "AGENTSTREAM_GATEWAY_MAX_STREAMS_PER_KEY": "3",
        },
    )
    host, port = url.removeprefix("http://").split(":")
    yield services, (host, int(port))
    services.stop_all()


def _status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _send_until_answered(address, head: bytes, *, body_bytes: int, chunked: bool) -> tuple[int, int]:
    """Send ``head`` then up to ``body_bytes`` of body in 64 KiB pieces, stopping once the server
    answers or closes → (the answer's status, 0 when none; the body bytes sent before it)."""
    piece = b"x" * 65_536
    sent = 0
    answer = b""
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(head)
        while sent < body_bytes:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                answer = sock.recv(65_536)
                break
            data = (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        if not answer:
            try:
                answer = sock.recv(65_536)
            except ConnectionResetError:
                answer = b""
    return _status(answer), sent


def test_a_400_mb_body_without_a_key_is_refused_before_it_is_read_on_every_route(gateway):
    _, address = gateway
    for method, path in ROUTES:
        for wrong in (b"", b"Authorization: Bearer ask_wrong\r\n"):
            head = (
                (
                    f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {400 * 1024 * 1024}\r\n"
                ).encode()
                + wrong
                + b"\r\n"
            )
            status, sent = _send_until_answered(address, head, body_bytes=400 * 1024 * 1024, chunked=False)
            assert status == 401, (method, path, status)
            assert sent < 16 * 1024 * 1024, (method, path, sent)  # what the sockets' buffers took, not 400 MB


def test_a_body_over_the_limit_with_a_key_is_413_while_it_streams_on_every_route(gateway):
    _, address = gateway
    key = f"Authorization: Bearer {CALC_KEY}\r\n".encode()
    for method, path in ROUTES:
        declared = (
            (
                f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                f"Content-Length: {400 * 1024 * 1024}\r\n"
            ).encode()
            + key
            + b"\r\n"
        )
        status, sent = _send_until_answered(address, declared, body_bytes=400 * 1024 * 1024, chunked=False)
        assert status == 413 and sent < 16 * 1024 * 1024, (method, path, status, sent)
    # the routes that read a body, and an event stream (whose server listens for the client's end)
    for method, path in [("POST", "/v1/turns"), ("POST", "/v1/traces/h-1/cancel"), ("GET", "/v1/traces/h-1/stream")]:
        chunked = (
            (
                f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n"
            ).encode()
            + key
            + b"\r\n"
        )
        status, sent = _send_until_answered(address, chunked, body_bytes=400 * 1024 * 1024, chunked=True)
        assert status in (200, 413) and sent < 16 * 1024 * 1024, (method, path, status, sent)
        assert status == 413 or path.endswith("/stream"), (method, path, status)  # a stream answers at once


def _closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closes the connection within ``wait_s`` (a read returns EOF or a reset)."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable:
        return False
    try:
        return sock.recv(65_536) == b""
    except ConnectionResetError:
        return True


def test_slow_headers_and_idle_connections_are_closed(gateway):
    _, address = gateway
    slow = [socket.create_connection(address, timeout=30) for _ in range(6)]
    idle = socket.create_connection(address, timeout=30)
    try:
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
        closed = set()
        for _ in range(120):  # a header line each 0.5 s: 60 s of trickle at most, the timeout is 2 s
            for i, sock in enumerate(slow):
                if i in closed:
                    continue
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    closed.add(i)
                    continue
                if _closed_by_server(sock, 0.5 / len(slow)):
                    closed.add(i)
            if len(closed) == len(slow):
                break
        assert closed == set(range(len(slow)))
        assert _closed_by_server(idle, 30)  # no byte sent: closed after the idle timeout, not held
    finally:
        for sock in [*slow, idle]:
            sock.close()
    with socket.create_connection(address, timeout=30) as sock:  # a prompt request is served as before
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert _status(sock.recv(65_536)) == 200


def test_event_streams_are_capped_per_key_with_429(gateway):
    import contextlib

    import httpx

    _, (host, port) = gateway
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client, contextlib.ExitStack() as held:
        for _ in range(3):
            response = held.enter_context(client.stream("GET", "/v1/traces/h-s/stream", headers=auth(CALC_KEY)))
            assert response.status_code == 200
        over = client.get("/v1/traces/h-s/stream", headers=auth(CALC_KEY))
        assert over.status_code == 429 and "AGENTSTREAM_GATEWAY_MAX_STREAMS_PER_KEY" in over.text
        with client.stream("GET", "/v1/traces/h-p/stream", headers=auth(PLAN_KEY)) as other:
            assert other.status_code == 200  # another key is not held up
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:  # the streams closed: slots free
        for _ in range(50):
            with client.stream("GET", "/v1/traces/h-s/stream", headers=auth(CALC_KEY)) as again:
                if again.status_code == 200:
                    break
            time.sleep(0.1)  # the server sees the closed streams end
        assert again.status_code == 200


def test_connections_past_the_limit_are_answered_503(redis_url, tmp_path):
    services = Services(
        redis_url=redis_url, namespace=f"gc-{uuid.uuid4().hex[:8]}", model_url="http://127.0.0.1:9", log_dir=tmp_path
    )
    try:
        url = start_gateway(
            services, env={"AGENTSTREAM_GATEWAY_MAX_CONNECTIONS": "4", "AGENTSTREAM_GATEWAY_IDLE_TIMEOUT_S": "60"}
        )
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(4)]
        try:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
                answer = sock.recv(65_536)
            assert _status(answer) == 503, answer[:200]
        finally:
            for sock in held:
                sock.close()
    finally:
        services.stop_all()


def _head_of(size: int, headers: dict[str, str], path: str = "/v1/agents") -> bytes:
    """A GET whose header block (request line, headers, the blank line) is exactly ``size`` bytes,
    padded with one ``X-Big`` header."""
    lines = [f"GET {path} HTTP/1.1", "Host: gateway", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    bare = ("\r\n".join(lines) + "\r\nX-Big: \r\n\r\n").encode()
    head = ("\r\n".join(lines) + "\r\nX-Big: " + "b" * (size - len(bare)) + "\r\n\r\n").encode()
    assert len(head) == size
    return head


def _exchange(address, data: bytes, *, pieces: int = 1) -> bytes:
    """Send ``data`` (in ``pieces`` writes) and read the answer until the server closes."""
    answer = b""
    with socket.create_connection(address, timeout=30) as sock:
        step = -(-len(data) // pieces)
        for start in range(0, len(data), step):
            try:
                sock.sendall(data[start : start + step])
            except (BrokenPipeError, ConnectionResetError):
                break
            if pieces > 1:
                time.sleep(0.05)  # separate reads on the server: the block arrives in parts
        while True:
            try:
                got = sock.recv(65_536)
            except ConnectionResetError:
                break
            if not got:
                break
            answer += got
    return answer


@pytest.mark.parametrize("pieces", [1, 4])
def test_the_header_block_limit_holds_at_every_size_before_the_key_is_looked_at(gateway, pieces):
    """AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES (16384) was enforced only past ~64 KiB (20,000 and
    60,000 bytes of one header got 200): uvicorn's limit bounds only what is still buffered. The
    whole block (request line and headers, as received) is counted, in one read or several."""
    _, address = gateway
    limit = 16_384
    for headers in (auth(CALC_KEY), {}):
        at_limit = _exchange(address, _head_of(limit, headers), pieces=pieces)
        assert _status(at_limit) == (200 if headers else 401), at_limit[:300]
        for size in (limit + 1, 20_000, 60_000, 200_000):
            answer = _exchange(address, _head_of(size, headers), pieces=pieces)
            assert _status(answer) == 431, (size, answer[:300])
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b"content-type: application/json" in head.lower() and b"x-content-type-options: nosniff" in head
            detail = json.loads(body)["detail"]
            assert "AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES=16,384" in detail, detail
    # a connection is served as before after all that
    assert _status(_exchange(address, _head_of(200, auth(CALC_KEY)))) == 200
