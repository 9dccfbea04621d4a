from __future__ import annotations

import pytest

from tests.support.redis_server import sync_client


@pytest.fixture
def client(redis_url):
    """A plain (sync) Redis client, as another backend would use."""
    c = sync_client(redis_url)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _no_blocking_calls_in_the_event_loop(blocking_calls):
    """Every test here fails on a blocking call of the package in the event loop (tests/conftest.py)."""
    yield blocking_calls
