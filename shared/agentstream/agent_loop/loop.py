"""The agent loop: turns in, the next step of a trace out.

A thin shell: it receives a hint (a turn or a wake-up), takes the trace's lease and reads what
was appended since it last looked, folds it (:class:`agentstream.steps.trace_fold.TraceFold`), asks the
shared library what to do (:func:`agentstream.steps.decision.decide_view`), does it, and repeats until
the trace waits on something (tool results) or has no turn left. A step therefore costs what
was added to the trace, not what the trace holds. It holds the trace's lease (with a fencing
token) across the steps of one wake-up, so one trace takes one step at a time; it never holds
a worker while tools run: their results wake it.

Round trips: taking the lease and reading what is new is one script. Every decision that writes
comes down to one value, :class:`agentstream.steps.effects.Effects` (events to append under the
fencing token, events appended only if nothing came meanwhile, jobs or a reply to publish, the
release), applied by one method (``_apply``) in one store operation
(:meth:`agentstream.runtime.store.TraceStore.apply`, the script ``append.lua``) that reads back
what came since; a model output carries what the step after it would write (its turn's ending,
and on one Redis server its jobs or its reply with the release and the acknowledgement of the
entry handled). What a step leaves waiting otherwise (the replies owed, the jobs on a Redis
Cluster, whose hash slots one script cannot span) goes out in the round trip that releases the
lease.

A hint for a trace whose lease another worker holds marks the trace dirty in the same step (the
holder looks again before it lets go); when the holder is another process, one hint per trace
is deferred until the lease would expire, so the hint survives a holder that dies. Cancels come
on the cancel stream (see :mod:`agentstream.runtime.cancel`); the busy-conversation policy (``queue``,
``reject``, ``interrupt``, ``rollback``; a turn message's own, else the process's) decides what a turn
published on a busy conversation does.
Dead-lettered hints end their turn with code ``dead_letter``.

The loop is in the library, split by role: :mod:`~agentstream.agent_loop.admission` (turns in),
:mod:`~agentstream.agent_loop.signals` (wake-ups, cancels, dead letters), :mod:`~agentstream.agent_loop.leases`
(the lease loop), :mod:`~agentstream.agent_loop.acting` (one step and its effects) and
:mod:`~agentstream.agent_loop.replies` (what a step publishes); the decisions are pure functions of
:mod:`agentstream.steps`. The service (``agentstream_services.agent_loop``) wires consumers to it.
"""

from __future__ import annotations

import asyncio

from agentstream.agent_loop._base import (
    BUSY_POLICIES,
)
from agentstream.agent_loop.acting import Acting
from agentstream.agent_loop.admission import Admission
from agentstream.agent_loop.children import Children
from agentstream.agent_loop.compactions import Compactions
from agentstream.agent_loop.leases import Leases
from agentstream.agent_loop.mcp_offers import McpOffers
from agentstream.agent_loop.replies import Replies
from agentstream.agent_loop.signals import Signals
from agentstream.declarations.apps import App
from agentstream.models import ChatModel, endpoints_of
from agentstream.runtime.deltas import DEFAULT_MAXLEN, DEFAULT_TTL_S
from agentstream.runtime.fold_reader import FoldReader
from agentstream.runtime.store import TraceStore
from agentstream.runtime.turn_order import EarlierTurns
from agentstream.steps.trace_fold import FoldCache
from agentstream.wire import checks as wire
from agentstream.wire.keys import Keys


