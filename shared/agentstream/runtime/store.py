"""The trace store: the only code that reads and writes traces in Redis.

A trace is one Redis stream (``Keys.trace``). Every append carries an idempotency key; the check
and the XADD run in one Lua script on keys of the same hash slot, so an effect is recorded once
however often the step that makes it runs. An append may also carry a fencing token: it then
succeeds only while that token is the trace's current lease (a stale holder cannot append).
Every append runs one script, ``lua/append.lua``: :meth:`TraceStore.append_and_read` (and the
methods built on it) for the runtime's appends, :meth:`TraceStore.apply` for an agent-loop
step's effects, which on one Redis server may also publish what the step leaves waiting and
release the lease in that script.

Idempotency keys used by the services (see :func:`key_for`):

- ``turn:<turn_id>`` for TurnInput, ``model:<turn_id>:<step>`` for ModelOutput,
  ``result:<call_id>`` for ToolOutput (``late:<call_id>`` for a late one: a call has one
  result), ``end:<turn_id>`` for TurnEnded and TurnFailed (a turn has one ending),
  ``started:<call_id>`` for ToolStarted, ``cancel:<turn_id>`` for CancelRequested,
  ``tools:<turn_id>:<step>:<agent>:<digest>`` for ToolsOffered, ``awaiting:<call_id>`` for
  ApprovalAwaited, ``approval:<call_id>`` for ApprovalDecided (a call has one decision).

Besides appends, :meth:`TraceStore.begin_call` checks a tool job's call against the call
markers its model output set (``call:<call_id>``, :func:`markers_for`) and claims the call for
one tool job (the ``claim:<call_id>`` marker), so a call published or delivered twice runs once,
and a job that names no call of its trace never runs; it reads no event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from agentstream.errors import StaleLeaseError
from agentstream.runtime.entries import entry_fields, keep_doubled_fields
from agentstream.runtime.lua import script
from agentstream.runtime.operations import Entry, Hint, queue_hint, redirect_refused_replies, send_hint
from agentstream.wire import codec
from agentstream.wire import codec as _codec
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    CancelRequested,
    Event,
    ForkedFrom,
    ModelOutput,
    ToolOutput,
    ToolsOffered,
    ToolStarted,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.keys import Keys

log = logging.getLogger("agentstream.runtime.store")

# The Lua scripts of the store, one per operation (agentstream/runtime/lua/<name>.lua).
_APPEND_LUA = script("append")
_TAKE_ONLY_LUA = script("take")
_ADMIT_LUA = script("admit_turn")
_ACQUIRE_LUA = script("acquire")
_RENEW_LUA = script("renew")
_RELEASE_LUA = script("release")
_BEGIN_CALL_LUA = script("begin_call")
_FORK_LUA = script("fork")


def turn_digest(turn: TurnInput) -> str:
    """A digest of a turn's input (hex, 32 characters; its fields in sorted order), stored at
    admission so a copy of the turn with another body is told from a true copy. ``rolls_back`` is
    not part of it: the admission adds it (busy policy ``rollback``), not the publisher."""
    if turn.rolls_back is not None:
        turn = msgspec.structs.replace(turn, rolls_back=None)
    return hashlib.sha256(msgspec.json.encode(turn, order="sorted")).hexdigest()[:32]


def key_for(event: Event) -> str:
    """The idempotency key of an event (see the module docstring)."""
    match event:
        case TurnInput(turn_id=turn_id):
            return f"turn:{turn_id}"
        case ModelOutput(turn_id=turn_id, step=step):
            return f"model:{turn_id}:{step}"
        case ToolOutput(call_id=call_id, late=late):
            return f"late:{call_id}" if late else f"result:{call_id}"
        case TurnEnded(turn_id=turn_id) | TurnFailed(turn_id=turn_id):
            return f"end:{turn_id}"
        case ToolStarted(call_id=call_id):
            return f"started:{call_id}"
        case CancelRequested(turn_id=turn_id):
            return f"cancel:{turn_id}"
        case ToolsOffered(turn_id=turn_id, step=step, agent=agent, digest=digest):
            return f"tools:{turn_id}:{step}:{agent}:{digest}"
        case ForkedFrom():
            return "forked_from"
        case ApprovalAwaited(call_id=call_id):
            return f"awaiting:{call_id}"
        case ApprovalDecided(call_id=call_id):
            return f"approval:{call_id}"
    raise TypeError(f"no idempotency key for event type {type(event).__name__}")


def arguments_digest(arguments: str) -> str:
    """A digest of a tool call's raw arguments text (hex, 32 characters of SHA-256 over its
    UTF-8 bytes), kept in the call's marker so a job's arguments are checked against the
    call's without reading the trace."""
    return hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def markers_for(event: Event) -> list[tuple[str, str]]:
    """The markers set in the trace's key hash when ``event`` is appended (atomically with it):
    ``call:<call id>`` → ``<turn id>\n<tool name>\n<arguments digest>`` for each tool call of a
    model output, so a tool job's call is checked in O(1) (:meth:`TraceStore.begin_call`).

    A call that awaits approval is marked ``gate:<call id>`` → ``1`` (no job of it may run), and
    its approval sets the mark to ``0`` (with edited arguments, the call's marker then carries
    their digest: the job runs with them); a denial leaves it at ``1``."""
    if isinstance(event, ModelOutput) and event.tool_calls:
        return [
            (f"call:{call.id}", f"{event.turn_id}\n{call.name}\n{arguments_digest(call.arguments)}")
            for call in event.tool_calls
        ]
    if isinstance(event, ApprovalAwaited):
        return [(f"gate:{event.call_id}", "1")]
    if isinstance(event, ApprovalDecided) and event.approved:
        marks = [(f"gate:{event.call_id}", "0")]
        if event.arguments is not None:
            marks.append(
                (f"call:{event.call_id}", f"{event.turn_id}\n{event.name}\n{arguments_digest(event.arguments)}")
            )
        return marks
    return []


