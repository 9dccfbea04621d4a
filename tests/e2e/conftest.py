from __future__ import annotations

import pytest

from tests.support.redis_server import sync_client


@pytest.fixture
def client(redis_url):
    """A plain (sync) Redis client, as another backend would use."""
    c = sync_client(redis_url)
    yield c
    c.close()
