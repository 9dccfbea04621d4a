"""The gateway's perimeter: what every request must pass before any route runs (pure ASGI).

- **Authentication before the body.** A request to ``/v1/...`` (but a CORS preflight) without a
  valid ``Authorization: Bearer <key>`` is answered 401 before one byte of its body is read; the
  routes' own key dependency then counts the request against the key's rate limit.
- **The body limit, while it streams.** A ``Content-Length`` over ``max_body_bytes`` is answered
  413 at once; a body without one (chunked) is counted as it arrives, and the request is answered
  413 as soon as the count passes the limit (the route never sees more than the limit). The
  connection is then closed by the server, which reads no more of it.
- **Response headers** on every answer (:data:`SECURITY_HEADERS`): no framing, no sniffing, no
  referrer beyond the origin, a content security policy that lets the console load only its own
  files; ``Cache-Control: no-store`` on the API's answers (traces, replies, conversations).

- **Open streams and long-polls** are counted per replica (:class:`OpenStreams`): past the
  replica's cap or the key's, a new one is answered 429 (each holds a Redis connection while it
  waits: one key's streams took every connection of the pool from the others).

- **A 422 does not echo the request.** A body the route's model refuses is answered with where
  and what (FastAPI's list of errors: ``loc``, ``msg``, ``type``), each error's ``input`` cut to
  :data:`ECHO_MAX_CHARS` (:func:`bounded_errors`): a 256 KB text refused as too long was sent back
  whole, once per error.

- **The header block's size** (:class:`HeadCounter`, in the server's protocol, before any route
  or the key is looked at): a request whose request line and headers, as received up to and
  including the blank line that ends them, are over ``max_header_bytes`` is answered 431 with a
  JSON ``detail`` (:func:`header_block_answer`) and its connection closed.

Nothing here touches Redis; the decisions (:func:`bearer_token`, :func:`declared_length`,
:class:`OpenStreams`, :func:`bounded_errors`, :class:`HeadCounter`) are pure.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from agentstream.ops import metrics
from agentstream.ops.apikeys import KeyRing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PREFIX = "/v1/"
"""Every route under it needs an API key."""

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
"""Headers put on every response (a route's own header of the same name wins)."""

NO_STORE = (b"cache-control", b"no-store")
"""Put on every ``/v1/...`` response that has no ``Cache-Control`` of its own: what a key may read
stays out of shared and browser caches."""


HEADER_LIMIT_SETTING = "AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES"
HEADER_BLOCK_STATUS = 431
"""Request Header Fields Too Large (RFC 6585): the answer to a header block over the limit."""


class HeadCounter:
    """Counts the bytes of a request's header block as they arrive: the request line, every
    header line and the blank line that ends them (``\r\n\r\n``, or ``\n\n``), exactly as
    received (no folding or whitespace trimmed). Pure: fed the bytes, it says whether the block
    is whole, still arriving, or over the limit.

    Args:
        limit: the most bytes a header block may have (``AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0  # bytes of the block so far
        self.refusal: str | None = None  # why, once a block was over the limit
        self._tail = b""  # the last bytes fed, for an end that spans two chunks

    def feed(self, data: bytes) -> tuple[str, int]:
        """The next bytes of the connection, while a request's head is awaited → ``("whole",
        the block's size)`` when its end is among them (at or under the limit; what follows it is
        the body or the next request), ``("more", seen so far)`` when it is not, ``("over",
        seen so far)`` once the block is over the limit (whole or not; :attr:`refusal` then
        says why). Leading empty lines (allowed between requests) count too."""
        if not data:
            return ("more", self.seen)
        window = self._tail + data
        ends = [i for i in (window.find(b"\r\n\r\n"), window.find(b"\n\n")) if i >= 0]
        if ends:
            end = min(ends)
            size = self.seen + end - len(self._tail) + (4 if window.startswith(b"\r\n\r\n", end) else 2)
            self.seen, self._tail = 0, b""
            if size > self.limit:
                self.refusal = header_block_refusal(size, self.limit, whole=True)
                return ("over", size)
            return ("whole", size)
        self.seen += len(data)
        self._tail = window[-3:]
        if self.seen > self.limit:
            self.refusal = header_block_refusal(self.seen, self.limit, whole=False)
            return ("over", self.seen)
        return ("more", self.seen)


def header_block_refusal(size: int, limit: int, *, whole: bool) -> str:
    """The reason a header block is refused (``size`` bytes seen, ``whole`` when its end was)."""
    counted = f"is {size:,} bytes" if whole else f"is more than {limit:,} bytes ({size:,} received)"
    return (
        f"the request's header block (request line and headers) {counted}, over the limit "
        f"{HEADER_LIMIT_SETTING}={limit:,}"
    )


def header_block_answer(reason: str) -> bytes:
    """The whole HTTP/1.1 answer to a header block over the limit: 431, JSON ``{"detail": reason}``,
    the security headers, ``Connection: close``."""
    body = json.dumps({"detail": reason}).encode()
    head = [
        f"HTTP/1.1 {HEADER_BLOCK_STATUS} Request Header Fields Too Large".encode(),
        b"content-type: application/json",
        f"content-length: {len(body)}".encode(),
        b"connection: close",
        *(name + b": " + value for name, value in SECURITY_HEADERS),
        NO_STORE[0] + b": " + NO_STORE[1],
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of the first ``Authorization: Bearer <token>`` header (scheme in any case), or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` as a number of bytes; None when absent.

    Raises:
        ValueError: it is not a non-negative integer, or it is given twice with different values.
    """
    found: int | None = None
    for name, value in headers:
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            if not text.isdigit():
                raise ValueError(f"Content-Length must be a number of bytes, got {text[:40]!r}")
            if found is not None and int(text) != found:
                raise ValueError("Content-Length is given twice with different values")
            found = int(text)
    return found


