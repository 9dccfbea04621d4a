"""``agentstream serve tool-worker``: a consumer of one or more tool queues."""

from __future__ import annotations

from collections.abc import Sequence

from agentstream.app import App
from agentstream.consumer import StreamConsumer
from agentstream.keys import TOOL_WORKER_GROUP
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.tool_worker.worker import ToolWorker


def build(app: App, settings: Settings, store: TraceStore, queues: Sequence[str] | None = None) -> tuple[ToolWorker, list[StreamConsumer]]:
    """The tool worker and one consumer per tool queue (default: every queue the app uses)."""
    worker = ToolWorker(app, store)
    keys = settings.keys
    config = settings.consumer_config()
    consumers = [
        StreamConsumer(
            store.redis,
            stream=keys.tools(queue),
            group=TOOL_WORKER_GROUP,
            consumer=settings.consumer,
            handler=worker.on_job,
            dead_stream=keys.dead(keys.tools(queue)),
            config=config,
        )
        for queue in (queues or app.tool_queues or ["default"])
    ]
    return worker, consumers
