"""``agentstream serve agent-loop``: consumers of the turns and wake-up streams."""

from __future__ import annotations

import httpx

from agentstream.app import App
from agentstream.consumer import StreamConsumer
from agentstream.keys import AGENT_LOOP_GROUP
from agentstream.models.endpoints import default_endpoint
from agentstream.models.openai import OpenAIChatModel
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.agent_loop.loop import AgentLoop


def build(app: App, settings: Settings, store: TraceStore, http: httpx.AsyncClient) -> tuple[AgentLoop, list[StreamConsumer]]:
    """The agent loop and its two consumers (turns, wake-ups).

    Raises:
        ConfigError: no model endpoint is configured.
    """
    endpoint = default_endpoint(settings)
    models = {
        "default": OpenAIChatModel(
            endpoint, client=http, timeout_s=settings.model_timeout_s, retries=settings.model_retries
        )
    }
    loop = AgentLoop(app, store, models, lease_ttl_ms=settings.lease_ttl_ms)
    keys = settings.keys
    config = settings.consumer_config()
    consumers = [
        StreamConsumer(
            store.redis,
            stream=stream,
            group=AGENT_LOOP_GROUP,
            consumer=settings.consumer,
            handler=handler,
            dead_stream=keys.dead(stream),
            config=config,
        )
        for stream, handler in ((keys.turns, loop.on_turn), (keys.wake, loop.on_wake))
    ]
    return loop, consumers
