"""``agentstream serve agent-loop``: consumers of the turns, wake-up, cancel and approvals streams."""

from __future__ import annotations

import functools

import httpx

from agentstream.agent_loop.loop import AgentLoop
from agentstream.declarations.apps import App
from agentstream.models import ChatModel, build_models
from agentstream.models.endpoints import check_agents, load_endpoints
from agentstream.ops.settings import Settings
from agentstream.runtime.cancel import CancelListener, cancel_listeners
from agentstream.runtime.consumer import StreamConsumer, group_consumer, partition_consumers
from agentstream.runtime.store import TraceStore
from agentstream.runtime.wake_routes import OwnWakeups, own_wakeups
from agentstream.runtime.watchdog import Watchdog
from agentstream.wire.keys import AGENT_LOOP_GROUP, owner_problem


def _told(handler):
    """``handler(entry_id, fields, stream=...)`` → the handler of one partition's stream."""
    return lambda stream: functools.partial(handler, stream=stream)


def _dead_turn_hook(loop: AgentLoop, keys, turns: str):
    """The dead-letter hook of turns stream ``turns`` (any partition's entries): a backend's is
    told its stream, so it touches only what that backend may (:meth:`AgentLoop.on_dead_turn`)."""
    return loop.on_dead_turn if turns == keys.turns else functools.partial(loop.on_dead_turn, stream=turns)


def build(
    app: App,
    settings: Settings,
    store: TraceStore,
    http: httpx.AsyncClient,
    *,
    models: dict[str, ChatModel] | None = None,
) -> tuple[AgentLoop, list[StreamConsumer | CancelListener | Watchdog | OwnWakeups]]:
    """The agent loop, its consumers (every partition of turns and wake-ups, its own wake-up stream of
    each partition (:mod:`agentstream.runtime.wake_routes`), cancels), its cancel listener and the
    watchdog of turns waiting on tools (:mod:`.watchdog`).

    Every configured model endpoint (``default`` from OPENAI_*, and AGENTSTREAM_MODELS_FILE's)
    gets its adapter; every agent must name one of them. ``models`` (endpoint id → model, e.g.
    the doubles of :mod:`agentstream.testing`) replaces the configured endpoints.

    Raises:
        ConfigError: no model endpoint is configured, the configuration is not valid, a key
            variable is unset, or an agent names an endpoint that is not configured.
    """
    if models is None:
        endpoints = load_endpoints(settings)
        check_agents(endpoints, app.agents)
        models = build_models(
            endpoints,
            client=http,
            timeout_s=settings.model_timeout_s,
            retries=settings.model_retries,
            deadline_s=settings.model_deadline_s,
        )
    loop = AgentLoop(
        app,
        store,
        models,
        lease_ttl_ms=settings.lease_ttl_ms,
        fold_cache_bytes=settings.fold_cache_budget_bytes(),
        busy_policy=settings.busy_policy,
        max_queued_turns=settings.max_queued_turns,
        trace_retention_s=settings.trace_retention_s,
        delta_maxlen=settings.delta_maxlen,
        delta_ttl_s=settings.delta_ttl_s,
        limits=settings.wire_limits,
        turn_deadline_s=settings.turn_deadline_s,
        mcp_wait_s=settings.mcp_wait_s,
        wake_owner="" if owner_problem(settings.consumer) else settings.consumer,
    )
    keys = settings.keys
    turn_streams = [keys.turns, *(keys.backend_turns(b) for b in keys.backends)]  # the shared one, each backend's
    runners: list[StreamConsumer | CancelListener | Watchdog | OwnWakeups] = [
        consumer
        for stream, handler, on_dead in (
            *((turns, loop.on_turn, _dead_turn_hook(loop, keys, turns)) for turns in turn_streams),
            (keys.wake, loop.on_wake, loop.on_dead_wake),
        )
        for consumer in partition_consumers(  # each handler told its partition, which a report names
            store.redis,
            settings,
            stream=stream,
            group=AGENT_LOOP_GROUP,
            handler=_told(handler),
            on_dead_letter=on_dead,
            per_stream=True,
        )
    ]  # every partition of the turns and wake-up streams; a cancel stream has one
    # this process's own wake-up stream of each partition: the wake-ups of the jobs it published
    # come back to it while it is alive, where the conversation's fold is (sticky wake-ups)
    runners += own_wakeups(store.redis, settings, _told(loop.on_wake), loop.on_dead_wake)
    runners += [
        group_consumer(store.redis, settings, stream=s, group=AGENT_LOOP_GROUP, handler=_told(loop.on_cancel)(s))
        for s in keys.cancel_streams
    ]
    runners += [  # approvals and denials of tool calls that wait for a person: the shared stream, each backend's
        group_consumer(store.redis, settings, stream=s, group=AGENT_LOOP_GROUP, handler=_told(loop.on_approval)(s))
        for s in keys.approval_streams
    ]
    runners += cancel_listeners(
        store.redis, keys, loop.on_cancel_broadcast, block_ms=settings.block_ms, limits=settings.wire_limits
    )
    # turns whose awaited tool work vanished end with a reason; calls awaiting approval past due are woken
    if settings.watchdog_interval_ms:
        runners += [  # one per partition of the awaiting set
            Watchdog(
                store.redis,
                keys,
                loop.end_lost_work,
                interval_s=settings.watchdog_interval_ms / 1000.0,
                partition=p,
                publish_owed=loop.publish_owed_replies,
            )
            for p in range(keys.partitions)
        ]
    return loop, runners
