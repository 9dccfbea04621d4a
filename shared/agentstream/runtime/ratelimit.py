"""Request rate limits per API key, counted in Redis so that every gateway replica shares them.

A fixed window: requests of one key within one window of ``window_s`` seconds are counted in
``<ns>:gateway:rate:<key name>:<window number>`` (INCR, and an expiry of two windows); a request
beyond ``limit`` in a window is refused until the next one starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentstream.wire.keys import Keys


@dataclass(frozen=True)
class RateDecision:
    """The outcome of one request's count.

    Attributes:
        allowed: whether the request is within the limit.
        count: the requests of this key in the current window, this one included.
        retry_after_s: seconds until the next window starts (when refused).
    """

    allowed: bool
    count: int
    retry_after_s: int


async def hit(
    redis, keys: Keys, key_name: str, *, limit: int, window_s: int = 60, now_s: float | None = None
) -> RateDecision:
    """Count one request of ``key_name`` → whether it is allowed.

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        key_name: the API key's name.
        limit: the most requests per window; 0 or less means no limit (nothing is counted).
        window_s: the window's length, in seconds.
        now_s: the time (Unix seconds; default now).
    """
    if limit <= 0:
        return RateDecision(True, 0, 0)
    now_s = time.time() if now_s is None else now_s
    window = int(now_s // window_s)
    counter = keys.gateway_rate(key_name, window)
    pipe = redis.pipeline(transaction=False)
    pipe.incr(counter)
    pipe.expire(counter, 2 * window_s)
    count, _ = await pipe.execute()
    retry_after_s = max(1, int((window + 1) * window_s - now_s + 0.999))
    return RateDecision(int(count) <= limit, int(count), retry_after_s)
