"""Services in the test's own process: the real ``build()`` of each service, on real Redis.

Faster than OS processes and easy to reach into (the AgentLoop and ToolWorker objects), for
integration tests of the delivery mechanisms. Each started "process" has its own Redis client,
store, HTTP client and consumer name; ``stop`` drains it like SIGTERM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

from agentstream.declarations.apps import App
from agentstream.models.client import model_client
from agentstream.ops.settings import Settings
from agentstream.runtime.connection import connect
from agentstream.runtime.runner import run_consumers
from agentstream.runtime.store import TraceStore
from agentstream.wire import codec
from agentstream.wire.events import Event, Reply, TurnMessage
from agentstream.wire.keys import REPLY_FIELD, TURN_FIELD, Keys
from agentstream_services.agent_loop.service import build as build_loop
from agentstream_services.tool_worker.service import build as build_worker

FAST = {
    "AGENTSTREAM_BLOCK_MS": "50",
    "AGENTSTREAM_MIN_IDLE_MS": "1000",
    "AGENTSTREAM_LEASE_TTL_MS": "1000",
    "AGENTSTREAM_SHUTDOWN_GRACE_S": "5",
    "AGENTSTREAM_MODEL_RETRIES": "0",
    # tests read work streams back (which partition held a job, how many wake-ups went out): the
    # services' periodic trim of acknowledged entries, whose first run falls at a random moment of
    # the first interval, would remove them under a slow run; the chaos runs trim on purpose
    "AGENTSTREAM_TRIM_INTERVAL_MS": "0",
}


@dataclass
class Proc:
    name: str
    stop: asyncio.Event
    task: asyncio.Task
    loop: object = None
    worker: object = None
    redis: object = None
    http: object = None


@dataclass
class InProcess:
    """Start agent-loop, tool-worker, delegation and compaction "processes" as tasks of the running event loop."""

    app: App
    redis_url: str
    namespace: str
    model_url: str
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)

    def settings(self, name: str) -> Settings:
        values = {
            "REDIS_URL": self.redis_url,
            "AGENTSTREAM_NAMESPACE": self.namespace,
            "OPENAI_BASE_URL": self.model_url,
            "OPENAI_MODEL": "scripted-model",
            "AGENTSTREAM_CONSUMER": name,
            **FAST,
            **self.env,
        }
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            return Settings()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    async def start(self, name: str, *services: str) -> Proc:
        settings = self.settings(name)
        redis = connect(self.redis_url, block_ms=settings.block_ms)
        store = TraceStore(redis, settings.keys, codec=self.app.codec)
        http = model_client(concurrency=settings.concurrency)  # as `agentstream serve` makes it
        runners: list = []
        loop = worker = None
        if "agent-loop" in services:
            loop, more = build_loop(self.app, settings, store, http)
            runners += more
        if "tool-worker" in services:
            worker, more = build_worker(self.app, settings, store)
            runners += more
        if "delegation" in services:
            from agentstream_services.delegation.service import build as build_delegation

            runners += build_delegation(self.app, settings, store)[1]
        if "compaction" in services:
            from agentstream_services.compaction.service import build as build_compaction

            runners += build_compaction(self.app, settings, store, http)[1]
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_consumers(runners, stop=stop, grace_s=settings.shutdown_grace_s, handle_signals=False)
        )
        proc = Proc(name, stop, task, loop, worker, redis, http)
        self.procs[name] = proc
        return proc

    async def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.task, 30)
        await proc.http.aclose()
        await proc.redis.aclose()

    async def stop_all(self) -> None:
        for name in list(self.procs):
            await self.stop(name)


async def publish(redis, keys: Keys, **fields: str) -> None:
    await redis.xadd(keys.turns_for(fields["trace_id"]), {TURN_FIELD: codec.encode(TurnMessage(**fields))})


async def replies(redis, keys: Keys) -> dict[str, Reply]:
    return {r.turn_id: r for r in (codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(keys.replies))}


async def wait_reply(redis, keys: Keys, turn_id: str, timeout_s: float = 30.0) -> Reply:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = (await replies(redis, keys)).get(turn_id)
        if got is not None:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"no reply for turn {turn_id} within {timeout_s} s")


async def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    """Poll an async predicate until it returns something truthy → that value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


async def events_of(store: TraceStore, trace_id: str) -> list[Event]:
    return [e for _, e in await store.read(trace_id)]


async def replies_on(redis, stream: str) -> list[Reply]:
    """Every reply on ``stream`` (the replies stream or a ``reply_to``), oldest first."""
    return [codec.decode_reply(f[REPLY_FIELD]) for _, f in await redis.xrange(stream)]


async def errors_of(redis, keys: Keys) -> list[dict[str, str]]:
    """The errors stream's entries, each as ``{field: text}`` (``error``, ``payload``, ``source``, ``entry``)."""
    return [{k.decode(): v.decode(errors="replace") for k, v in f.items()} for _, f in await redis.xrange(keys.errors)]
