"""MCP server catalogs in Redis (runtime: Redis commands): the tool workers write them, the agent
loop reads them.

One string key per server (:meth:`agentstream.wire.keys.Keys.mcp_catalog`) holds the last
:class:`~agentstream.steps.offers.Catalog` a tool worker of that server read; every worker of
the pool writes the same listing, so the last write wins harmlessly. It carries names,
descriptions and schemas only: never a header, an environment value or a URL's credentials.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import redis.asyncio as aioredis

from agentstream.steps.offers import Catalog
from agentstream.wire.keys import Keys

log = logging.getLogger("agentstream.mcp")

_decoder = msgspec.json.Decoder(Catalog)


async def publish_catalog(redis: aioredis.Redis, keys: Keys, catalog: Catalog) -> None:
    """Store ``catalog`` as its server's current one: SET of its JSON on ``Keys.mcp_catalog``
    (no expiry; the last write wins).

    Raises:
        redis.exceptions.RedisError: as redis-py raises it (the caller logs and retries).
    """
    await redis.set(keys.mcp_catalog(catalog.server), msgspec.json.encode(catalog))


async def read_catalogs(redis: aioredis.Redis, keys: Keys, servers: Sequence[str]) -> dict[str, Catalog | None]:
    """The current catalog of each server by name (None: none published, or unreadable, which is
    logged): one GET per server in one pipeline without a transaction.

    Raises:
        redis.exceptions.RedisError: as redis-py raises it.
    """
    if not servers:
        return {}
    # one GET each in a pipeline, not MGET: the catalogs' keys lie in different hash slots of a
    # Redis Cluster (a pipeline is still one round trip per node)
    pipe = redis.pipeline(transaction=False)
    for name in servers:
        pipe.get(keys.mcp_catalog(name))
    raw = await pipe.execute()
    out: dict[str, Catalog | None] = {}
    for name, value in zip(servers, raw, strict=True):
        if value is None:
            out[name] = None
            continue
        try:
            out[name] = _decoder.decode(value)
        except msgspec.DecodeError as exc:
            log.error(
                "the catalog of MCP server %r in %s is not readable (%s); ignoring it until a tool worker writes it again",
                name,
                keys.mcp_catalog(name),
                exc,
            )
            out[name] = None
    return out
