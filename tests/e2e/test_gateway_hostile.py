"""The gateway's perimeter against hostile clients, over real sockets to ``agentstream serve
gateway`` as a separate OS process (issue 33, items 3, 6 and 7): huge bodies with and without a
key on every route, slow headers, idle connections, many streams."""

from __future__ import annotations

import select
import socket
import uuid

import pytest

from tests.support.gateway import CALC_KEY, start_gateway
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
        for auth in (b"", b"Authorization: Bearer ask_wrong\r\n"):
            head = (
                (
                    f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {400 * 1024 * 1024}\r\n"
                ).encode()
                + auth
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
    for method, path in [("POST", "/v1/turns"), ("POST", "/v1/traces/h-1/cancel")]:  # the routes that read a body
        chunked = (
            (
                f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n"
            ).encode()
            + key
            + b"\r\n"
        )
        status, sent = _send_until_answered(address, chunked, body_bytes=400 * 1024 * 1024, chunked=True)
        assert status == 413 and sent < 16 * 1024 * 1024, (method, path, status, sent)