@dataclass(frozen=True)
class Appended:
    """The outcome of one append.

    Attributes:
        entry_id: the stream id of the event (the first append's id when it was already there).
        created: False when an event with the same idempotency key was already in the trace.
    """

    entry_id: str
    created: bool


@dataclass(frozen=True)
class Publication:
    """What a step publishes with its append, on one Redis server (:meth:`TraceStore.apply`).

    Attributes:
        entries: ``[(call id or "", stream, field, payload)]`` to XADD in order; a call id names
            a tool job, recorded for the watchdog (of the appended output's turn).
        marks: the key-hash markers that say the entries went out (a step's jobs marker,
            ``reply:<turn id>``).
        awaiting_key: the watchdog's sorted set of waiting traces for the trace.
        ack: ``(stream, group, attempts key, entry id)``: the work entry the step handles,
            acknowledged (and its attempts counter dropped, as
            :class:`agentstream.runtime.consumer.StreamConsumer` does) when the lease is
            released: the handler's work is then done. Not when the lease is kept, nor when the
            stream or its counters hold another type (the consumer then acknowledges). None:
            nothing to acknowledge.
    """

    entries: Sequence[tuple[str, str, bytes, bytes]]
    marks: Sequence[str]
    awaiting_key: str
    ack: tuple[str, str, str, str] | None = None


@dataclass(frozen=True)
class Read:
    """Entries of a trace read after an id, with the trace's first entry id.

    Attributes:
        first_id: the id of the trace's first entry, or None when the trace has no entry (a
            reader that folded the trace compares it, so it sees a trace deleted and started again).
        entries: ``(entry id, event)`` pairs, oldest first.
        sizes: the stored bytes of each entry's event.
        complete: False when the read stopped at its count and more entries may follow.
    """

    first_id: str | None
    entries: list[tuple[str, Event]]
    sizes: list[int]
    complete: bool = True


@dataclass(frozen=True)
class Applied:
    """The outcome of :meth:`TraceStore.apply`.

    Attributes:
        appended: one per event appended and conditional event (None for one left out).
        read: what came after the id the step read up to, the appended events included.
        outcome: ``"released"`` or ``"dirty"`` (published, the lease kept: a hint came) when the
            publication went out; None when there was none or it did not go out.
        entry_ids: the ids of the entries published, in their order (``[]`` when none went out).
        acknowledged: the publication's work entry was acknowledged with the release.
    """

    appended: list[Appended | None]
    read: Read
    outcome: str | None = None
    entry_ids: list[str] = dataclasses.field(default_factory=list)
    acknowledged: bool = False


@dataclass(frozen=True)
class Taken:
    """The outcome of :meth:`TraceStore.take` (or of a turn's admission that took the trace).

    Attributes:
        token: the fencing token of the lease now held, or None when not taken.
        holder: the holder's token when another holds the lease ("" when not known).
        left_ms: how long the holder's lease has left, in ms (0 when taken or empty).
        read: what was read after ``after`` once taken (None when not taken).
        empty: the trace has no stream (nothing to take).
    """

    token: int | None
    holder: str = ""
    left_ms: int = 0
    read: Read | None = None
    empty: bool = False


@dataclass(frozen=True)
class Admitted:
    """The outcome of :meth:`TraceStore.admit_turn`.

    Attributes:
        ended: the turn ended before (nothing was appended or taken).
        first_entry: for an ended turn, the id of the turns-stream entry that first brought it.
        created: the TurnInput was appended now (False: it was in the trace already).
        taken: the lease outcome when the admission was asked to take the trace, else None.
        absorbed: for an ended turn, this entry brought a copy of the turn while it ran (before
            its ending was written): its reply is the turn's own, not to be published again.
        differs: this entry's turn is not the admitted one (another digest of its TurnInput):
            a conflicting copy, absorbed all the same (said once per copy entry while the turn
            runs; for every entry that finds it ended).
        full: for a new turn refused because the trace has ``max_open`` turns admitted and not
            ended, that count (nothing was appended or taken); else None.
    """

    ended: bool
    first_entry: str = ""
    created: bool = False
    taken: Taken | None = None
    absorbed: bool = False
    differs: bool = False
    full: int | None = None


@dataclass(frozen=True)
class CallState:
    """What the trace says about a tool call when a job for it arrives (:meth:`TraceStore.begin_call`).

    Attributes:
        has_result: the call already has its result.
        cancelled: its turn was cancelled.
        turn_ended: its turn has ended.
        started: a ToolStarted was recorded (a tool with side effects began running it).
        holder: the job (``<stream>/<entry id>``) that holds the call's claim, or ``""``.
        claimed: this job holds the claim (it was free, or this job took it before).
        problem: why the job names no call that may run (no such trace, turn or call, another
            tool), or ``""``; nothing else is looked at then.
        unchecked: the trace has no marker of the call (a model output appended before call
            markers existed, or no such call): the caller reads the turn to decide.
        turn_entry: the id of the turn's input entry (where such a read starts).
        run_holder: the runner holding the call's run key when another does (``""``: free, or
            taken now for the caller's runner; see ``run_taken``).
        run_left_ms: how long that runner's key has left, in ms.
        run_taken: the caller's runner now holds the run key.
    """

    has_result: bool
    cancelled: bool
    turn_ended: bool
    started: bool
    holder: str
    claimed: bool
    problem: str = ""
    unchecked: bool = False
    turn_entry: str = ""
    run_holder: str = ""
    run_left_ms: int = 0
    run_taken: bool = False

    @property
    def should_skip(self) -> bool:
        """Nothing to run: answered already, or its turn is over or being cancelled."""
        return self.has_result or self.cancelled or self.turn_ended


