"""``agentstream serve compaction``: the consumer of the compactions stream. Scale it by running
more processes; the summary model is AGENTSTREAM_COMPACTION_MODEL (default: each agent's own)."""

from __future__ import annotations

import httpx

from agentstream.app import App
from agentstream.consumer import StreamConsumer, group_consumer
from agentstream.errors import ConfigError
from agentstream.keys import COMPACTION_GROUP
from agentstream.models import build_models
from agentstream.models.endpoints import load_endpoints
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.compaction.compactor import Compactor


def build(app: App, settings: Settings, store: TraceStore, http: httpx.AsyncClient) -> tuple[Compactor, list[StreamConsumer]]:
    """The compactor and its consumer.

    Raises:
        ConfigError: no model endpoint is configured, or AGENTSTREAM_COMPACTION_MODEL names an
            endpoint that is not.
    """
    endpoints = load_endpoints(settings)
    if settings.compaction_model is not None and settings.compaction_model not in endpoints:
        known = ", ".join(sorted(endpoints))
        raise ConfigError(f"AGENTSTREAM_COMPACTION_MODEL names model {settings.compaction_model!r}, which is not configured (models: {known})")
    models = build_models(endpoints, client=http, timeout_s=settings.model_timeout_s, retries=settings.model_retries)
    compactor = Compactor(app, store, models, summary_model=settings.compaction_model)
    stream = settings.keys.compactions
    consumer = group_consumer(
        store.redis, settings, stream=stream, group=COMPACTION_GROUP, handler=compactor.on_job,
        on_dead_letter=compactor.on_dead_job,
    )
    return compactor, [consumer]
