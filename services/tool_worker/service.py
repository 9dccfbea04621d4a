"""``agentstream serve tool-worker``: a consumer of one or more tool queues."""

from __future__ import annotations

from collections.abc import Sequence

from agentstream.app import App
from agentstream.cancel import CancelListener
from agentstream.consumer import StreamConsumer, group_consumer
from agentstream.keys import TOOL_WORKER_GROUP
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.tool_worker.worker import ToolWorker


def build(
    app: App, settings: Settings, store: TraceStore, queues: Sequence[str] | None = None
) -> tuple[ToolWorker, list[StreamConsumer | CancelListener]]:
    """The tool worker, one consumer per tool queue (default: every queue the app uses) and
    its cancel listener (running calls of a cancelled turn are told)."""
    worker = ToolWorker(app, store, worker_name=settings.consumer)
    keys = settings.keys
    runners: list[StreamConsumer | CancelListener] = [
        group_consumer(
            store.redis, settings, stream=keys.tools(queue), group=TOOL_WORKER_GROUP,
            handler=worker.handler_for(keys.tools(queue)), on_dead_letter=worker.on_dead_job,
        )
        for queue in queues or app.tool_queues or ["default"]
    ]
    runners.append(CancelListener(store.redis, keys, worker.on_cancel_broadcast, block_ms=settings.block_ms))
    return worker, runners
