"""``agentstream serve compaction``: the consumer of the compactions stream. Scale it by running
more processes; the summary model is AGENTSTREAM_COMPACTION_MODEL (default: each agent's own)."""

from __future__ import annotations

import functools

import httpx

from agentstream.declarations.apps import App
from agentstream.errors import ConfigError
from agentstream.models import ChatModel, build_models
from agentstream.models.endpoints import load_endpoints
from agentstream.ops.settings import Settings
from agentstream.runtime.consumer import StreamConsumer, partition_consumers
from agentstream.runtime.store import TraceStore
from agentstream.wire.keys import COMPACTION_GROUP
from agentstream_services.compaction.compactor import Compactor


def build(
    app: App,
    settings: Settings,
    store: TraceStore,
    http: httpx.AsyncClient,
    *,
    models: dict[str, ChatModel] | None = None,
) -> tuple[Compactor, list[StreamConsumer]]:
    """The compactor and its consumers (one per partition); ``models`` (endpoint id → model) replaces the configured endpoints.

    Raises:
        ConfigError: no model endpoint is configured, or AGENTSTREAM_COMPACTION_MODEL names an
            endpoint that is not.
    """
    endpoints = load_endpoints(settings) if models is None else None
    names = endpoints if endpoints is not None else models or {}
    if settings.compaction_model is not None and settings.compaction_model not in names:
        known = ", ".join(sorted(names))
        raise ConfigError(
            f"AGENTSTREAM_COMPACTION_MODEL names model {settings.compaction_model!r}, which is not configured (models: {known})"
        )
    if models is None:
        assert endpoints is not None  # loaded above when no models were given
        models = build_models(
            endpoints,
            client=http,
            timeout_s=settings.model_timeout_s,
            retries=settings.model_retries,
            deadline_s=settings.model_deadline_s,
        )
    compactor = Compactor(
        app,
        store,
        models,
        summary_model=settings.compaction_model,
        limits=settings.wire_limits,
        fold_cache_bytes=settings.fold_cache_budget_bytes(),
    )
    stream = settings.keys.compactions
    consumers = partition_consumers(
        store.redis,
        settings,
        stream=stream,
        group=COMPACTION_GROUP,
        handler=lambda name: functools.partial(compactor.on_job, stream=name),
        per_stream=True,  # a report names the partition
        on_dead_letter=compactor.on_dead_job,
    )
    return compactor, consumers
