from __future__ import annotations

import pytest
import redis as redis_sync


@pytest.fixture
def client(redis_url):
    """A plain (sync) Redis client, as another backend would use."""
    c = redis_sync.Redis.from_url(redis_url)
    yield c
    c.close()