def too_large(size: int | str, limit: int) -> str:
    """The 413's detail: the size seen (or ``"more than"`` it) and the limit with its setting."""
    return (
        f"the body is {size} bytes, over the gateway's limit of {limit} (AGENTSTREAM_GATEWAY_MAX_BODY_BYTES); "
        "it was not read further"
    )


class Perimeter:
    """ASGI middleware: authentication before the body, the body limit while it streams, and the
    security headers (see the module docstring).

    Args:
        app: the app behind it.
        keyring: the API keys (a request to ``/v1/...`` needs one of them).
        max_body_bytes: the largest request body read, in bytes.
    """

    def __init__(self, app: ASGIApp, *, keyring: KeyRing, max_body_bytes: int) -> None:
        self.app = app
        self.keyring = keyring
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith(PROTECTED_PREFIX)
        send = _with_headers(send, api=api)
        headers = scope["headers"]
        if api and scope["method"] != "OPTIONS":
            token = bearer_token(headers)
            if token is None or self.keyring.find(token) is None:
                metrics.GATEWAY_UNAUTHORIZED.inc()
                response = JSONResponse(
                    {"detail": "a valid API key is needed: Authorization: Bearer <key>"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer", "Connection": "close"},
                )
                await response(scope, receive, send)
                return
        limit = self.max_body_bytes
        try:
            length = declared_length(headers)
        except ValueError as exc:
            await JSONResponse({"detail": str(exc)}, status_code=400, headers={"Connection": "close"})(
                scope, receive, send
            )
            return
        if length is not None and length > limit:
            await JSONResponse({"detail": too_large(length, limit)}, status_code=413, headers={"Connection": "close"})(
                scope, receive, send
            )
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            if received > limit:  # the body was cut: nothing more of it is read
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if started:  # an answer already streams (an event stream): the client is taken as gone
                        return {"type": "http.disconnect"}
                    raise HTTPException(413, too_large(f"more than {limit}", limit), headers={"Connection": "close"})
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, sending)
        except HTTPException as exc:  # raised by limited() where no handler turned it into an answer
            if exc.status_code != 413 or started:
                raise
            await JSONResponse({"detail": exc.detail}, status_code=413, headers={"Connection": "close"})(
                scope, receive, send
            )


def _with_headers(send: Send, *, api: bool) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(n, v) for n, v in SECURITY_HEADERS if n not in present]
            if api and NO_STORE[0] not in present:
                extra.append(NO_STORE)
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


class OpenStreams:
    """The event streams and long-polls this replica holds open, in all and per key.

    Args:
        limit: the most open at once in all.
        per_key: the most open at once for one key.
    """

    def __init__(self, limit: int, per_key: int) -> None:
        self.limit = limit
        self.per_key = per_key
        self.total = 0
        self.by_key: dict[str, int] = {}

    def take(self, key: str) -> str | None:
        """Count one more for ``key`` → None; or, when a cap is reached, why not (nothing counted)."""
        if self.by_key.get(key, 0) >= self.per_key:
            return (
                f"API key {key!r} has {self.per_key} event streams and long-polls open on this gateway, its limit "
                "(AGENTSTREAM_GATEWAY_MAX_STREAMS_PER_KEY); close one or retry later"
            )
        if self.total >= self.limit:
            return (
                f"this gateway has {self.limit} event streams and long-polls open, its limit "
                "(AGENTSTREAM_GATEWAY_MAX_STREAMS); retry later"
            )
        self.total += 1
        self.by_key[key] = self.by_key.get(key, 0) + 1
        return None

    def give(self, key: str) -> None:
        """One of ``key``'s ended."""
        left = self.by_key.get(key, 0) - 1
        if left > 0:
            self.by_key[key] = left
        else:
            self.by_key.pop(key, None)
        self.total = max(0, self.total - 1)


ECHO_MAX_CHARS = 120
"""The most characters of a refused value a 422 answer quotes (its ``input``, as JSON text)."""


def bounded_errors(errors: Any, max_chars: int = ECHO_MAX_CHARS) -> list[dict[str, Any]]:
    """FastAPI's validation errors (``RequestValidationError.errors()``: dicts with ``loc``,
    ``msg``, ``type``, ``input`` and maybe ``ctx``) as a 422 answers them: the shape kept, an
    ``input`` whose JSON text is longer than ``max_chars`` replaced by its first ``max_chars``
    characters followed by ``…`` and the full length, and ``ctx`` values that are not plain
    numbers, texts or booleans shown as text (an exception object is not JSON)."""
    import json

    bounded = []
    for error in errors:
        one = {k: v for k, v in dict(error).items() if k not in ("input", "ctx", "url")}
        if "input" in error:
            value = error["input"]
            if isinstance(value, (bytes, bytearray)):  # a body that is not JSON (text/plain): as text
                value = bytes(value).decode("utf-8", "replace")
            text = json.dumps(value, ensure_ascii=False, default=str)
            # the value as JSON reads it back: anything json cannot write (bytes inside, sets) is text
            one["input"] = (
                json.loads(text) if len(text) <= max_chars else f"{text[:max_chars]}… ({len(text)} characters)"
            )
        if isinstance(error.get("ctx"), dict):
            one["ctx"] = {
                k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)[:max_chars]
                for k, v in error["ctx"].items()
            }
        bounded.append(one)
    return bounded


async def validation_problem(request: Any, exc: Any) -> JSONResponse:
    """The 422 of a request the route's model refused (FastAPI's ``RequestValidationError``), with
    :func:`bounded_errors` for its ``detail``."""
    return JSONResponse(status_code=422, content={"detail": bounded_errors(exc.errors())})
