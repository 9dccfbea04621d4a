"""Start-up refusals: what a service checks before it takes any work, each refusal one line
that names the setting and what to write instead. Pure (no Redis, no asyncio): the settings
(:class:`agentstream.ops.settings.Settings`) and the runner
(:func:`agentstream.runtime.runner.run_consumers`) ask these functions and raise
:class:`~agentstream.errors.ConfigError` with their answer.

- :func:`contradictions`: settings that each look fine alone but break the workers together (a
  consumer pruning threshold below the claim idle time, the lease or the blocking read).
- :func:`cluster_mismatch`: a Redis Cluster node behind a plain ``redis://`` URL (commands on
  keys of other nodes' slots then fail with MOVED, and turns are dead-lettered), or the reverse.
- :func:`connections_needed` and :func:`pool_refusal`: a connection pool (``max_connections`` in
  ``REDIS_URL``) too small for the connections the service holds at once: every blocking reader
  (a consumer per stream and partition, the cancel listener...) keeps one for as long as it
  blocks, and the commands that do not block share one more (or, with
  ``AGENTSTREAM_REDIS_MULTIPLEX=0``, take one per handler in flight).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PRUNE_BLOCK_FACTOR = 2
"""A live consumer's ``idle`` (Redis's time since its last read) grows to a whole blocking read
between two reads; the pruning threshold must exceed this many blocking reads."""


def contradictions(
    *,
    min_idle_ms: int,
    lease_ttl_ms: int,
    block_ms: int,
    consumer_delete_idle_ms: int,
) -> list[str]:
    """The reasons a set of settings cannot work together (empty when they can), each naming the
    variables, their values and what to change.

    - ``AGENTSTREAM_CONSUMER_DELETE_IDLE_MS`` (when not 0) must be at least the claim idle time
      (``AGENTSTREAM_MIN_IDLE_MS``), the lease (``AGENTSTREAM_LEASE_TTL_MS``) and two blocking
      reads (``AGENTSTREAM_BLOCK_MS``): below them, running workers that are between reads, or
      whose entries are about to be claimed, are deleted from their group by each other (seen: 3000
      ms kept workers out of their group for 8 s and more).
    """
    found: list[str] = []
    if consumer_delete_idle_ms:
        floors = {
            "AGENTSTREAM_MIN_IDLE_MS (the claim idle time)": min_idle_ms,
            "AGENTSTREAM_LEASE_TTL_MS (the trace lease)": lease_ttl_ms,
            f"{PRUNE_BLOCK_FACTOR} x AGENTSTREAM_BLOCK_MS (a live consumer's idle time between reads)": (
                PRUNE_BLOCK_FACTOR * block_ms
            ),
        }
        for what, floor in floors.items():
            if consumer_delete_idle_ms < floor:
                found.append(
                    f"AGENTSTREAM_CONSUMER_DELETE_IDLE_MS={consumer_delete_idle_ms} is below {what}, {floor} ms: "
                    "running workers would delete each other from their consumer group; raise it to at least "
                    f"{floor} (default 3600000) or set 0 to never delete idle consumers"
                )
                break
    return found


def cluster_mismatch(*, url_is_cluster: bool, server_is_cluster: bool, address: str) -> str | None:
    """Why a service must not start on this Redis (one line naming the URL to write), or None when
    the URL's mode and the server's agree. ``address`` is where the client connects
    (``host:port``), never with a password."""
    if server_is_cluster and not url_is_cluster:
        return (
            f"REDIS_URL points at {address}, a node of a Redis Cluster (cluster_enabled:1), as a single Redis: "
            "commands on other nodes' slots would fail with MOVED and turns be dead-lettered; write "
            f"redis+cluster://{address} (rediss+cluster:// with TLS) or set AGENTSTREAM_REDIS_CLUSTER=true"
        )
    if url_is_cluster and not server_is_cluster:
        return (
            f"REDIS_URL asks for a Redis Cluster at {address} (redis+cluster:// or AGENTSTREAM_REDIS_CLUSTER) but "
            f"that server is a single Redis (cluster_enabled:0); write redis://{address}/0 (rediss:// with TLS) "
            "and unset AGENTSTREAM_REDIS_CLUSTER"
        )
    return None


HOUSEKEEPING_CONNECTIONS = 2
"""Commands a service runs besides its handlers when nothing is shared (the readiness probe,
the stream gauges): without the shared connection each takes a pooled connection too."""


@dataclass(frozen=True)
class ConnectionNeed:
    """The connections one client of a service holds at once, at most.

    Attributes:
        blocking_readers: runners that block on a read (XREADGROUP/XREAD ``BLOCK``), one
            connection each for as long as they block.
        handlers: entries handled at once over every consumer (their concurrency added up).
        multiplexed: the commands that do not block share one connection
            (:mod:`agentstream.runtime.multiplex`); else each handler in flight takes its own.
    """

    blocking_readers: int
    handlers: int
    multiplexed: bool

    @property
    def total(self) -> int:
        """The connections needed: the blocking readers, plus the shared connection (or, without
        it, one per handler and :data:`HOUSEKEEPING_CONNECTIONS`)."""
        if self.multiplexed:
            return self.blocking_readers + 1
        return self.blocking_readers + self.handlers + HOUSEKEEPING_CONNECTIONS

    def describe(self) -> str:
        """What the total is made of, for a message."""
        shared = (
            "1 shared" if self.multiplexed else f"{self.handlers} handlers, {HOUSEKEEPING_CONNECTIONS} housekeeping"
        )
        return f"{self.blocking_readers} blocking readers, {shared}"


def connections_needed(runners: Iterable[tuple[int, int]], *, multiplexed: bool) -> ConnectionNeed:
    """The connections a service's runners need at once on one client.

    Args:
        runners: for each runner on the client, ``(blocking reads it holds at once, entries it
            handles at once)``: a stream consumer ``(1, concurrency)``, a listener ``(1, 0)``.
        multiplexed: whether the client shares a connection for the commands that do not block.
    """
    blocking = handlers = 0
    for reads, concurrency in runners:
        if reads < 0 or concurrency < 0:
            raise ValueError(f"a runner's blocking reads and concurrency are counts, not {reads}, {concurrency}")
        blocking += reads
        handlers += concurrency
    return ConnectionNeed(blocking_readers=blocking, handlers=handlers, multiplexed=multiplexed)


def pool_refusal(need: ConnectionNeed, max_connections: int, *, per_node: bool = False) -> str | None:
    """Why the pool is too small (one line with the number needed), or None when it is big enough."""
    if max_connections >= need.total:
        return None
    where = " per node" if per_node else ""
    return (
        f"REDIS_URL's max_connections={max_connections}{where} is below the {need.total} connections this "
        f"service holds at once ({need.describe()}): its readers would wait on each other and its handlers fail "
        f"with 'Too many connections'; raise max_connections to at least {need.total} or remove it from the URL "
        "(the default is 1024)"
    )
