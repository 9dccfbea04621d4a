"""``agentstream serve delegation``: consumers of the delegations and child-endings streams, and
the supervisor of child deadlines. Scale it by running more processes."""

from __future__ import annotations

from agentstream.app import App
from agentstream.consumer import StreamConsumer, group_consumer
from agentstream.keys import DELEGATION_GROUP
from agentstream.settings import Settings
from agentstream.store import TraceStore
from agentstream_services.delegation.delegator import Delegator, Supervisor


def build(app: App, settings: Settings, store: TraceStore) -> tuple[Delegator, list[StreamConsumer | Supervisor]]:
    """The delegator, its two consumers (delegations, child endings) and its supervisor."""
    delegator = Delegator(app, store, max_descendants=settings.max_descendants)
    keys = settings.keys
    runners: list[StreamConsumer | Supervisor] = [
        group_consumer(store.redis, settings, stream=stream, group=DELEGATION_GROUP, handler=handler, on_dead_letter=on_dead)
        for stream, handler, on_dead in (
            (keys.delegations, delegator.on_delegation, delegator.on_dead_delegation),
            (keys.child_endings, delegator.on_child_ended, None),
        )
    ]
    runners.append(Supervisor(delegator, interval_ms=settings.supervise_interval_ms))
    return delegator, runners