class TraceStore:
    """Reads and writes traces.

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        keys: the key names (namespace).
        codec: reads the app's own element and event types (default: built-in types only).
        read_count: the most entries one step's script reads back (more are read with XRANGE).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys | None = None,
        *,
        codec: codec.TraceCodec | None = None,
        read_count: int = 1000,
    ):
        self.redis = keep_doubled_fields(redis)  # a trace entry that repeats a field is refused, not half-read
        self.keys = keys or Keys()
        self.codec = codec if codec is not None else _codec.DEFAULT_CODEC
        self.read_count = read_count
        self._append_script = redis.register_script(_APPEND_LUA)
        self._take_script = redis.register_script(_TAKE_ONLY_LUA)
        self._admit_script = redis.register_script(_ADMIT_LUA)
        self._acquire_script = redis.register_script(_ACQUIRE_LUA)
        self._release_script = redis.register_script(_RELEASE_LUA)
        self._begin_call_script = redis.register_script(_BEGIN_CALL_LUA)
        self._renew_script = redis.register_script(_RENEW_LUA)
        self._fork_script = redis.register_script(_FORK_LUA)
        # asked at every step: the client's kind once (an isinstance of redis-py's cluster class
        # goes through ABCMeta, a few microseconds a call)
        self._one_server = not isinstance(self.redis, RedisCluster)

    @property
    def one_server(self) -> bool:
        """Whether the store talks to one Redis server (not a Redis Cluster): a script may then
        write keys of several hash slots (:meth:`apply` with a :class:`Publication`)."""
        return self._one_server

    def _trace_keys(self, trace_id: str) -> list[str]:
        k = self.keys
        return [k.trace(trace_id), k.trace_keys(trace_id), k.lease(trace_id), k.dirty(trace_id)]

    async def append(
        self,
        trace_id: str,
        event: Event,
        *,
        key: str | None = None,
        fence: int | None = None,
        release: tuple[str, str] | None = None,
        hints: Sequence[Hint] = (),
        failed_hints: list[Hint] | None = None,
    ) -> Appended:
        """Append one event once.

        Args:
            trace_id: the trace.
            event: the event.
            key: the idempotency key; defaults to :func:`key_for` of the event.
            fence: the fencing token of the caller's lease, or None for an unfenced append.
            release: a run key to delete in the same step (see :meth:`append_and_read`).
            hints, failed_hints: hints XADDed right after the append (see :meth:`append_and_read`).

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease.
        """
        (result,) = await self.append_many(
            trace_id,
            [event],
            keys=[key] if key else None,
            fence=fence,
            release=release,
            hints=hints,
            failed_hints=failed_hints,
        )
        return result

    async def append_many(
        self,
        trace_id: str,
        events: Sequence[Event],
        *,
        keys: Sequence[str] | None = None,
        fence: int | None = None,
        unless: str | None = None,
        release: tuple[str, str] | None = None,
        hints: Sequence[Hint] = (),
        failed_hints: list[Hint] | None = None,
    ) -> list[Appended]:
        """Append several events in order, each once, in one round trip and atomically.

        Args:
            unless: an idempotency key; when the trace already holds it, nothing is appended
                and the result is empty.
            hints, failed_hints: hints XADDed right after the append (see :meth:`append_and_read`).

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease (nothing is appended).
        """
        if not events:
            return []
        appended, _ = await self.append_and_read(
            trace_id,
            events,
            keys=keys,
            fence=fence,
            unless=unless,
            release=release,
            hints=hints,
            failed_hints=failed_hints,
        )
        return appended  # type: ignore[return-value]

    async def append_and_read(
        self,
        trace_id: str,
        events: Sequence[Event],
        *,
        then: Sequence[Event] = (),
        keys: Sequence[str] | None = None,
        fence: int | None = None,
        after: str | None = None,
        expire_ms: int | None = None,
        unless: str | None = None,
        release: tuple[str, str] | None = None,
        hints: Sequence[Hint] = (),
        failed_hints: list[Hint] | None = None,
    ) -> tuple[list[Appended | None], Read | None]:
        """Append ``events`` (each once, in order), then ``then`` if nothing else was appended
        since ``after``, and read back what came after ``after``: one round trip, atomically.

        Args:
            events: appended in order, each once by its idempotency key.
            then: appended after ``events`` only when the trace's last entry is still ``after``
                (a step that decided them from a trace read up to ``after``); else left out.
            keys: the idempotency keys of ``events`` and ``then``; default :func:`key_for`.
            fence: the caller's lease token, or None for an unfenced append.
            after: read back the entries after this id (exclusive), with the first entry id;
                None reads nothing back.
            expire_ms: when anything is appended, the trace and its key hash expire this many
                ms from now (the retention of whole conversations); None leaves expiry alone.
            unless: an idempotency key; when the trace already holds it, nothing is appended
                and ``appended`` is empty.
            release: ``(run key, holder)``: in the same step, delete that key (in the trace's
                hash slot) if ``holder`` still holds it (a tool call's run key, see
                :class:`agentstream.runtime.call_runs.CallRuns`).
            hints: ``(stream, fields)`` entries XADDed (or wake-ups routed to their owner, each one
                script: :class:`~agentstream.runtime.operations.RoutedWake`) just after the append, in the same round
                trip (one pipeline without a transaction), whatever the append's outcome: wake-up
                hints that what was appended is there (a hint is never state: one that finds
                nothing new costs a look). On a Redis Cluster they are sent after the append's
                own round trip instead (a cluster pipeline runs each node's commands at once, so a
                hint could overtake the append): as if they had failed. Without ``failed_hints`` a
                hint that fails raises its error after the append's outcome is known.
            failed_hints: a list that receives the hints whose XADD failed, for the caller to
                publish again (or report) once it has dealt with the append's outcome.

        Each model output's tool calls are marked in the key hash as it is appended
        (:func:`markers_for`). The script is :meth:`apply`'s, without a publication.

        Returns:
            ``(appended, read)``: one :class:`Appended` per event of ``events`` and ``then``
            (None for one of ``then`` left out), and the read (None when ``after`` is None).

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease (nothing is appended).
            SchemaVersionError, EventDecodeError: an entry read back cannot be decoded.
        """
        if then and after is None:
            raise ValueError("conditional appends (then=) need after=: the id the step read up to")
        argv = self._append_args(
            [*events, *then], len(then), fence=fence, after=after, expire_ms=expire_ms, unless=unless, release=release
        )
        argv += self._event_args([*events, *then], keys)
        script_keys = [*self._trace_keys(trace_id)[:3], release[0] if release else self.keys.trace(trace_id)]
        failed: list[Hint] = []
        if hints and self._one_server:
            raw_out, raw_first, raw_entries = await self._append_then_hint(script_keys, argv, hints, failed)
        else:  # on a cluster a pipeline runs each node's part at once: a hint there must not overtake the append
            raw_out, raw_first, raw_entries = await self._append_script(keys=script_keys, args=argv)
            failed.extend(hints)
        try:
            appended = self._appended(trace_id, fence, after, raw_out, raw_first, raw_entries)
        finally:
            if failed_hints is not None:
                failed_hints.extend(failed)
        if failed_hints is None:
            for hint in failed:  # published again on their own: raises what refuses them
                await send_hint(self.redis, hint)
        return appended

    def _append_args(
        self, everything, then_count: int, *, fence, after, expire_ms, unless, release, publish: Sequence = ()
    ) -> list:
        """The arguments of the append script (see lua/append.lua) before its events, for
        ``everything`` it appends (its events, then ``then``), written under
        :func:`codec.entry_version`: eight, then the count of ``publish`` (the publication's
        arguments; none: a plain append) and ``publish``."""
        return [
            "" if fence is None else str(fence),
            codec.entry_version(everything),
            after or "",
            then_count,
            "" if expire_ms is None else str(max(1, int(expire_ms))),
            self.read_count,
            unless or "",
            release[1] if release else "",
            len(publish),
            *publish,
        ]

    @staticmethod
    def _event_args(everything: Sequence[Event], keys: Sequence[str] | None) -> list:
        """Per event: its idempotency key, its bytes, its marker count and its markers."""
        idem = list(keys) if keys is not None else [key_for(e) for e in everything]
        argv: list = []
        for k, event in zip(idem, everything, strict=True):
            markers = markers_for(event)
            argv += [k, codec.encode(event), len(markers)]
            for field, value in markers:
                argv += [field, value]
        return argv

    async def apply(
        self,
        trace_id: str,
        events: Sequence[Event],
        *,
        then: Sequence[Event] = (),
        fence: int,
        after: str,
        expire_ms: int | None = None,
        publication: Publication | None = None,
    ) -> Applied:
        """Apply a step's effects under its lease in one script (lua/append.lua), one round trip:
        append ``events`` (each once), then ``then`` if nothing came into the trace since
        ``after``, read back what came after ``after``, and with a ``publication``, publish what
        the step leaves waiting and give the lease back, provided this call appended every event
        and nothing came into the trace since ``after``.

        The publication goes out under the lease (checked first: a fenced-off step publishes
        nothing), so a tool job never carries a call the trace does not hold and a reply never
        answers an ending that was left out. What it writes is what
        :meth:`publish_and_release` and :func:`agentstream.runtime.watchdog.record_jobs` write:
        each entry's XADD, the markers in the trace's key hash, for the tool jobs (entries with a
        call id) the ``awaited`` record and the trace in the awaiting set scored by the time in
        ms, then the release (kept when a hint came meanwhile, its dirty mark cleared), and the
        acknowledgement of the work entry the step handles when the lease is released. A
        publication needs one Redis server (:attr:`one_server`): the streams published to and
        the awaiting set are other hash slots; on a Redis Cluster a step appends without one,
        then calls :meth:`publish_and_release`.

        Args:
            trace_id: the trace.
            events: appended in order, each once by its idempotency key (:func:`key_for`).
            then: appended after them only when the trace's last entry is still ``after``.
            fence: the lease's fencing token.
            after: the id the step read the trace up to (its fold's last entry).
            expire_ms: as :meth:`append_and_read`.
            publication: what to publish with the append and release, or None.

        Returns:
            :class:`Applied`: one :class:`Appended` per event of ``events`` and ``then`` (None
            for one of ``then`` left out), what came after ``after`` (the appended events
            included), and for a publication its outcome: ``"released"`` or ``"dirty"`` with the
            entry ids when the entries went out, or None with ``[]`` when none did: an event was
            there already, one of ``then`` was left out, another entry came first, or a stream
            (or the awaiting set) holds another type, as every one is checked before the first
            XADD (logged): nothing is published, no marker set, the lease held. Last, whether
            the publication's ``ack`` entry was acknowledged.

        Raises:
            StaleLeaseError: ``fence`` is not the trace's current lease (nothing is written).
            ValueError: a publication with no entry, or on a Redis Cluster.
            SchemaVersionError, EventDecodeError: an entry read back cannot be decoded.
        """
        everything = [*events, *then]
        keys = [*self._trace_keys(trace_id)[:3], self.keys.trace(trace_id)]
        publish: list = []
        if publication is not None:
            if not publication.entries:
                raise ValueError("a publication needs at least one entry to publish")
            if not self.one_server:
                raise ValueError("a publication with the append needs one Redis server, not a cluster")
            keys += self._publication_keys(trace_id, publication)
            publish = self._publication_args(trace_id, publication, events[0].turn_id if events else "")
        argv = self._append_args(
            everything,
            len(then),
            fence=fence,
            after=after,
            expire_ms=expire_ms,
            unless=None,
            release=None,
            publish=publish,
        )
        reply = await _run_script(self.redis, self._append_script, keys, [*argv, *self._event_args(everything, None)])
        appended, read = self._appended(trace_id, fence, after, *reply[:3])  # raises when fenced off
        assert read is not None
        if publication is None:
            return Applied(appended, read)
        code, raw_ids, acked = int(reply[3]), reply[4], bool(int(reply[5]))
        if code == -3:
            log.warning(
                "trace %s: nothing published with the append (%s); the step loop publishes again",
                trace_id,
                _text(raw_ids[0]),
            )
        outcome = {1: "released", 2: "dirty"}.get(code)
        return Applied(appended, read, outcome, [_text(i) for i in raw_ids] if outcome else [], acked)

    def _publication_keys(self, trace_id: str, publication: Publication) -> list[str]:
        """The keys of the append script after the trace's four (see lua/append.lua)."""
        ack_stream, _group, attempts, _entry_id = publication.ack or (
            self.keys.trace(trace_id),
            "",
            self.keys.trace(trace_id),
            "",
        )
        return [
            self.keys.dirty(trace_id),
            publication.awaiting_key,
            ack_stream,
            attempts,
            *(stream for _call_id, stream, _field, _payload in publication.entries),
        ]

    @staticmethod
    def _publication_args(trace_id: str, publication: Publication, turn_id: str) -> list:
        """The publication's arguments of the append script (a job's turn: ``turn_id``)."""
        jobs = any(call_id for call_id, _stream, _field, _payload in publication.entries)
        _stream, group, _attempts, entry_id = publication.ack or ("", "", "", "")
        marks = publication.marks
        out: list = [trace_id, int(time.time() * 1000) if jobs else "", group, entry_id, len(marks), *marks]
        for call_id, _stream, field, payload in publication.entries:
            out += [call_id, turn_id, field, payload]
        return out

    async def _append_then_hint(self, script_keys: list, argv: list, hints: Sequence[Hint], failed: list[Hint]):
        """The append script, then each hint (its XADD, or a routed wake-up's script), in one
        pipeline → the script's answer; the hints that failed go to ``failed``."""
        pipe = self.redis.pipeline(transaction=False)
        # EVALSHA queued as a plain command, as in release_lease
        pipe.execute_command("EVALSHA", self._append_script.sha, len(script_keys), *script_keys, *argv)
        for hint in hints:
            queue_hint(pipe, hint)
        answers = await pipe.execute(raise_on_error=False)
        first = answers[0]
        if isinstance(first, NoScriptError):  # the server lost its scripts: the hints ran too early
            first = await self._append_script(keys=script_keys, args=argv)
            failed.extend(hints)
        elif isinstance(first, Exception):
            raise first
        else:
            failed.extend(
                hint for hint, answer in zip(hints, answers[1:], strict=True) if isinstance(answer, Exception)
            )
        return first

    def _appended(self, trace_id: str, fence: int | None, after: str | None, raw_out, raw_first, raw_entries):
        if raw_out and int(raw_out[0]) == -1:
            holder = _text(raw_out[1])
            raise StaleLeaseError(
                f"trace {trace_id!r}: append fenced off (token {fence}, current lease {holder or 'none'}); "
                "another worker now holds this trace"
            )
        out: list[Appended | None] = []
        if raw_out and int(raw_out[0]) == -2:
            raw_out = []
        for i in range(0, len(raw_out), 2):
            status = int(raw_out[i])
            out.append(None if status == 2 else Appended(entry_id=_text(raw_out[i + 1]), created=status == 1))
        read = self._read_reply(trace_id, raw_first, raw_entries) if after is not None else None
        return out, read

    def _read_reply(self, trace_id: str, raw_first, raw_entries) -> Read:
        pairs = [(raw_id, entry_fields(flat)) for raw_id, flat in raw_entries]  # a field given twice is seen
        decoded = self.codec.decode_entries(pairs, trace_id=trace_id)
        sizes = [len(fields.get(codec.EVENT_FIELD, b"")) for _, fields in pairs]
        return Read(_text(raw_first) or None, decoded, sizes, complete=len(pairs) < self.read_count)

    async def read_after(self, trace_id: str, after: str | None) -> Read:
        """The entries after ``after`` (exclusive; None: from the first), every one of them.

        Raises:
            SchemaVersionError, EventDecodeError: an entry cannot be read.
        """
        stream = self.keys.trace(trace_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(stream, min="-", max="+", count=1)
        pipe.xrange(stream, min=f"({after}" if after else "-", max="+")
        first, entries = await pipe.execute()
        decoded = self.codec.decode_entries(entries, trace_id=trace_id)
        sizes = [len(fields.get(codec.EVENT_FIELD, b"")) for _, fields in entries]
        return Read(_text(first[0][0]) if first else None, decoded, sizes)

    async def complete(self, trace_id: str, read: Read) -> Read:
        """``read`` with the entries after it too, when it stopped at its count."""
        if read.complete:
            return read
        last = read.entries[-1][0] if read.entries else None
        rest = await self.read_after(trace_id, last)
        return Read(read.first_id, [*read.entries, *rest.entries], [*read.sizes, *rest.sizes])

    async def take(self, trace_id: str, *, ttl_ms: int, after: str | None) -> Taken:
        """Take the trace's lease if it is free, and read what came after ``after``; one round trip.

        When another worker holds the lease, the trace is marked dirty in the same step (its
        holder looks again before it lets go, see :meth:`release_lease`).
        """
        raw = await _run_script(
            self.redis, self._take_script, self._trace_keys(trace_id), [ttl_ms, after or "", self.read_count]
        )
        return self._taken(trace_id, raw)

    def _taken(self, trace_id: str, raw) -> Taken:
        code = int(raw[0])
        if code == 2:
            return Taken(None, empty=True)
        if code == 0:
            return Taken(None, holder=_text(raw[1]), left_ms=max(0, int(raw[2])))
        return Taken(int(raw[1]), read=self._read_reply(trace_id, raw[2], raw[3]))

    async def admit_turn(
        self,
        trace_id: str,
        turn: TurnInput,
        entry_id: str,
        *,
        take: bool,
        ttl_ms: int,
        after: str | None,
        expire_ms: int | None = None,
        max_open: int | None = None,
    ) -> Admitted:
        """A turn from the turns stream, in one round trip: when it ended before, say so; else
        append it once (remembering the turns-stream entry that brought it) and, with ``take``,
        take the trace as :meth:`take` does.

        ``max_open``: the most turns admitted and not ended the trace may hold (None: no cap); a
        new turn that finds that many is not appended (``Admitted.full`` says the count).
        """
        raw = await _run_script(
            self.redis,
            self._admit_script,
            self._trace_keys(trace_id),
            [
                turn.turn_id,
                entry_id,
                codec.entry_version((turn,)),
                codec.encode(turn),
                "" if expire_ms is None else str(max(1, int(expire_ms))),
                "1" if take else "0",
                ttl_ms,
                after or "",
                self.read_count,
                turn_digest(turn),
                "" if max_open is None else str(int(max_open)),
            ],
        )
        if _text(raw[0]) == "full":
            return Admitted(False, full=int(raw[1]))
        if _text(raw[0]) == "ended":
            return Admitted(True, first_entry=_text(raw[1]), absorbed=int(raw[2]) == 1, differs=int(raw[3]) == 1)
        taken = self._taken(trace_id, raw[2]) if take else None
        return Admitted(False, created=int(raw[1]) == 1, taken=taken, differs=int(raw[3]) == 1)

    async def fork(
        self,
        trace_id: str,
        events: Sequence[Event],
        keys: Sequence[str],
        *,
        point: str,
        open_turn: str | None = None,
        expire_ms: int | None = None,
    ) -> list[str]:
        """Start trace ``trace_id`` as a fork (lua/fork.lua): ``events`` appended in one step under
        their idempotency ``keys``, the fork's ``point`` kept in its key hash, ``open_turn``
        counted open → ``["created", first entry id, count]``; ``["forked", point, first entry
        id]`` when the trace was forked before (nothing written); ``["exists"]`` when the trace
        exists and is no fork (nothing written). See :mod:`agentstream.runtime.forks`."""
        raw = await self._fork_script(
            keys=[self.keys.trace(trace_id), self.keys.trace_keys(trace_id)],
            args=[
                point,
                codec._VERSION_BYTES,
                open_turn or "",
                "" if expire_ms is None else str(max(1, int(expire_ms))),
                *self._event_args(events, keys),
            ],
        )
        return [_text(part) if isinstance(part, bytes | str) else str(part) for part in raw]

    async def turn_copy(self, trace_id: str, turn: TurnInput, entry_id: str) -> tuple[bool, str, bool, bool]:
        """What the trace knows of a turn that ``entry_id`` brings (one HMGET, nothing written)
        → ``(ended, first entry, absorbed, differs)`` as :meth:`admit_turn` says them."""
        ended, first, absorbed, digest = await self.redis.hmget(
            self.keys.trace_keys(trace_id),
            [
                f"end:{turn.turn_id}",
                f"entry:{turn.turn_id}",
                f"copy:{turn.turn_id}:{entry_id}",
                f"digest:{turn.turn_id}",
            ],
        )
        differs = digest is not None and _text(digest) != turn_digest(turn)
        return ended is not None, _text(first) if first is not None else "", absorbed is not None, differs

    async def append_result(
        self,
        trace_id: str,
        result: ToolOutput,
        events: Sequence[Event] = (),
        *,
        release: tuple[str, str] | None = None,
        hints: Sequence[Hint] = (),
        failed_hints: list[Hint] | None = None,
    ) -> tuple[Appended, bool]:
        """Append a tool result once per call; one that finds the call answered is kept as late.

        Args:
            events: the app's own events the tool recorded, appended just before the result
                (keys ``event:<call id>:<n>``) in the same atomic step, and only if the call
                had no result yet: a late result's events are not recorded.
            release: the call's run key and its holder, deleted in the same step as the result
                is recorded (see :meth:`append_and_read`).
            hints, failed_hints: hints XADDed in the same round trip as the append (see
                :meth:`append_and_read`); again after a late result's own append.

        Returns:
            ``(appended, late)``: ``late`` is True when the call already had a result (cancelled,
            outcome unknown, dead letter), so this one was recorded with ``late`` set.
        """
        if events:
            keys = [*(f"event:{result.call_id}:{n}" for n in range(len(events))), key_for(result)]
            done = await self.append_many(
                trace_id,
                [*events, result],
                keys=keys,
                unless=key_for(result),
                release=release,
                hints=hints,
                failed_hints=failed_hints,
            )
            if done:
                return done[-1], False
            appended = await self.append(trace_id, result, release=release)  # the hints went out already
        else:
            appended = await self.append(trace_id, result, release=release, hints=hints, failed_hints=failed_hints)
        if appended.created:
            return appended, False
        late = await self.append(
            trace_id, msgspec.structs.replace(result, late=True), hints=hints, failed_hints=failed_hints
        )
        return late, True

    async def begin_call(
        self,
        trace_id: str,
        turn_id: str,
        call_id: str,
        job: str,
        *,
        name: str | None = None,
        arguments: str | None = None,
        run: tuple[str, str, int] | None = None,
        checked: bool = False,
    ) -> CallState:
        """Check a tool job's call, claim the call for ``job`` (``<stream>/<entry id>``) and take
        its run key, in one step that reads no event (O(1) whatever the trace's length).

        The job must name a call of its trace: the trace and the turn exist, and a model output
        of that turn made the call, with tool ``name`` (the call markers of :func:`markers_for`),
        whether or not the turn is over; else ``problem`` says why, or ``unchecked`` asks the
        caller to read the turn (a call appended without markers) and call again with
        ``checked``. The claim is taken only when the call has no result and its turn is
        neither cancelled nor over; once taken it stays with that job (a re-delivery of the same
        job finds it ``claimed``; a second job for the same call finds another ``holder``).

        Args:
            name: the job's tool name, which must be the call's (None: any tool, only the turn
                is checked; ``""`` is a name like any other, which no call has).
            arguments: the job's raw arguments, which must be the call's (:func:`arguments_digest`
                in its marker; None: not checked). A job that carries other arguments names no
                call that may run: a hint never says what a call does, the trace does.
            run: ``(run key, runner, ttl ms)``: take the call's run key (in the trace's hash slot)
                for ``runner`` when the claim is this job's, unless another runner holds it.
            checked: the caller checked the call by reading the trace: skip the markers.
        """
        run_key, runner, ttl_ms = run if run is not None else (self.keys.trace(trace_id), "", 0)
        raw = await self._begin_call_script(
            keys=[self.keys.trace_keys(trace_id), self.keys.trace(trace_id), run_key],
            args=[
                call_id,
                turn_id,
                job,
                name or "",
                runner,
                ttl_ms,
                "1" if checked else "0",
                "" if arguments is None else arguments_digest(arguments),
                "1" if name is None else "0",
            ],
        )
        code = _text(raw[0])
        if code != "ok":
            if code == "no_trace":
                return _problem(f"trace {trace_id!r} does not exist")
            if code == "no_turn":
                return _problem(f"trace {trace_id!r} has no turn {turn_id!r}")
            if code == "unchecked":
                return CallState(False, False, False, False, "", False, unchecked=True, turn_entry=_text(raw[1]))
            if code == "unapproved":
                return _problem(
                    f"call {call_id!r} of turn {turn_id!r} awaits a person's approval, or was denied it: "
                    "no job of it runs (the agent loop publishes its job once it is approved)"
                )
            made_turn, _, made_name = _text(raw[1]).partition("\n")
            made_name = made_name.partition("\n")[0]
            if code == "arguments":
                return _problem(
                    f"call {call_id!r} of turn {turn_id!r} was made with other arguments than the job's "
                    "(the trace records what a call runs; a job only says which call to run)"
                )
            if made_turn != turn_id:
                return _problem(
                    f"turn {turn_id!r} of trace {trace_id!r} made no call {call_id!r} "
                    f"(it is a call of turn {made_turn!r})"
                )
            return _problem(f"call {call_id!r} of turn {turn_id!r} is a call of tool {made_name!r}, not {name!r}")
        holder = _text(raw[5])
        run_holder = _text(raw[6])
        return CallState(
            has_result=bool(int(raw[1])),
            cancelled=bool(int(raw[2])),
            turn_ended=bool(int(raw[3])),
            started=bool(int(raw[4])),
            holder=holder,
            claimed=holder == job,
            run_holder="" if run_holder == runner else run_holder,
            run_left_ms=max(0, int(raw[7])),
            run_taken=bool(runner) and run_holder == runner,
        )

    async def keep_for(self, trace_id: str, seconds: float) -> None:
        """Delete the whole trace (events, keys, lease) ``seconds`` from now, unless renewed.

        The runtime never trims a trace; this is the explicit retention of whole conversations
        (setting ``AGENTSTREAM_TRACE_RETENTION_S``), renewed each time a turn of it ends.
        """
        ms = max(1, int(seconds * 1000))
        pipe = self.redis.pipeline(transaction=False)
        for key in (self.keys.trace(trace_id), self.keys.trace_keys(trace_id)):
            pipe.pexpire(key, ms)
        await pipe.execute()

    async def has_key(self, trace_id: str, key: str) -> bool:
        """Whether an append with this idempotency key is in the trace."""
        return bool(await self.redis.hexists(self.keys.trace_keys(trace_id), key))

    async def read(
        self, trace_id: str, *, after: str | None = None, count: int | None = None, from_id: str | None = None
    ) -> list[tuple[str, Event]]:
        """The trace's events ``[(entry id, event)]`` in order, after ``after`` (exclusive), or
        from ``from_id`` (inclusive).

        Raises:
            SchemaVersionError, EventDecodeError: an entry cannot be read.
        """
        start = from_id if from_id else f"({after}" if after else "-"
        entries = await self.redis.xrange(self.keys.trace(trace_id), min=start, max="+", count=count)
        return self.codec.decode_entries(entries, trace_id=trace_id)

    async def exists(self, trace_id: str) -> bool:
        """Whether the trace has any event."""
        return bool(await self.redis.exists(self.keys.trace(trace_id)))

    async def follow(
        self, trace_id: str, *, after: str = "0-0", block_ms: int = 1000, stop: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, Event]]:
        """Yield the trace's events after ``after`` as they are appended (blocking reads).

        Runs until the consumer stops iterating or ``stop`` is set. ``block_ms`` is the longest
        one XREAD waits before checking ``stop`` again.
        """
        last = after
        stream = self.keys.trace(trace_id)
        while stop is None or not stop.is_set():
            reply = await self.redis.xread({stream: last}, block=block_ms, count=500)
            for _stream, entries in reply or ():
                for entry_id, event in self.codec.decode_entries(entries, trace_id=trace_id):
                    last = entry_id
                    yield entry_id, event

    # --- the lease: one step at a time per trace --------------------------------------------

    async def acquire_lease(self, trace_id: str, *, ttl_ms: int) -> int | None:
        """Take the trace's lease for ``ttl_ms`` → its fencing token, or None when held.

        Fencing tokens come from a counter of the trace (in its key hash), so a newer holder
        always has a larger token than an older one, and no key is shared by all traces.
        """
        raw = await self._acquire_script(keys=self._trace_keys(trace_id)[1:3], args=[ttl_ms])
        return int(raw) if raw else None

    async def renew_lease(self, trace_id: str, token: int, *, ttl_ms: int) -> bool:
        """Extend a held lease by ``ttl_ms``; False when the lease is no longer ours."""
        return bool(await self._renew_script(keys=[self.keys.lease(trace_id)], args=[str(token), ttl_ms]))

    async def release_lease(
        self,
        trace_id: str,
        token: int,
        *,
        keep_if_dirty: bool = True,
        marks: Sequence[str] = (),
        pipe: Pipeline | None = None,
        results: list | None = None,
        repair: Callable[[list], Awaitable[list]] | None = None,
    ) -> str:
        """Give the lease back, unless a hint came while it was held.

        Args:
            keep_if_dirty: False gives the lease back whatever came meanwhile (a worker that
                stops or fails mid-step), leaving the dirty mark for the next holder.
            marks: once-only markers to set in the trace's key hash in the same step (for
                example ``reply:<turn>`` for a reply published just before in ``pipe``).
            pipe: a pipeline holding commands to run first (say, the XADD of a reply); it is
                executed with the release at its end, in one round trip.
            results: a list that receives the replies of ``pipe``'s own commands (an XADD's
                entry id...), in their order, when they all succeeded.
            repair: ``await repair(answers)`` → the answers of ``pipe``'s own commands after
                whatever it could redo of those that failed (a reply that its stream refused,
                sent to the default one: :func:`agentstream.runtime.operations.redirect_refused_replies`);
                called only when one failed.

        Returns:
            ``"released"``; or ``"dirty"`` when a hint arrived meanwhile (the mark is cleared,
            the lease is kept: look at the trace again, then release); or ``"lost"`` when the
            lease is no longer ours (it expired and perhaps another worker took it).

        Raises:
            redis.exceptions.ResponseError: a command queued on ``pipe`` failed (the markers of
                ``marks`` are then removed again, so nothing is marked done that was not done).
        """
        k = self.keys
        keys = [k.lease(trace_id), k.dirty(trace_id), k.trace_keys(trace_id)]
        args = [str(token), "1" if keep_if_dirty else "0", *marks]
        if pipe is None:
            code = int(await self._release_script(keys=keys, args=args))
        else:
            # EVALSHA queued as a plain command: a pipeline that registers scripts asks the
            # server whether it has them (SCRIPT EXISTS) at every execute, and redis-py's cluster
            # pipeline refuses its evalsha method (the command itself routes by its keys' slot).
            pipe.execute_command("EVALSHA", self._release_script.sha, len(keys), *keys, *args)
            replies = await pipe.execute(raise_on_error=False)
            if repair is not None and any(isinstance(r, Exception) for r in replies[:-1]):
                replies[:-1] = await repair(replies[:-1])
            failed = next((r for r in replies[:-1] if isinstance(r, Exception)), None)
            if failed is not None:
                if marks:
                    await self.redis.hdel(k.trace_keys(trace_id), *marks)
                raise failed
            if results is not None:
                results.extend(replies[:-1])
            last = replies[-1]
            if isinstance(last, NoScriptError):  # the server lost its scripts: load it, release alone
                last = await self._release_script(keys=keys, args=args)
            elif isinstance(last, Exception):
                raise last
            code = int(last)
        return {1: "released", 2: "dirty"}.get(code, "lost")

    async def publish_and_release(
        self, trace_id: str, token: int, entries: Sequence[Entry], *, marks: Sequence[str] = ()
    ) -> tuple[str, list[str]]:
        """Publish what a step leaves waiting and give the lease back, in one round trip.

        One pipeline without a transaction: XADD each of ``entries`` in order (the replies the
        trace still owes, with what their turns' ends tell other traces, then the step's tool
        jobs on their queues' partitions), then the release of :meth:`release_lease`, which sets
        ``marks`` in the trace's key hash (``reply:<turn id>``, a step's jobs marker) in the same
        script, after the XADDs ran.

        Args:
            trace_id: the trace whose lease is held.
            token: the lease's fencing token.
            entries: ``(stream, fields)`` to add (:data:`agentstream.runtime.operations.Entry`).
            marks: the once-only markers that say the entries went out.

        Returns:
            (the outcome of :meth:`release_lease`: ``"released"``, ``"dirty"`` or ``"lost"``;
            the entry id of each of ``entries``, in their order).

        Raises:
            redis.exceptions.ResponseError: an XADD failed: the marks are removed again, so
                nothing stays marked done that was not done (the release at the pipeline's end
                ran all the same).
        """
        pipe = self.redis.pipeline(transaction=False)
        for stream, fields in entries:
            pipe.xadd(stream, fields)
        results: list = []

        async def repair(answers: list) -> list:  # a reply its reply_to refused goes to the default stream
            return await redirect_refused_replies(self.redis, self.keys, entries, answers)

        outcome = await self.release_lease(trace_id, token, marks=marks, pipe=pipe, results=results, repair=repair)
        return outcome, [r.decode() if isinstance(r, bytes) else r for r in results]

    async def mark_dirty(self, trace_id: str, *, ttl_ms: int) -> None:
        """Note that a hint for the trace arrived (read by :meth:`release_lease`)."""
        await self.redis.set(self.keys.dirty(trace_id), b"1", px=ttl_ms)


async def _run_script(redis: aioredis.Redis, script: AsyncScript, keys: list, args: list) -> Any:
    """A registered script (redis-py's ``register_script``) run as its call runs it: EVALSHA of
    its digest, and when the server does not hold it, the script's own call, which loads it and
    runs it again. For the scripts of every step: the same command, without the call's copies of
    its keys and arguments and its import at each call."""
    try:
        return await redis.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await script(keys=keys, args=args)


def _problem(text: str) -> CallState:
    return CallState(False, False, False, False, "", False, problem=text)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
