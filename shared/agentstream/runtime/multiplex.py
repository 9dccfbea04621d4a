"""One shared connection for the commands that do not block: the commands a process's tasks issue
in one turn of its event loop leave in one write, and their replies are read as they come.

A service process has many handlers in flight (a consumer runs up to ``AGENTSTREAM_CONCURRENCY``
at once), each sending a command or two per step. Through redis-py's pool each command takes a
connection of its own, writes it (a ``send`` system call), waits for its own reply (a read, a task
wake-up) and gives the connection back: on the agent loop under load that was about a third of
its CPU. Here every such command is packed into a buffer that is written once per turn of the
event loop, and one reader task parses the replies with hiredis and hands each to its caller, in
order: Redis answers a connection's commands in the order they came (the RESP protocol's
pipelining, https://redis.io/docs/latest/develop/use/pipelining/). This is what ioredis calls
auto-pipelining and redis-rs a multiplexed connection; redis-py has no such client.

What goes through it (:data:`MULTIPLEXED`): the data commands the services send (scripts, stream
appends, acknowledgements, non-blocking reads, key and hash commands) and non-transaction
pipelines made only of such commands. Everything else keeps redis-py's pool: blocking reads
(``XREAD``/``XREADGROUP`` with ``BLOCK``, ``BLPOP``...), commands that change a connection's
state (``SELECT``, ``CLIENT ...``, ``WATCH``/``MULTI``), Pub/Sub, transactions. A Redis Cluster
client has one shared connection per node, for the commands whose keys :func:`command_keys`
finds, and its non-transaction pipelines of them (see ``agentstream.runtime.connection._Cluster``). A RESP3
client and a client without hiredis are not multiplexed at all.

Failures are those of one connection: when it is lost, or a reply takes longer than the socket
timeout, every command waiting on it raises redis-py's ``ConnectionError`` (``TimeoutError``),
and the next command connects again. As with any lost reply, a command that raised this way may
have run: agentstream's steps are idempotent for exactly that reason
(:mod:`agentstream.runtime.consumer`). A caller that stops waiting (its task cancelled) does not
take its command back once it is queued; its reply is read and dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from redis._parsers.base import BaseParser
from redis.asyncio.client import EMPTY_RESPONSE, NEVER_DECODE, Pipeline
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency; without it nothing is multiplexed
    hiredis = None  # type: ignore[assignment]  # the optional module's absence, tested as None below

log = logging.getLogger("agentstream.redis")

MULTIPLEXED = frozenset(
    {
        "EVALSHA",
        "EVAL",
        "EVALSHA_RO",
        "EVAL_RO",
        "SCRIPT LOAD",
        "SCRIPT EXISTS",
        "XADD",
        "XACK",
        "XRANGE",
        "XREVRANGE",
        "XLEN",
        "XPENDING",
        "XCLAIM",
        "XAUTOCLAIM",
        "XTRIM",
        "XDEL",
        "XINFO STREAM",
        "XINFO GROUPS",
        "XINFO CONSUMERS",
        "XREAD",
        "XREADGROUP",
        "GET",
        "SET",
        "DEL",
        "UNLINK",
        "EXISTS",
        "TYPE",
        "EXPIRE",
        "PEXPIRE",
        "TTL",
        "PTTL",
        "INCR",
        "INCRBY",
        "HGET",
        "HSET",
        "HMGET",
        "HGETALL",
        "HDEL",
        "HEXISTS",
        "HINCRBY",
        "HLEN",
        "ZADD",
        "ZREM",
        "ZSCORE",
        "ZCARD",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREMRANGEBYSCORE",
        "SADD",
        "SREM",
        "SMEMBERS",
        "SISMEMBER",
        "SCARD",
        "PING",
        "TIME",
    }
)
"""The commands (redis-py's command names) sent on the shared connection: none blocks the
connection or changes its state. ``XREAD`` and ``XREADGROUP`` only without ``BLOCK``."""

_ONE_KEY = frozenset(
    {
        "XADD",
        "XACK",
        "XRANGE",
        "XREVRANGE",
        "XLEN",
        "XPENDING",
        "XCLAIM",
        "XAUTOCLAIM",
        "XTRIM",
        "XDEL",
        "XINFO STREAM",
        "XINFO GROUPS",
        "XINFO CONSUMERS",
        "GET",
        "SET",
        "TYPE",
        "EXPIRE",
        "PEXPIRE",
        "TTL",
        "PTTL",
        "INCR",
        "INCRBY",
        "HGET",
        "HSET",
        "HMGET",
        "HGETALL",
        "HDEL",
        "HEXISTS",
        "HINCRBY",
        "HLEN",
        "ZADD",
        "ZREM",
        "ZSCORE",
        "ZCARD",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREMRANGEBYSCORE",
        "SADD",
        "SREM",
        "SMEMBERS",
        "SISMEMBER",
        "SCARD",
    }
)
"""The :data:`MULTIPLEXED` commands whose one key is their first argument (redis-py's command
names; on a Redis Cluster they are routed by that key's slot, see :func:`command_keys`)."""
_KEYS_ONLY = frozenset({"DEL", "UNLINK", "EXISTS"})  # every argument a key
_SCRIPTS = frozenset({"EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"})  # script, numkeys, keys..., args...

_BLOCKING_READS = frozenset({"XREAD", "XREADGROUP"})
_NOT_ENOUGH_DATA = object()
_READ_SIZE = 1 << 16


def multiplexed(args: tuple) -> bool:
    """Whether a command (redis-py's ``execute_command`` arguments) may go on the shared connection."""
    name = args[0]
    if name not in MULTIPLEXED:
        return False
    return name not in _BLOCKING_READS or not any(_is_block(arg) for arg in args[1:])


def command_keys(args: tuple) -> tuple | None:
    """The keys of a :data:`MULTIPLEXED` command that names keys → a tuple of one or more keys,
    or None for any other command (no key, keys found only by parsing, like a non-blocking
    ``XREAD``'s streams, or not multiplexed): on a Redis Cluster, what routes a command to the
    node of its slot without redis-py's command parsing. A script with no keys is None too."""
    name = args[0]
    if name in _ONE_KEY:
        return args[1:2] if len(args) > 1 else None
    if name in _SCRIPTS:
        try:
            count = int(args[2])
        except (IndexError, TypeError, ValueError):
            return None
        return tuple(args[3 : 3 + count]) if 0 < count <= len(args) - 3 else None
    if name in _KEYS_ONLY:
        return args[1:] if len(args) > 1 else None
    return None


_READ_OPTIONS = {"COUNT": 1, "BLOCK": 1, "NOACK": 0, "CLAIM": 1, "GROUP": 2}
"""The options of XREAD/XREADGROUP before ``STREAMS``, by how many arguments follow each."""


def read_stream_keys(args: tuple) -> tuple | None:
    """The stream keys of an ``XREAD``/``XREADGROUP`` (``args`` as sent, the command first) → a
    tuple of one or more keys, or None when ``args`` is not such a read or has a form this does
    not know (an option it does not know, no ``STREAMS``, keys and ids that do not pair up): on a
    Redis Cluster, what routes a read to the node of its slot without asking a node for its keys
    (redis-py's cluster client sends ``COMMAND GETKEYS`` first). A group or consumer named
    ``STREAMS`` is read as the name it is. Pure."""
    name = _word(args[0]) if args else None
    if name not in ("XREAD", "XREADGROUP"):
        return None
    index = 1
    while index < len(args):
        option = _word(args[index])
        if option == "STREAMS":
            rest = args[index + 1 :]
            if not rest or len(rest) % 2:
                return None
            return tuple(rest[: len(rest) // 2])
        if option not in _READ_OPTIONS or (option == "GROUP") != (name == "XREADGROUP" and index == 1):
            return None
        index += 1 + _READ_OPTIONS[option]
    return None


def _word(arg: Any) -> str | None:
    """An argument as an upper-case word, or None when it is not text."""
    if isinstance(arg, bytes):
        try:
            return arg.decode().upper()
        except UnicodeDecodeError:
            return None
    return arg.upper() if isinstance(arg, str) else None


class NodeConnections:
    """The part of a connection pool that :class:`SharedConnection` uses, for one node of a
    Redis Cluster (redis-py's ``ClusterNode``): its connection class and options, so the shared
    connection is made, authenticated and named as the node's pooled connections are."""

    def __init__(self, node) -> None:
        self._node = node
        self.connection_kwargs = node.connection_kwargs

    def make_connection(self):
        return self._node.connection_class(**self._node.connection_kwargs)


def _is_block(arg: Any) -> bool:
    """Whether an argument is XREAD's/XREADGROUP's ``BLOCK`` token (Redis reads it in any case)."""
    return isinstance(arg, (bytes, str)) and len(arg) == 5 and arg.upper() in (b"BLOCK", "BLOCK")


_PARSE_ERROR = BaseParser.parse_error  # redis-py's error reply → exception class (NOSCRIPT → NoScriptError...)
_PACKER = HiredisRespSerializer()


class SharedConnection:
    """The multiplexed connection of one client (see the module docstring).

    Made from the client's pool settings (its connection class, URL options, client name,
    database, credentials and TLS), connected on first use and again after a failure; bound to
    the event loop that connected it (a client used from another loop connects again there).

    Args:
        pool: the client's connection pool, whose ``make_connection`` gives the connection
            (redis-py does the handshake; this then owns its socket).
        timeout_s: the longest wait, in seconds, for the next reply of a waiting command (the
            client's socket timeout); past it the connection is closed and every waiting command
            raises ``TimeoutError``.
    """

    def __init__(self, pool, *, timeout_s: float | None) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future | None = None
        self._connection = None  # redis-py's connection, for its socket and its description
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._replies: hiredis.Reader | None = None
        self._out: list[bytes] = []
        self._waiting: collections.deque = collections.deque()  # the futures of the commands written, in order
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_data_at = 0.0  # when a reply last came, or the first of the waiting commands was written
        self._batch = 0  # commands queued since the last write
        self.connects = 0
        """How many times it has connected (1 plus its reconnects)."""

    def usable(self) -> bool:
        """Whether it is connected on the running event loop (:meth:`submit` may be called now)."""
        return self._writer is not None and self._loop is asyncio.get_running_loop()

    async def ready(self) -> None:
        """Connect, unless connected on this event loop already.

        Callers that arrive while another connects wait for its connection; if that caller is
        cancelled meanwhile, one of them connects instead (they do not fail for its cancellation).

        Raises:
            redis.exceptions.ConnectionError, TimeoutError, AuthenticationError: as redis-py's
            ``Connection.connect`` does (every caller waiting for that connect raises it).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or another event loop: nothing of the old one is usable here
            self._forget()
            self._loop = loop
        while self._writer is None:
            if self._connecting is None:
                self._connecting = loop.create_future()
                connecting = self._connecting
                try:
                    await self._connect()
                except Exception as exc:
                    if not connecting.done():
                        connecting.set_exception(exc)
                        connecting.exception()  # retrieved: other waiters get it from their own await
                    raise
                except BaseException:  # this caller was cancelled, not the connection: a waiter connects instead
                    if not connecting.done():
                        connecting.set_result(None)
                    raise
                finally:
                    self._connecting = None
                if not connecting.done():
                    connecting.set_result(None)
            else:
                await asyncio.shield(self._connecting)

    async def _connect(self) -> None:
        connection = self._pool.make_connection()
        await connection.connect()  # redis-py's handshake: AUTH, HELLO/SELECT, CLIENT SETNAME
        self._connection = connection
        self._writer = connection._writer
        reader = connection._reader
        self._replies = hiredis.Reader(
            protocolError=InvalidResponse, replyError=_PARSE_ERROR, notEnoughData=_NOT_ENOUGH_DATA
        )
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, self._writer))
        self.connects += 1

    def submit(self, args: tuple) -> asyncio.Future:
        """Queue one command (connected: after :meth:`ready`, in the same turn of the event loop)
        → the future of its raw reply (an error reply is an exception *value*, as hiredis gives it).

        Raises:
            redis.exceptions.DataError: an argument Redis has no form for (as redis-py's packer).
        """
        return self.submit_packed(pack(args))

    def submit_packed(self, command: bytes) -> asyncio.Future:
        """:meth:`submit` of a command packed already (:func:`pack`): a pipeline packs all its
        commands first, so one with an argument Redis has no form for sends none of them."""
        assert self._writer is not None and self._loop is not None
        self._out.append(command)
        future = self._loop.create_future()
        self._waiting.append(future)
        self._batch += 1
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_handle = None
        writer = self._writer
        if writer is None or not self._out:
            return
        assert self._loop is not None  # set with the writer
        data, self._out = b"".join(self._out), []
        if writer.is_closing():
            self._fail(RedisConnectionError(f"Error while writing to {self._where()}: the connection is closed."))
            return
        writer.write(data)
        batch, self._batch = self._batch, 0
        if len(self._waiting) == batch:  # nothing was waiting before this write: the wait starts now
            self._last_data_at = self._loop.time()
        if self._timer is None and self._timeout_s:
            self._timer = self._loop.call_later(self._timeout_s, self._check_timeout)

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._waiting or self._writer is None:
            return
        assert self._loop is not None and self._timeout_s is not None  # the timer is set only with both
        waited_s = self._loop.time() - self._last_data_at
        if waited_s >= self._timeout_s:  # a write the socket has not taken yet, or a reply that did not come
            unsent = self._writer.transport.get_write_buffer_size()
            self._fail(
                RedisTimeoutError(
                    f"Timeout writing to {self._where()} ({unsent} bytes unsent)"
                    if unsent
                    else f"Timeout reading from {self._where()}"
                )
            )
            return
        self._timer = self._loop.call_later(self._timeout_s - waited_s, self._check_timeout)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        replies = self._replies
        waiting = self._waiting
        assert replies is not None and self._loop is not None  # both set before this task starts
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise RedisConnectionError(
                        f"Error while reading from {self._where()}: Connection closed by server."
                    )
                self._last_data_at = self._loop.time()
                replies.feed(data)
                while (reply := replies.gets()) is not _NOT_ENOUGH_DATA:
                    if not waiting:
                        raise InvalidResponse(f"a reply from {self._where()} that no command asked for: {reply!r:.200}")
                    future = waiting.popleft()
                    if not future.done():  # a caller that stopped waiting: its reply is dropped
                        future.set_result(reply)
        except asyncio.CancelledError:
            if self._writer is writer:
                self._fail(RedisConnectionError(f"the connection to {self._where()} was closed"))
            raise
        except Exception as exc:  # a lost connection, or bytes that are not RESP
            if self._writer is writer:
                error = (
                    exc
                    if isinstance(exc, RedisConnectionError)
                    else RedisConnectionError(f"Error while reading from {self._where()}: {exc}")
                )
                self._fail(error)

    def _where(self) -> str:
        connection = self._connection
        if connection is None:
            return "Redis"
        path = getattr(connection, "path", None)
        return path or f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"

    def _fail(self, error: Exception) -> None:
        """Close the connection: every waiting command raises ``error``; the next one connects again."""
        waiting, self._waiting = self._waiting, collections.deque()
        self._out, self._batch = [], 0
        writer, self._writer = self._writer, None
        task, self._reader_task = self._reader_task, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if writer is not None:
            writer.transport.abort()
        if self._connection is not None:  # its socket is closed: redis-py's connection holds nothing open
            self._connection._reader = self._connection._writer = None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        for future in waiting:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that stopped waiting leaves no "never retrieved" log
        if waiting:
            log.debug("shared connection to %s closed with %d commands waiting: %s", self._where(), len(waiting), error)

    def _forget(self) -> None:
        """Drop a connection of another event loop without touching its objects (that loop may be closed)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.transport.abort()  # the socket closes at once; the old loop's callbacks are not run
        if self._connection is not None:
            self._connection._reader = self._connection._writer = None
        self._writer = None
        self._reader_task = None
        self._timer = None
        self._flush_handle = None
        self._connecting = None
        self._out, self._batch = [], 0
        self._waiting = collections.deque()

    async def aclose(self) -> None:
        """Close the connection (waiting commands raise ``ConnectionError``)."""
        if self._loop is asyncio.get_running_loop():
            task = self._reader_task
            self._fail(RedisConnectionError(f"the client of {self._where()} was closed"))
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
        else:
            self._forget()


def pack(args: tuple) -> bytes:
    """A command in RESP, packed as the pooled connections pack it (redis-py's hiredis packer).

    redis-py's packer splits a command name of several words and copies every argument to turn
    a ``bytearray`` or ``memoryview`` into bytes (a generator over the arguments, for every
    command), then calls ``hiredis.pack_command``. A one-word name goes to ``hiredis.pack_command``
    directly; an argument it does not take (a ``bytearray``; None or another type Redis has no
    form for) raises its TypeError, and the command is packed again by redis-py's packer, which
    converts it or raises what redis-py raises.

    Raises:
        redis.exceptions.DataError: an argument Redis has no form for (None, a dict...).
    """
    name = args[0]
    if hiredis is not None and ((type(name) is str and " " not in name) or (type(name) is bytes and b" " not in name)):
        try:
            return hiredis.pack_command(args)
        except TypeError:
            pass
    return b"".join(_PACKER.pack(*args))


def finish(client, command_name: str | bytes, reply: Any, options: Mapping[str, Any]) -> Any:
    """A raw reply → what redis-py's ``execute_command`` returns for it (its response callback
    applied); an error reply is raised. Mirrors ``redis.asyncio.Redis.parse_response`` and
    redis-py's hiredis parser: an error reply that redis-py maps to a ``ConnectionError``
    (``LOADING`` → ``BusyLoadingError``, ``NOAUTH``/``WRONGPASS`` → ``AuthenticationError``, ``ERR
    max number of clients reached``), alone or first in an array, is raised as it is (not
    returned, whatever ``EMPTY_RESPONSE`` says); the shared connection stays up (its replies
    are still in step)."""
    if isinstance(reply, RedisConnectionError):
        raise reply
    if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
        raise reply[0]
    if isinstance(reply, ResponseError):
        if EMPTY_RESPONSE in options:
            return options[EMPTY_RESPONSE]
        raise reply
    if options:
        options = {k: v for k, v in options.items() if k not in ("keys", EMPTY_RESPONSE, NEVER_DECODE)}
    callback = client.response_callbacks.get(command_name)
    return reply if callback is None else callback(reply, **options)


def available(pool) -> bool:
    """Whether a client with this pool can multiplex: hiredis is installed and the client speaks RESP2."""
    protocol = pool.connection_kwargs.get("protocol")
    return hiredis is not None and protocol in (None, 2, "2")


class MultiplexedPipeline(Pipeline):
    """A redis-py pipeline whose non-transaction batches of :data:`MULTIPLEXED` commands go on the
    client's shared connection (queued in one turn of the event loop, so in one write with
    whatever else is queued then); any other pipeline runs as redis-py's does."""

    def __init__(self, shared: SharedConnection, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shared = shared

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if (
            self.is_transaction
            or self.explicit_transaction
            or self.watching
            or self.scripts
            or not stack
            or not all(multiplexed(args) for args, _options in stack)
        ):
            return await super().execute(raise_on_error)
        try:
            if not self._shared.usable():
                await self._shared.ready()
            packed = [pack(args) for args, _options in stack]  # a bad argument raises before anything is sent
            futures = [self._shared.submit_packed(command) for command in packed]
            replies = [await future for future in futures]  # a lost connection raises here, as in redis-py's pipeline
            response = []
            for (args, options), reply in zip(stack, replies, strict=True):
                try:
                    value = finish(self, args[0], reply, options)
                    response.append(await value if inspect.isawaitable(value) else value)
                except ResponseError as exc:
                    response.append(exc)
            if raise_on_error:
                self.raise_first_error(stack, response)
            return response
        finally:
            await self.reset()
