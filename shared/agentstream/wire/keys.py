"""Every Redis key and stream name agentstream uses; no other module builds a key string.

All names start with a namespace (default ``agentstream``, setting ``AGENTSTREAM_NAMESPACE``),
so several deployments can share one Redis. The keys of one trace share the hash tag
``{<trace id>}``, so a trace's stream, idempotency keys and lease sit in one slot and a Lua
script may touch them together on Redis Cluster.

Work streams (hints, never state):

- ``<ns>:turns``: turns published by backends (field ``turn``: JSON, see TurnMessage).
- ``<ns>:wake``: wake-ups for the agent loop (field ``wake``).
- ``<ns>:tools:<queue>``: tool jobs of one tool queue (field ``job``).
- ``<wake partition>:to:{<wake partition>}:<owner>``: the wake-ups of one agent-loop consumer (its own, for the
  conversations whose jobs it published: sticky wake-ups, see :mod:`agentstream.steps.wake_routes`),
  read in the agent loop's group; ``<wake partition>:owners:{<wake partition>}``: the consumers alive with such
  streams (a sorted set: owner → the time until which it counts as alive, Unix ms). Both in the
  hash slot of the wake-up partition they belong to (its name as their hash tag).
- ``<ns>:replies``: answers (field ``reply``), unless a turn names its own ``reply_to``.
- ``<ns>:cancel``: cancel requests (field ``cancel``: JSON, see CancelMessage), read by the agent
  loop's group and, without a group, by every service process (to abort work in hand).
- ``<ns>:backends:<backend>:turns`` and ``<ns>:backends:<backend>:cancel``: the turns (partitioned)
  and cancel streams of one backend named in ``AGENTSTREAM_BACKENDS``, read as the shared ones but
  confined to that backend's conversations (``<backend>:...`` trace ids) and replies streams
  (``<ns>:replies:<backend>``...): see :mod:`agentstream.wire.backends`.
- ``<ns>:approvals``: approvals and denials of tool calls that await one (field ``approval``:
  JSON, see ApprovalMessage), read by the agent loop's group; ``<ns>:approvals:due`` (and
  ``:p<k>``): traces with a call awaiting approval, scored by when the first is due (Unix ms).
- ``<ns>:delegations``: calls of delegation tools, for the delegation service (field ``job``).
- ``<ns>:child-endings``: a child trace's turn ended; hand its result back (field ``ending``).
- ``<ns>:compactions``: a trace's context needs a summary (field ``compaction``).
- ``<ns>:errors``: turns rejected before they had a trace (fields ``error``, ``payload``).
- ``<ns>:dead:<stream>``: the dead-letter stream of a work stream (of each partition's stream).

Partitions (setting ``AGENTSTREAM_PARTITIONS``, default 1): the work streams a trace's work goes
through (turns, wake-ups, tool queues, delegations, child endings, compactions) come in N
partitions, and every entry about a trace goes to the partition of that trace:

    partition = CRC-32(UTF-8 bytes of the trace id) mod N

(CRC-32 as zlib, Ethernet and PNG compute it: Python ``zlib.crc32``, Go ``crc32.ChecksumIEEE``,
Java ``java.util.zip.CRC32``, Node ``zlib.crc32``; see :func:`partition_of`). Partition 0's stream
is the plain name above (so N = 1 is exactly the one-stream layout); partition ``p`` ≥ 1 is
``<stream>:p<p>``, e.g. ``agentstream:turns:p2``. Every service consumes every partition.
So that no name can stand for another name's partition, a tool queue name may not end in
``:p`` and digits (queue ``x:p1`` would be partition 1 of queue ``x``), and neither a tool queue
name nor the namespace may contain ``{`` or ``}`` (a hash tag of their own would put a stream and
its attempts hash in different slots of a Redis Cluster, or every partition in one): see
:func:`check_queue_name` and :func:`check_namespace`; :class:`Keys` refuses such names with
:class:`~agentstream.errors.ConfigError`. Namespaces are not checked against each other: two
deployments sharing a Redis need namespaces neither of which begins with the other and ``:``. The
cancel, approvals, replies and errors streams are not partitioned. A backend publishing a turn computes the
partition of the turn's trace id (or runs ``agentstream keys turns <trace id>``); the gateway and
the ``agentstream`` commands do it themselves.
- ``{<stream>}:attempts:<group>``: agentstream's own delivery counter of a work stream's entries in
  one group (in the stream's hash slot) (hash: entry id → handler starts, ``<entry id>:error`` → the last error); an entry's
  fields are deleted when it is acknowledged.

Per trace:

- ``<ns>:trace:{<id>}``: the trace (a stream of events).
- ``<ns>:trace:{<id>}:keys``: idempotency keys of appends (hash: key → entry id), and the
  runtime's once-only markers of the trace (``jobs:<turn>:<step>``, ``reply:<turn>``,
  ``claim:<call id>``: the tool job entry that runs the call). ``cancel:<turn id>`` in it is the
  cancel key that tool workers check.
- ``<ns>:trace:{<id>}:lease``: the lease of the agent loop (value: fencing token, from the
  counter ``fence`` in the trace's key hash).
- ``<ns>:trace:{<id>}:dirty``: set when a hint came while another worker held the lease.
- ``<ns>:trace:{<id>}:deltas``: the trace's token deltas while a model answers (field ``d``:
  JSON, see :mod:`agentstream.runtime.deltas`). Short-lived and never the truth: capped with
  ``MAXLEN ~`` and given an expiry, so it disappears when nobody streams; the final answer is
  the ModelOutput in the trace.
- ``<ns>:trace:{<id>}:descendants``: of a root trace, the ids of every child trace opened under
  it (a set, the index behind the per-root cap on descendants).
- ``<ns>:conversations``: the recent root conversations (a sorted set: trace id → the time its
  newest turn entered, Unix ms), capped; what the gateway's console lists.
- ``<ns>:gateway:rate:<key name>:<window>``: the HTTP gateway's request counter of one API key
  in one rate-limit window (expires with the window).
- ``<ns>:delegations:deadlines``: open child traces scored by their deadline (Unix ms), which
  the delegation service's supervisor watches.
- ``<ns>:mcp:<server>:catalog``: the tools an MCP server lists, as its tool workers last read
  them (JSON, see :class:`agentstream.steps.offers.Catalog`); the agent loop reads it before
  each model call of an agent that uses the server.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from agentstream.errors import ConfigError
from agentstream.wire.backends import check_backends

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
APPROVAL_FIELD = b"approval"
ENDING_FIELD = b"ending"
COMPACTION_FIELD = b"compaction"


def partition_of(trace_id: str, partitions: int) -> int:
    """The partition (0 .. ``partitions`` - 1) of a trace's work: CRC-32 (IEEE 802.3, as
    ``zlib.crc32``) of the trace id's UTF-8 bytes, modulo ``partitions``. Stable across
    processes, languages and restarts (unlike Python's ``hash()``).

    Raises:
        ValueError: ``partitions`` is less than 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be 1 or more, got {partitions}")
    if partitions == 1:
        return 0
    return zlib.crc32(trace_id.encode("utf-8", "surrogatepass")) % partitions


PARTITION_SUFFIX = re.compile(r":p[0-9]+\Z")
"""What ends the name of a work stream's partition 1 or more (``<stream>:p<k>``), and so what no
tool queue name may end with."""

_TURNS_PARTITION = re.compile(r"turns:p([1-9][0-9]{0,5})")

HASH_TAG_CHARACTERS = "{}"
"""Characters that would make a hash tag (Redis Cluster) of a name: refused in user-chosen names."""


def name_problem(name: str, *, ends_a_stream: bool) -> str | None:
    """Why ``name`` may not be embedded in agentstream's key names, or None when it may.

    Refused: a name with ``{`` or ``}`` (a hash tag of its own); with ``ends_a_stream`` (a name
    that ends a work stream's name, as a tool queue's does), a name ending in ``:p`` and digits,
    the form of the partition suffix (:data:`PARTITION_SUFFIX`).
    """
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a text"
    braces = [c for c in HASH_TAG_CHARACTERS if c in name]
    if braces:
        return (
            f"it contains {' and '.join(repr(c) for c in braces)}, which would make a Redis Cluster hash tag "
            "of it (a stream and its attempts hash could land in different slots, or every partition in one)"
        )
    found = PARTITION_SUFFIX.search(name) if ends_a_stream else None
    if found:
        suffix, base, k = found.group(0), name[: found.start()], found.group(0)[2:]
        clash = (
            f"its stream would be partition {k} of queue {base!r}"
            if k[0] != "0"
            else f"it has the form of one (queue {base + ':p1'!r} would be partition 1 of queue {base!r})"
        )
        return (
            f"it ends in {suffix!r}, the partition suffix of work streams (':p<k>'): {clash} with "
            f"AGENTSTREAM_PARTITIONS above 1"
        )
    return None


DOT_SEGMENTS = (".", "..")
"""Path segments a browser or a proxy normalises away: refused as parts of a trace id."""


def trace_id_problem(trace_id: str) -> str | None:
    """Why ``trace_id`` may not name a trace (its keys share the hash tag ``{<trace id>}``), or
    None when it may.

    Refused: ``{`` or ``}`` (a ``}`` closes the hash tag early, so ``x}a`` and ``x}b`` would share a
    slot with ``x`` and a trace's keys could land in different slots of a Redis Cluster: its
    scripts then fail with CROSSSLOT), and a ``/``-separated part that is ``.`` or ``..`` (an HTTP
    client normalises ``/v1/traces/a/../b`` to another conversation's address). Pure.
    """
    braces = [c for c in HASH_TAG_CHARACTERS if c in trace_id]
    if braces:
        return (
            f"it contains {' and '.join(repr(c) for c in braces)}, which would close or open the Redis Cluster "
            "hash tag of the trace's keys ({<trace id>}): they could land in different slots"
        )
    if any(part in DOT_SEGMENTS for part in trace_id.split("/")):
        return "it has a '.' or '..' part between '/'s, which HTTP clients and proxies normalise to another address"
    return None


OWNER_MAX_CHARS = 128
"""The longest agent-loop consumer name that may own wake-up streams (characters)."""

_OWNER_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]*")


