"""The HTTP gateway's own settings (pydantic-settings), read once at startup.

Variables (all optional but the keys):

- ``AGENTSTREAM_GATEWAY_KEYS_FILE``: the API keys file (YAML or JSON, mounted from a Secret):
  each key's name, SHA-256 and agents (see :mod:`agentstream.ops.apikeys`).
- ``AGENTSTREAM_GATEWAY_KEYS``: the same document inline (for compose or a laptop).
- ``AGENTSTREAM_GATEWAY_HOST`` / ``AGENTSTREAM_GATEWAY_PORT``: where it listens (``0.0.0.0:8080``).
- ``AGENTSTREAM_GATEWAY_RATE_LIMIT_PER_MIN``: requests one key may make per minute, across
  every replica (counted in Redis); 0 = no limit. A streaming request counts once.
- ``AGENTSTREAM_GATEWAY_CORS_ORIGINS``: comma-separated origins allowed to call the API from a
  browser page of another origin; empty (the default): CORS off, only same-origin pages (the
  console) can call it.
- ``AGENTSTREAM_GATEWAY_MAX_WAIT_S``: the longest a long-poll for a reply may wait, in seconds.
- ``AGENTSTREAM_GATEWAY_MAX_BODY_BYTES``: the largest request body accepted, in bytes.
- ``AGENTSTREAM_GATEWAY_SSE_PING_S``: seconds between keep-alive comments on an event stream.
- ``AGENTSTREAM_GATEWAY_CONSOLE``: serve the web console on ``/`` (default true).

Its server's limits (each replica's), with their defaults:

- ``AGENTSTREAM_GATEWAY_HEADER_TIMEOUT_S`` (10): a request's headers must be whole within this
  many seconds of its first byte, or the connection is closed.
- ``AGENTSTREAM_GATEWAY_IDLE_TIMEOUT_S`` (5): a connection with no request in progress (a new
  one too) is closed after this many seconds.
- ``AGENTSTREAM_GATEWAY_MAX_CONNECTIONS`` (1000): connections (or requests in progress) past
  which a request is answered 503.
- ``AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES`` (16384): the most bytes of a request's header block:
  its request line and headers as received, to and with the blank line that ends them (431
  Request Header Fields Too Large past it, with a JSON ``detail``, before the key is looked at).
- ``AGENTSTREAM_GATEWAY_MAX_STREAMS`` (256) and ``AGENTSTREAM_GATEWAY_MAX_STREAMS_PER_KEY`` (32):
  event streams and long-polls open at once, in all and per key (429 past either: each holds a
  Redis connection while it waits).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """The gateway's settings; see the module docstring for the variables."""

    model_config = SettingsConfigDict(env_prefix="AGENTSTREAM_GATEWAY_", extra="ignore", frozen=True)

    keys_file: str | None = None
    keys: str | None = Field(default=None, repr=False)
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    rate_limit_per_min: int = Field(default=600, ge=0)
    cors_origins: str = ""
    max_wait_s: float = Field(default=60.0, gt=0, le=3600)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    sse_ping_s: float = Field(default=15.0, gt=0)
    console: bool = True
    header_timeout_s: float = Field(default=10.0, gt=0)
    idle_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    max_header_bytes: int = Field(default=16_384, ge=1024)
    max_streams: int = Field(default=256, ge=1)
    max_streams_per_key: int = Field(default=32, ge=1)

    @property
    def cors_origin_list(self) -> list[str]:
        """The CORS origins, parsed (empty: CORS off)."""
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]
