"""What the agent loops started with, recorded in Redis for ``trace verify`` (runtime: Redis commands).

A model call's fingerprint is the sha256 of the request body as sent, and the body depends on
the app (its agents, prompts and tools) and on the model endpoint's settings (provider, model,
streaming, window, characters per token, quirks, extra body). A person who runs ``agentstream
trace verify`` in another shell rarely has the same environment as the services, and without it
every rebuilt body differs. So each agent loop, when it starts, records its app path and its
endpoints' settings in one hash of the namespace (:attr:`agentstream.wire.keys.Keys.service_settings`),
one field per distinct record (its digest), and ``trace verify`` and ``trace explain`` rebuild
with them when nothing else is configured.

What is kept of an endpoint is what decides a request body (see
:func:`agentstream.steps.replay.endpoint_settings`): never its API key, never its headers' values, and
its base URL with any user-info masked (:func:`agentstream.ops.redact.redact_url`).

At most :data:`RECORDS_KEPT` records are kept; a start that writes a new one drops the oldest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentstream.errors import AgentStreamError
from agentstream.models.endpoints import ModelEndpoint, Quirks
from agentstream.ops.redact import redact_url
from agentstream.wire.keys import Keys

RECORDS_KEPT = 20
"""How many distinct records (app and endpoint settings) the hash keeps, newest by start time."""

_ENDPOINT_FIELDS = (
    "id",
    "provider",
    "base_url",
    "model",
    "window_tokens",
    "chars_per_token",
    "stream",
    "thinking_budget_tokens",
    "anthropic_version",
    "extra_body",
    "timeout_s",
    "retries",
    "inline_tool_schemas",
)
"""The endpoint fields kept (the API key, its variable's name and the headers are not)."""


@dataclass(frozen=True)
class ServiceSettings:
    """One record: the app path an agent loop served and its endpoints, and when it last started.

    Attributes:
        app: the app as ``module:attribute`` (``agentstream serve --app``).
        endpoints: endpoint id → its settings (no key, no headers, base URL masked).
        started_ms: the newest start with these settings, Unix ms.
        digest: the record's sha256 (of the app and endpoints, not the time): its field in the hash.
    """

    app: str
    endpoints: Mapping[str, ModelEndpoint]
    started_ms: int
    digest: str


def endpoint_record(endpoint: ModelEndpoint) -> dict[str, Any]:
    """An endpoint → the JSON-able settings that decide its request bodies."""
    record = {name: getattr(endpoint, name) for name in _ENDPOINT_FIELDS}
    record["base_url"] = redact_url(endpoint.base_url)
    record["extra_body"] = dict(endpoint.extra_body)
    record["quirks"] = endpoint.quirks.model_dump(exclude_defaults=True)
    return record


def endpoint_from_record(record: Mapping[str, Any]) -> ModelEndpoint:
    """The inverse of :func:`endpoint_record` (fields a newer agentstream added are ignored)."""
    known = {f.name for f in dataclasses.fields(ModelEndpoint)}
    values = {k: v for k, v in record.items() if k in known and k != "quirks"}
    return ModelEndpoint(**values, quirks=Quirks(**record.get("quirks", {})))


def _content(app: str, endpoints: Mapping[str, ModelEndpoint]) -> dict[str, Any]:
    return {"app": app, "endpoints": {eid: endpoint_record(e) for eid, e in sorted(endpoints.items())}}


async def record(
    redis, keys: Keys, app: str, endpoints: Mapping[str, ModelEndpoint], *, now_ms: int | None = None
) -> str:
    """Record that an agent loop started with ``app`` and ``endpoints`` → the record's digest.

    The same settings started again update their record's time; past :data:`RECORDS_KEPT`
    records, the oldest are deleted.
    """
    content = _content(app, endpoints)
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    started_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    await redis.hset(keys.service_settings, digest, json.dumps({**content, "started_ms": started_ms}, sort_keys=True))
    if await redis.hlen(keys.service_settings) > RECORDS_KEPT:
        old = await recorded(redis, keys)
        stale = [r.digest for r in old[RECORDS_KEPT:]]
        if stale:
            await redis.hdel(keys.service_settings, *stale)
    return digest


async def recorded(redis, keys: Keys) -> list[ServiceSettings]:
    """Every record, newest start first (a field that cannot be read is skipped)."""
    out = []
    for field, value in (await redis.hgetall(keys.service_settings)).items():
        try:
            data = json.loads(value)
            endpoints = {eid: endpoint_from_record(e) for eid, e in data["endpoints"].items()}
            out.append(
                ServiceSettings(
                    app=data["app"],
                    endpoints=endpoints,
                    started_ms=int(data["started_ms"]),
                    digest=field.decode() if isinstance(field, bytes) else field,
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError, AgentStreamError):
            continue  # written by another version, or not by agentstream
    out.sort(key=lambda r: r.started_ms, reverse=True)
    return out
