"""``agentstream serve tool-worker``: a consumer of one or more tool queues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentstream.declarations.apps import App
from agentstream.ops.settings import Settings
from agentstream.runtime.cancel import CancelListener, cancel_listeners
from agentstream.runtime.consumer import StreamConsumer, partition_consumers
from agentstream.runtime.store import TraceStore
from agentstream.wire.keys import TOOL_WORKER_GROUP
from agentstream_services.tool_worker.worker import ToolWorker

if TYPE_CHECKING:
    from agentstream.mcp_tools.host import McpHost


def build(
    app: App, settings: Settings, store: TraceStore, queues: Sequence[str] | None = None
) -> tuple[ToolWorker, list[StreamConsumer | CancelListener | McpHost]]:
    """The tool worker, one consumer per tool queue and partition (default: every queue the app uses), its
    cancel listener (running calls of a cancelled turn are told), and the MCP servers of the
    queues it serves (:class:`agentstream.mcp_tools.host.McpHost`).

    Raises:
        ConfigError: an MCP server's transport is incomplete (no command or URL, an unset
            variable it takes a header or environment value from).
    """
    # a dead worker's call is taken over once its entry is claimed and its run key expired
    worker = ToolWorker(
        app, store, worker_name=settings.consumer, run_ttl_ms=settings.lease_ttl_ms, limits=settings.wire_limits
    )
    keys = settings.keys
    served = list(queues or app.tool_queues or ["default"])
    runners: list[StreamConsumer | CancelListener | McpHost] = [
        consumer
        for queue in served
        for consumer in partition_consumers(  # every partition of the queue's stream
            store.redis,
            settings,
            stream=keys.tools(queue),
            group=TOOL_WORKER_GROUP,
            handler=worker.handler_for,
            per_stream=True,
            on_dead_letter=worker.on_dead_job,
        )
    ]
    runners += cancel_listeners(
        store.redis, keys, worker.on_cancel_broadcast, block_ms=settings.block_ms, limits=settings.wire_limits
    )
    servers = [s for s in app.mcp_servers.values() if s.queue in served]
    if servers:  # the MCP servers of the queues served here: this process keeps their sessions
        from agentstream.mcp_tools.host import McpHost

        worker.mcp = McpHost(servers, store.redis, keys, worker_name=settings.consumer)
        runners.append(worker.mcp)
    return worker, runners
