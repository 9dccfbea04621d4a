"""``agentstream serve delegation``: consumers of the delegations and child-endings streams, and
the supervisor of child deadlines. Scale it by running more processes."""

from __future__ import annotations

import functools

from agentstream.declarations.apps import App
from agentstream.ops.settings import Settings
from agentstream.runtime.consumer import StreamConsumer, partition_consumers
from agentstream.runtime.store import TraceStore
from agentstream.wire.keys import DELEGATION_GROUP
from agentstream_services.delegation.delegator import Delegator, Supervisor


def build(app: App, settings: Settings, store: TraceStore) -> tuple[Delegator, list[StreamConsumer | Supervisor]]:
    """The delegator, its two consumers (delegations, child endings) and its supervisor."""
    delegator = Delegator(
        app,
        store,
        max_descendants=settings.max_descendants,
        limits=settings.wire_limits,
        fold_cache_bytes=settings.fold_cache_budget_bytes(),
    )
    keys = settings.keys
    runners: list[StreamConsumer | Supervisor] = [
        consumer
        for stream, handler, on_dead in (
            (keys.delegations, delegator.on_delegation, delegator.on_dead_delegation),
            (keys.child_endings, delegator.on_child_ended, None),
        )
        for consumer in partition_consumers(  # each handler told its partition, which a report names
            store.redis,
            settings,
            stream=stream,
            group=DELEGATION_GROUP,
            on_dead_letter=on_dead,
            per_stream=True,
            handler=lambda name, handler=handler: functools.partial(handler, stream=name),
        )
    ]
    runners.append(Supervisor(delegator, interval_ms=settings.supervise_interval_ms))
    return delegator, runners