def owner_problem(owner: object) -> str | None:
    """Why ``owner`` may not name an agent-loop consumer's own wake-up stream
    (``<wake partition>:to:{<wake partition>}:<owner>``, see :mod:`agentstream.steps.wake_routes`), or None when it may.

    Allowed: 1 to :data:`OWNER_MAX_CHARS` ASCII letters, digits and ``. _ @ : -``, beginning with
    a letter or a digit (a host name and a process id, as the default consumer name is). A tool
    job's ``wake_to`` is checked before any key is named after it: a job is written by whoever may
    write its stream, so its owner is trusted no more than the job. The reason does not quote the
    name. Pure.
    """
    if not isinstance(owner, str):
        return f"it is a {type(owner).__name__}, not a text"
    if not owner:
        return "it is empty"
    if len(owner) > OWNER_MAX_CHARS:
        return f"it has {len(owner)} characters, more than {OWNER_MAX_CHARS}"
    if not _OWNER_SHAPE.fullmatch(owner):
        return (
            "it holds characters other than ASCII letters, digits and '.', '_', '@', ':', '-', or does not "
            "begin with a letter or a digit"
        )
    return None


def check_queue_name(queue: str) -> str:
    """``queue`` itself, when it may name a tool queue (stream ``<ns>:tools:<queue>``; see
    :func:`name_problem`), whatever the number of partitions (so raising it later is safe).

    Raises:
        ConfigError: it contains ``{`` or ``}``, or ends in ``:p`` and digits; the message names
            the queue and why.
    """
    problem = name_problem(queue, ends_a_stream=True)
    if problem:
        raise ConfigError(f"tool queue name {queue!r} cannot be used: {problem}; choose another name")
    return queue