class AgentLoop(Admission, Signals, Leases, Acting, Replies):
    """Handles turns and wake-ups for every trace.

    Args:
        app: the user's app.
        store: the trace store.
        models: model clients by endpoint id (agents name them).
        delta_maxlen: entries kept on a trace's token-delta stream while a model answers.
        delta_ttl_s: seconds a trace's token-delta stream lives after its last write.
        lease_ttl_ms: the trace lease's time to live, renewed every third of it while held.
        busy_policy: what a turn published on a busy conversation does (:data:`BUSY_POLICIES`).
        max_queued_turns: the most turns of one conversation admitted and not ended; a turn
            published past it fails at once with code ``busy`` (see
            :func:`agentstream.steps.machine.queue_full_refusal`).
        trace_retention_s: delete a whole conversation this long after its last turn ended;
            None keeps traces forever (the runtime never trims a trace).
        fold_cache_bytes: the most bytes of memory the folded traces kept may take, as measured
            (:class:`agentstream.steps.trace_fold.FoldCache`).
        limits: the wire's limits and reply streams (:mod:`agentstream.wire.checks`).
        turn_deadline_s: the most a turn may take from its start, in seconds (checked at each
            step, bounding each model call); past it the turn fails with code ``deadline``.
            None: no deadline.
        mcp_wait_s: how long a turn waits for the first tool list of its agent's MCP servers,
            in seconds, before it fails (see :mod:`agentstream.agent_loop.mcp_offers`).
        wake_owner: this process's consumer name, which the tool jobs it publishes name as the
            owner of their results' wake-ups (``ToolJob.wake_to``, see
            :mod:`agentstream.steps.wake_routes`); ``""``: none (they go to the shared stream).
    """

    def __init__(
        self,
        app: App,
        store: TraceStore,
        models: dict[str, ChatModel],
        *,
        lease_ttl_ms: int = 30_000,
        busy_policy: str = "queue",
        max_queued_turns: int = 64,
        trace_retention_s: float | None = None,
        delta_maxlen: int = DEFAULT_MAXLEN,
        delta_ttl_s: int = DEFAULT_TTL_S,
        fold_cache_bytes: int = 256 * 1024 * 1024,
        limits: wire.WireLimits = wire.DEFAULT_LIMITS,
        turn_deadline_s: float | None = None,
        mcp_wait_s: float = 30.0,
        wake_owner: str = "",
    ):
        if busy_policy not in BUSY_POLICIES:
            raise ValueError(f"busy_policy must be one of {BUSY_POLICIES}, got {busy_policy!r}")
        if max_queued_turns < 1:
            raise ValueError(f"max_queued_turns must be at least 1, got {max_queued_turns!r}")
        self.app = app
        self.store = store
        self.redis = store.redis
        self.keys: Keys = store.keys
        self.models = models
        self.endpoints = endpoints_of(models)  # an agent without model_limits gets its endpoint's
        # what decide checks a turn's model against: None when every model is a double without an
        # endpoint (the testing kit), so a turn may name any model a double serves (self.models says)
        self.served = self.endpoints or None
        self.delta_maxlen = delta_maxlen
        self.delta_ttl_s = delta_ttl_s
        self.children = Children(app, store)
        self.compactions = Compactions(store, wake_owner=wake_owner)
        self.mcp = McpOffers(store, wait_s=mcp_wait_s)  # the MCP tools each call offers, recorded in the trace
        self.lease_ttl_ms = lease_ttl_ms
        self.folds = FoldCache(fold_cache_bytes)  # folded traces: a step reads and folds what was added
        self._admitting: dict[str, list] = {}  # trace id → [its admission lock, admissions using it]
        self._earlier = EarlierTurns(self.redis)  # the turns published before one, pending (publish order)
        self._settled: dict[str, dict[str, None]] = {}  # stream → turn entries whose admission was decided here
        self._reader = FoldReader(store, self.folds)
        self.busy_policy = busy_policy
        self.max_queued_turns = max_queued_turns
        self.trace_retention_s = trace_retention_s
        self._expire_ms = int(trace_retention_s * 1000) if trace_retention_s else None
        self._publishes_with_append = store.one_server  # a Redis Cluster: the step's publication goes after its append
        self._model_calls: dict[str, tuple[str, asyncio.Task]] = {}  # trace → (turn, model call)
        self._held: dict[str, int] = {}  # trace → the token of the lease this process holds on it
        self._deferred: dict[str, tuple[str, float]] = {}  # trace → (hint entry, until): one waits per trace
        self.empty_hints = 0  # wake-ups (and other hints) that named a trace holding nothing
        self.limits = limits
        # the consumer its jobs name as their wake-ups' owner (sticky wake-ups); "": the shared stream
        self.wake_owner = wake_owner
        self.turn_deadline_s = turn_deadline_s
        self._usage_doubted: set[str] = set()  # endpoints whose under-reported usage was logged
