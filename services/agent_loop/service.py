"""``agentstream serve agent-loop``: consumers of the turns, wake-up and cancel streams."""

from __future__ import annotations

import httpx

from agentstream.app import App
from agentstream.cancel import CancelListener
from agentstream.consumer import StreamConsumer, group_consumer
from agentstream.keys import AGENT_LOOP_GROUP
from agentstream.models import build_models
from agentstream.models.endpoints import check_agents, load_endpoints
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.agent_loop.loop import AgentLoop


def build(
    app: App, settings: Settings, store: TraceStore, http: httpx.AsyncClient
) -> tuple[AgentLoop, list[StreamConsumer | CancelListener]]:
    """The agent loop, its three consumers (turns, wake-ups, cancels) and its cancel listener.

    Every configured model endpoint (``default`` from OPENAI_*, and AGENTSTREAM_MODELS_FILE's)
    gets its adapter; every agent must name one of them.

    Raises:
        ConfigError: no model endpoint is configured, the configuration is not valid, a key
            variable is unset, or an agent names an endpoint that is not configured.
    """
    endpoints = load_endpoints(settings)
    check_agents(endpoints, app.agents)
    models = build_models(endpoints, client=http, timeout_s=settings.model_timeout_s, retries=settings.model_retries)
    loop = AgentLoop(
        app,
        store,
        models,
        lease_ttl_ms=settings.lease_ttl_ms,
        busy_policy=settings.busy_policy,
        trace_retention_s=settings.trace_retention_s,
        delta_maxlen=settings.delta_maxlen,
        delta_ttl_s=settings.delta_ttl_s,
    )
    keys = settings.keys
    runners: list[StreamConsumer | CancelListener] = [
        group_consumer(store.redis, settings, stream=stream, group=AGENT_LOOP_GROUP, handler=handler, on_dead_letter=on_dead)
        for stream, handler, on_dead in (
            (keys.turns, loop.on_turn, loop.on_dead_turn),
            (keys.wake, loop.on_wake, loop.on_dead_wake),
            (keys.cancel, loop.on_cancel, None),
        )
    ]
    runners.append(CancelListener(store.redis, keys, loop.on_cancel_broadcast, block_ms=settings.block_ms))
    return loop, runners