def check_namespace(namespace: str) -> str:
    """``namespace`` itself, when it may prefix agentstream's keys (see :func:`name_problem`).

    Raises:
        ConfigError: it contains ``{`` or ``}``; the message names it and why.
    """
    problem = name_problem(namespace, ends_a_stream=False)
    if problem:
        raise ConfigError(f"namespace {namespace!r} (AGENTSTREAM_NAMESPACE) cannot be used: {problem}; choose another")
    return namespace


def partition_stream(stream: str, partition: int) -> str:
    """The name of partition ``partition`` of work stream ``stream``: the name itself for 0,
    ``<stream>:p<partition>`` otherwise."""
    return stream if partition == 0 else f"{stream}:p{partition}"


def attempts_key(stream: str, group: str) -> str:
    """The hash counting real deliveries of ``stream``'s entries in ``group``.

    It shares the stream's hash slot (the stream's name is its hash tag, unless the name has a
    tag of its own), so acknowledging an entry and forgetting its count is one script, on a
    Redis Cluster too.
    """
    if "{" in stream and "}" in stream[stream.index("{") :]:
        return f"{stream}:attempts:{group}"
    return f"{stream}:attempts:{{{stream}}}:{group}"


@dataclass(frozen=True)
class Keys:
    """Key and stream names under one namespace.

    Attributes:
        namespace: the prefix of every key.
        partitions: how many partitions each work stream has (see the module docstring).

    Raises:
        ValueError: ``partitions`` is less than 1.
        ConfigError: the namespace cannot be used (:func:`check_namespace`).
    """

    namespace: str = DEFAULT_NAMESPACE
    partitions: int = 1
    backends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be 1 or more, got {self.partitions}")
        check_namespace(self.namespace)
        object.__setattr__(self, "backends", check_backends(self.backends))

    def backend_turns(self, backend: str) -> str:
        """Backend ``backend``'s turns stream (its partition 0; partitioned as :attr:`turns`):
        ``<ns>:backends:<backend>:turns`` (see :mod:`agentstream.wire.backends`)."""
        return f"{self.namespace}:backends:{backend}:turns"

    def backend_turns_for(self, backend: str, trace_id: str) -> str:
        """The partition of ``backend``'s turns stream that a turn of ``trace_id`` goes to."""
        return self.for_trace(self.backend_turns(backend), trace_id)

    def backend_cancel(self, backend: str) -> str:
        """Backend ``backend``'s cancel stream (not partitioned): ``<ns>:backends:<backend>:cancel``."""
        return f"{self.namespace}:backends:{backend}:cancel"

    def backend_approvals(self, backend: str) -> str:
        """Backend ``backend``'s approvals stream (not partitioned): ``<ns>:backends:<backend>:approvals``."""
        return f"{self.namespace}:backends:{backend}:approvals"

    def backend_replies(self, backend: str) -> str:
        """Backend ``backend``'s replies stream: ``<ns>:replies:<backend>``."""
        return f"{self.replies}:{backend}"

    def backend_of_trace(self, trace_id: str) -> str | None:
        """The configured backend whose conversation ``trace_id`` is (it begins with ``<backend>:``;
        a backend's name holds no ``:``, so at most one is), or None. Pure."""
        name, sep, rest = trace_id.partition(":")
        return name if sep and rest and name in self.backends else None

    @property
    def cancel_streams(self) -> list[str]:
        """Every cancel stream: the shared one, then each configured backend's."""
        return [self.cancel, *(self.backend_cancel(b) for b in self.backends)]

    @property
    def approval_streams(self) -> list[str]:
        """Every approvals stream: the shared one, then each configured backend's."""
        return [self.approvals, *(self.backend_approvals(b) for b in self.backends)]

    def backend_of_stream(self, stream: str | None) -> str | None:
        """The configured backend whose turns (any partition), cancel or approvals stream
        ``stream`` is, or None for any other stream (the shared ones: trusted senders). Pure."""
        if not stream:
            return None
        head = f"{self.namespace}:backends:"
        if not stream.startswith(head):
            return None
        name, _, rest = stream[len(head) :].partition(":")
        if name not in self.backends:
            return None
        if rest in ("cancel", "turns", "approvals"):
            return name
        part = _TURNS_PARTITION.fullmatch(rest)
        return name if part is not None and int(part.group(1)) < self.partitions else None

    def partition(self, trace_id: str) -> int:
        """The partition of a trace's work (:func:`partition_of`)."""
        return partition_of(trace_id, self.partitions)

    def for_trace(self, stream: str, trace_id: str) -> str:
        """The partition of work stream ``stream`` (its partition-0 name, e.g. :attr:`turns`)
        that entries about ``trace_id`` go to."""
        return partition_stream(stream, self.partition(trace_id))

    def partitions_of(self, stream: str) -> list[str]:
        """Every partition's stream of work stream ``stream`` (its partition-0 name), in order."""
        return [partition_stream(stream, p) for p in range(self.partitions)]

    def turns_for(self, trace_id: str) -> str:
        """The turns stream a turn of ``trace_id`` is published to."""
        return self.for_trace(self.turns, trace_id)

    def wake_for(self, trace_id: str) -> str:
        """The wake-up stream a wake-up of ``trace_id`` is published to."""
        return self.for_trace(self.wake, trace_id)

    def wake_owners(self, partition: int) -> str:
        """The agent-loop consumers that own wake-up streams of partition ``partition`` of
        ``<ns>:wake`` (a sorted set: owner → the time until which it counts as alive, Unix ms):
        ``<wake partition>:owners:{<wake partition>}``, in the partition stream's hash slot."""
        stream = partition_stream(self.wake, partition)
        return f"{stream}:owners:{{{stream}}}"

    def wake_owned(self, partition: int, owner: str) -> str:
        """Agent-loop consumer ``owner``'s own wake-up stream of partition ``partition``:
        ``<wake partition>:to:{<wake partition>}:<owner>``, in the partition stream's hash slot (one script or
        one read may touch both on a Redis Cluster).

        Raises:
            ConfigError: ``owner`` may not name a stream (:func:`owner_problem`).
        """
        problem = owner_problem(owner)
        if problem:
            raise ConfigError(f"a wake-up owner's name cannot be used: {problem}")
        stream = partition_stream(self.wake, partition)
        return f"{stream}:to:{{{stream}}}:{owner}"

    def tools_for(self, queue: str, trace_id: str) -> str:
        """The stream of tool queue ``queue`` that the jobs of ``trace_id`` go to."""
        return self.for_trace(self.tools(queue), trace_id)

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
    def approvals(self) -> str:
        """The stream of approvals and denials of tool calls (field ``approval``, see ApprovalMessage)."""
        return f"{self.namespace}:approvals"

    def approvals_due(self, partition: int = 0) -> str:
        """The sorted set of traces with a call awaiting approval, scored by the earliest time
        (Unix ms) one of them is due to be denied (partitioned as the awaiting set is)."""
        return partition_stream(f"{self.namespace}:approvals:due", partition)

    @property
    def errors(self) -> str:
        return f"{self.namespace}:errors"

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

    @property
    def conversations(self) -> str:
        """The sorted set of recent root conversations (trace id → newest turn's time, Unix ms)."""
        return f"{self.namespace}:conversations"

    @property
    def service_settings(self) -> str:
        """The hash of the settings agent loops started with (digest → JSON: the app and the
        model endpoints), so ``trace verify`` rebuilds requests as they were sent."""
        return f"{self.namespace}:service-settings"

    def gateway_rate(self, key_name: str, window: int) -> str:
        """The HTTP gateway's request counter of one API key in one rate-limit window."""
        return f"{self.namespace}:gateway:rate:{key_name}:{window}"

    def work_streams(self, tool_queues: Iterable[str] = ()) -> list[str]:
        """Every work stream a deployment consumes, every partition of each (the ones that have
        dead-letter streams)."""
        bases = [
            self.turns,
            *(self.backend_turns(b) for b in self.backends),
            self.wake,
            *self.cancel_streams,
            self.approvals,
            self.delegations,
            self.child_endings,
            self.compactions,
            *(self.tools(q) for q in tool_queues),
        ]
        cancels = {*self.cancel_streams, self.approvals}  # not partitioned
        return [name for base in bases for name in ([base] if base in cancels else self.partitions_of(base))]

    def tools(self, queue: str) -> str:
        """The stream of tool jobs for one tool queue (its partition 0).

        Raises:
            ConfigError: the queue's name cannot be used (:func:`check_queue_name`).
        """
        return f"{self.namespace}:tools:{check_queue_name(queue)}"

    def mcp_catalog(self, server: str) -> str:
        """The catalog of one MCP server's tools (a string key holding JSON)."""
        return f"{self.namespace}:mcp:{server}:catalog"

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
