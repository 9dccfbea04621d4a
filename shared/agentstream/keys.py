"""Every Redis key and stream name agentstream uses; no other module builds a key string.

All names start with a namespace (default ``agentstream``, setting ``AGENTSTREAM_NAMESPACE``),
so several deployments can share one Redis. The keys of one trace share the hash tag
``{<trace id>}``, so a trace's stream, idempotency keys and lease sit in one slot and a Lua
script may touch them together on Redis Cluster.

Work streams (hints, never state):

- ``<ns>:turns``: turns published by backends (field ``turn``: JSON, see TurnMessage).
- ``<ns>:wake``: wake-ups for the agent loop (field ``wake``).
- ``<ns>:tools:<queue>``: tool jobs of one tool queue (field ``job``).
- ``<ns>:replies``: answers (field ``reply``), unless a turn names its own ``reply_to``.
- ``<ns>:cancel``: cancel requests (field ``cancel``: JSON, see CancelMessage), read by the agent
  loop's group and, without a group, by every service process (to abort work in hand).
- ``<ns>:delegations``: calls of delegation tools, for the delegation service (field ``job``).
- ``<ns>:child-endings``: a child trace's turn ended; hand its result back (field ``ending``).
- ``<ns>:compactions``: a trace's context needs a summary (field ``compaction``).
- ``<ns>:errors``: turns rejected before they had a trace (fields ``error``, ``payload``).
- ``<ns>:dead:<stream>``: the dead-letter stream of a work stream.
- ``<stream>:attempts:<group>``: agentstream's own delivery counter of a work stream's entries in
  one group (hash: entry id → handler starts, ``<entry id>:error`` → the last error); an entry's
  fields are deleted when it is acknowledged.

Per trace:

- ``<ns>:trace:{<id>}``: the trace (a stream of events).
- ``<ns>:trace:{<id>}:keys``: idempotency keys of appends (hash: key → entry id), and the
  runtime's once-only markers of the trace (``jobs:<turn>:<step>``, ``reply:<turn>``,
  ``claim:<call id>``: the tool job entry that runs the call). ``cancel:<turn id>`` in it is the
  cancel key that tool workers check.
- ``<ns>:trace:{<id>}:lease``: the lease of the agent loop (value: fencing token).
- ``<ns>:trace:{<id>}:dirty``: set when a hint came while another worker held the lease.
- ``<ns>:trace:{<id>}:deltas``: the trace's token deltas while a model answers (field ``d``:
  JSON, see :mod:`agentstream.deltas`). Short-lived and never the truth: capped with
  ``MAXLEN ~`` and given an expiry, so it disappears when nobody streams; the final answer is
  the ModelOutput in the trace.
- ``<ns>:trace:{<id>}:descendants``: of a root trace, the ids of every child trace opened under
  it (a set, the index behind the per-root cap on descendants).
- ``<ns>:fence``: the counter that issues fencing tokens.
- ``<ns>:delegations:deadlines``: open child traces scored by their deadline (Unix ms), which
  the delegation service's supervisor watches.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_NAMESPACE = "agentstream"

AGENT_LOOP_GROUP = "agent-loop"
TOOL_WORKER_GROUP = "tool-workers"
DELEGATION_GROUP = "delegation"
COMPACTION_GROUP = "compaction"

TURN_FIELD = b"turn"
WAKE_FIELD = b"wake"
JOB_FIELD = b"job"
REPLY_FIELD = b"reply"
DELTA_FIELD = b"d"
CANCEL_FIELD = b"cancel"
ENDING_FIELD = b"ending"
COMPACTION_FIELD = b"compaction"


def attempts_key(stream: str, group: str) -> str:
    """The hash counting real deliveries of ``stream``'s entries in ``group``."""
    return f"{stream}:attempts:{group}"


@dataclass(frozen=True)
class Keys:
    """Key and stream names under one namespace."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def turns(self) -> str:
        return f"{self.namespace}:turns"

    @property
    def wake(self) -> str:
        return f"{self.namespace}:wake"

    @property
    def replies(self) -> str:
        return f"{self.namespace}:replies"

    @property
    def cancel(self) -> str:
        return f"{self.namespace}:cancel"

    @property
    def errors(self) -> str:
        return f"{self.namespace}:errors"

    @property
    def fence(self) -> str:
        return f"{self.namespace}:fence"

    @property
    def delegations(self) -> str:
        """The stream of delegation tool calls (the delegation service's work)."""
        return f"{self.namespace}:delegations"

    @property
    def child_endings(self) -> str:
        """The stream of child traces whose turn ended (the delegation service hands them back)."""
        return f"{self.namespace}:child-endings"

    @property
    def delegation_deadlines(self) -> str:
        """The sorted set of open child traces by deadline (Unix ms)."""
        return f"{self.namespace}:delegations:deadlines"

    @property
    def compactions(self) -> str:
        """The stream of compaction jobs (the compaction service's work)."""
        return f"{self.namespace}:compactions"

    def tools(self, queue: str) -> str:
        """The stream of tool jobs for one tool queue."""
        return f"{self.namespace}:tools:{queue}"

    def dead(self, stream: str) -> str:
        """The dead-letter stream of a work stream."""
        return f"{self.namespace}:dead:{stream}"

    def trace(self, trace_id: str) -> str:
        return f"{self.namespace}:trace:{{{trace_id}}}"

    def trace_keys(self, trace_id: str) -> str:
        return f"{self.namespace}:trace:{{{trace_id}}}:keys"

    def lease(self, trace_id: str) -> str:
        return f"{self.namespace}:trace:{{{trace_id}}}:lease"

    def dirty(self, trace_id: str) -> str:
        return f"{self.namespace}:trace:{{{trace_id}}}:dirty"

    def deltas(self, trace_id: str) -> str:
        """The trace's short-lived stream of token deltas (same hash slot as the trace)."""
        return f"{self.namespace}:trace:{{{trace_id}}}:deltas"

    def descendants(self, root_trace_id: str) -> str:
        """The set of child traces opened under a root trace (same hash slot as the root)."""
        return f"{self.namespace}:trace:{{{root_trace_id}}}:descendants"

    def trace_id_of(self, trace_key: str) -> str:
        """The trace id inside a trace stream name (inverse of :meth:`trace`)."""
        start = trace_key.index("{") + 1
        return trace_key[start : trace_key.rindex("}")]
