"""The Redis operations the services send, named in the field's words (runtime: Redis commands).

The services are thin shells: they decide from the trace with the pure layers and ask the
runtime to write. Each function here is one operation a service needs, with the commands it
sends; the trace itself is read and appended by :class:`agentstream.runtime.store.TraceStore`, work
streams are consumed by :mod:`agentstream.runtime.consumer`. Every function takes the client and the
:class:`~agentstream.wire.keys.Keys` of the deployment and raises what redis-py raises
(:data:`agentstream.runtime.connection.COMMAND_ERRORS`); none retries on its own: the consumer's
redelivery does.

Markers in a trace's key hash (``Keys.trace_keys``), written here:

- ``entry:<turn id>``: the turns-stream entry that first brought a turn (a re-delivery of that
  entry is not a re-publish);
- ``reply:<turn id>``: the turn's reply was written (set only after its XADD succeeded);
- a compaction job's marker (:func:`agentstream.agent_loop.compactions.job_marker`).

What a turn's end tells the streams around it (its reply, a child's ending, the cancels of its
children) is handed over as :data:`Entry` values, in the order they are to be added.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from agentstream.runtime.entries import StreamsReply, xadd_fields
from agentstream.runtime.lua import script
from agentstream.wire import codec
from agentstream.wire.checks import DEFAULT_LIMITS, error_fields
from agentstream.wire.events import ApprovalMessage, CancelMessage, Reply, Wake
from agentstream.wire.keys import (
    APPROVAL_FIELD,
    CANCEL_FIELD,
    COMPACTION_FIELD,
    REPLY_FIELD,
    WAKE_FIELD,
    Keys,
    owner_problem,
    partition_stream,
)

Entry = tuple[str, dict[bytes, bytes]]
"""An entry to add to a stream, one XADD: ``(stream key, {field: encoded value})``; say a reply
``(<ns>:replies, {b"reply": <encoded Reply>})`` or a tool job ``(<tool stream>, {b"job": ...})``."""

log = logging.getLogger("agentstream.runtime.operations")

_ADMIT_CHILD_LUA = script("admit_child")  # agentstream/runtime/lua/admit_child.lua


@dataclass(frozen=True)
class RoutedWake:
    """A wake-up for its owner's own stream while the owner is alive, else for the shared one:
    one script on the partition's hash slot (``lua/route_wake.lua``; the rule:
    :func:`agentstream.steps.wake_routes.route`), one command as an XADD is.

    Attributes:
        stream: the trace's partition of ``<ns>:wake`` (where it goes unless the owner is alive).
        fields: the entry's fields (``wake``: the encoded :class:`Wake`).
        owners: the partition's owners set (:meth:`Keys.wake_owners`).
        owned: the owner's stream (:meth:`Keys.wake_owned`).
        owner: the owner, a name :func:`agentstream.wire.keys.owner_problem` allows.
    """

    stream: str
    fields: dict[bytes, bytes]
    owners: str
    owned: str
    owner: str

    def script_keys(self) -> list[str]:
        """The script's KEYS: the owners set, the owner's stream, the shared stream."""
        return [self.owners, self.owned, self.stream]

    def script_args(self) -> list:
        """The script's ARGV: the owner, then the entry's fields and values."""
        return [self.owner, *(part for pair in self.fields.items() for part in pair)]


Hint = Entry | RoutedWake
"""A hint sent after an append (:meth:`agentstream.runtime.store.TraceStore.append_and_read`'s
``hints``): an entry to XADD, or a wake-up routed to its owner (:class:`RoutedWake`)."""

_ROUTE_WAKE_LUA = script("route_wake")  # agentstream/runtime/lua/route_wake.lua
ROUTE_WAKE_SHA = hashlib.sha1(_ROUTE_WAKE_LUA.encode()).hexdigest()
"""The SHA-1 of the route script, for an EVALSHA queued in a pipeline (:func:`queue_hint`)."""


async def wake_trace(redis: aioredis.Redis, keys: Keys, trace_id: str, reason: str, *, owner: str = "") -> str:
    """Wake the agent loop of a trace: add a :class:`Wake` (a hint, never state) to the trace's
    wake-up stream (its partition of ``<ns>:wake``) or, with an ``owner`` that is alive, to that
    agent-loop consumer's own stream (:func:`wake_entry`) → the entry id.

    ``reason`` says what happened, for logs: ``result:<call id>`` (a tool result is in the trace),
    ``compaction``, ``child:<trace id>``, ``lost_work``..."""
    return await send_hint(redis, wake_entry(keys, trace_id, reason, owner=owner))


def wake_entry(keys: Keys, trace_id: str, reason: str, *, owner: str = "") -> Hint:
    """The hint :func:`wake_trace` sends, for a caller that sends it in a pipeline of its own
    (:meth:`agentstream.runtime.store.TraceStore.append_and_read`'s ``hints``): an entry of the
    trace's wake-up stream, or with an ``owner`` (a job's ``wake_to``) whose name may name a
    stream (:func:`agentstream.wire.keys.owner_problem`), a :class:`RoutedWake`. A name that may
    not is ignored: the wake-up goes to the shared stream, and no key is named after it."""
    stream = keys.wake_for(trace_id)
    fields = {WAKE_FIELD: codec.encode(Wake(trace_id=trace_id, reason=reason))}
    if not owner or owner_problem(owner) is not None:
        return stream, fields
    partition = keys.partition(trace_id)
    return RoutedWake(stream, fields, keys.wake_owners(partition), keys.wake_owned(partition, owner), owner)


def queue_hint(pipe, hint: Hint) -> None:
    """Queue on ``pipe`` (a pipeline of one Redis server) the command that sends ``hint``: its
    XADD, or the route script's EVALSHA (an answer ``NoScriptError`` means it was not sent)."""
    if isinstance(hint, RoutedWake):
        keys_ = hint.script_keys()
        pipe.execute_command("EVALSHA", ROUTE_WAKE_SHA, len(keys_), *keys_, *hint.script_args())
        return
    stream, fields = hint
    pipe.xadd(stream, xadd_fields(fields))


async def send_hint(redis: aioredis.Redis, hint: Hint) -> str:
    """Send ``hint`` on its own (an XADD, or the route script of a :class:`RoutedWake`) → the entry id.

    Raises:
        redis.exceptions.ResponseError, ConnectionError, TimeoutError: as redis-py raises them.
    """
    if isinstance(hint, RoutedWake):
        route = redis.register_script(_ROUTE_WAKE_LUA)
        _stream, entry_id = await route(keys=hint.script_keys(), args=hint.script_args())
    else:
        stream, fields = hint
        entry_id = await redis.xadd(stream, xadd_fields(fields))
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


async def request_cancel(redis: aioredis.Redis, keys: Keys, message: CancelMessage) -> None:
    """Ask for a turn's cancel durably: XADD the :class:`CancelMessage` to ``<ns>:cancel``, which
    the agent loop's group writes into the trace (what a parent does to a child past its
    deadline). See :func:`agentstream.runtime.cancel.publish_cancel` for the one every process hears."""
    await redis.xadd(keys.cancel, {CANCEL_FIELD: codec.encode(message)})


async def note_turn_entry(redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str, entry_id: str) -> None:
    """Note which turns-stream entry first brought a turn (``HSETNX entry:<turn id>``): the first
    one stays, so a re-delivery of it is told from a re-publish of the turn."""
    await redis.hsetnx(keys.trace_keys(trace_id), f"entry:{turn_id}", entry_id)


async def turn_entry(redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str) -> str:
    """The turns-stream entry id that first brought a turn (``HGET entry:<turn id>``), or ``""``."""
    first = await redis.hget(keys.trace_keys(trace_id), f"entry:{turn_id}")
    return first.decode() if isinstance(first, bytes) else (first or "")


async def lease_left_ms(redis: aioredis.Redis, keys: Keys, trace_id: str) -> int:
    """How long the trace's lease has left, in milliseconds (PTTL; negative: no lease or no
    expiry, as Redis says: -2 and -1)."""
    return int(await redis.pttl(keys.lease(trace_id)))


REFUSING_REPLY_STREAM = ("WRONGTYPE", "NOPERM")
"""The Redis errors of an XADD that say the ``reply_to`` stream itself cannot take a reply (its key
holds another type; the client's ACL user may not write it): the reply goes to the default
replies stream instead (:func:`redirect_refused_replies`). Any other error is raised as it is."""


def _refusal_text(answer: object) -> str | None:
    """The error of an XADD's answer when it says its stream refuses replies (see
    :data:`REFUSING_REPLY_STREAM`), with its Redis error code → None for any other answer.
    redis-py strips the code of the errors it has a class for (NOPERM: NoPermissionError)."""
    if isinstance(answer, NoPermissionError):
        return f"NOPERM {answer}"
    if isinstance(answer, ResponseError) and str(answer).startswith(REFUSING_REPLY_STREAM):
        return str(answer)
    return None


def owed_key(keys: Keys, partition: int = 0) -> str:
    """The sorted set of traces owing a reply that the replies stream refused (member trace id,
    score the time of the last refusal in ms) of one partition (``<ns>:owed-replies``, then
    ``<ns>:owed-replies:p<k>``), see :mod:`agentstream.runtime.watchdog`."""
    return partition_stream(f"{keys.namespace}:owed-replies", partition)


def note_owed_reply(pipe, keys: Keys, trace_id: str) -> None:
    """Queue on ``pipe`` (a pipeline) the ZADD that puts ``trace_id`` in its partition's owed
    replies set, scored now (ms): the watchdog publishes what it owes later."""
    pipe.zadd(owed_key(keys, keys.partition(trace_id)), {trace_id: int(time.time() * 1000)})


async def redirect_refused_replies(
    redis: aioredis.Redis, keys: Keys, entries: Sequence[Entry], answers: Sequence[object]
) -> list:
    """Send again to ``<ns>:replies`` each reply that its own stream refused, and report each.

    ``answers`` are a pipeline's answers to the XADDs of ``entries``, in order. A reply (an entry
    with the ``reply`` field) whose XADD to a stream other than ``<ns>:replies`` failed with
    WRONGTYPE or NOPERM (a key of that name that is not a stream, created after the turn's
    ``reply_to`` was checked; an ACL that does not let this client write it) would otherwise
    never go out, and the trace's replies are published in order, so every later turn of the
    conversation would fail behind it. It is written to ``<ns>:replies`` instead, just after a
    report on the errors stream that says which turn, which stream and why (one more round trip,
    only then: a backend that sees the reply finds the report).

    A reply that ``<ns>:replies`` itself refuses (a client wrote a string or a hash under that
    name, or the ACL user may not write it: no reply of the namespace can go out) has nowhere
    else to go: it stays unsent, its answer stays the error (the caller's work entry is retried),
    the errors stream says which turn, which stream, the Redis error and what to do, each time,
    and its trace goes into the owed replies set, from which the agent loop's watchdog publishes
    it once the key is a stream again, even after the work entry was dead-lettered
    (:mod:`agentstream.runtime.watchdog`). A report the errors stream refuses too is logged.

    Returns:
        ``answers`` with each redirected reply's failure replaced by the answer of its new XADD
        (its entry id, or the error if that failed too).
    """
    refused = [
        i
        for i, ((stream, fields), answer) in enumerate(zip(entries, answers, strict=True))
        if REPLY_FIELD in fields and _refusal_text(answer) is not None
    ]
    out = list(answers)
    if not refused:
        return out
    redirected = [i for i in refused if entries[i][0] != keys.replies]
    if redirected:  # each report goes before its reply: a backend that sees the reply finds the report
        pipe = redis.pipeline(transaction=False)
        for i in redirected:
            stream, fields = entries[i]
            trace_id, turn_id = _reply_ids(fields[REPLY_FIELD])
            error = (
                f"the reply of turn {turn_id!r} of trace {trace_id!r} could not be written to its reply_to "
                f"{stream!r} ({_refusal_text(answers[i])}); it is written to {keys.replies!r} instead"
            )
            log.warning("%s", error)
            _report(pipe, keys, error, trace_id, turn_id, stream)
            pipe.xadd(keys.replies, xadd_fields(dict(fields)))
        again = await pipe.execute(raise_on_error=False)
        for n, i in enumerate(redirected):
            out[i] = again[2 * n + 1]
            _log_refused_report(keys, again[2 * n])
    stuck = [i for i in refused if isinstance(out[i], Exception)]
    if not stuck:
        return out
    reports = redis.pipeline(transaction=False)
    for i in stuck:
        stream, fields = entries[i]
        trace_id, turn_id = _reply_ids(fields[REPLY_FIELD])
        why = _refusal_text(out[i]) or f"{type(out[i]).__name__}: {out[i]}"
        tried = f"its reply_to {stream!r} ({_refusal_text(answers[i])}) and then " if stream != keys.replies else ""
        error = (
            f"the reply of turn {turn_id!r} of trace {trace_id!r} could not be published: {tried}the default replies "
            f"stream {keys.replies!r} refused it ({why}). No reply of this namespace can go out until {keys.replies!r} "
            "is a stream this client may write: delete or rename that key (or fix the ACL); the reply is retried "
            "with its work entry, and the watchdog sends it once the stream takes it"
        )
        log.error("%s", error)
        _report(reports, keys, error, trace_id, turn_id, stream)
        if trace_id != "?":  # the watchdog publishes it once the stream takes it, even after a dead letter
            note_owed_reply(reports, keys, trace_id)
    for answer in await reports.execute(raise_on_error=False):
        _log_refused_report(keys, answer)
    return out


def _report(pipe, keys: Keys, error: str, trace_id: str, turn_id: str, source: str) -> None:
    """Queue on ``pipe`` the XADD of one report on the errors stream (capped)."""
    fields = error_fields(error, None, DEFAULT_LIMITS, trace_id=trace_id, turn_id=turn_id, source=source)
    pipe.xadd(keys.errors, fields, maxlen=DEFAULT_LIMITS.errors_maxlen, approximate=True)


def _log_refused_report(keys: Keys, answer: object) -> None:
    if isinstance(answer, Exception):
        log.error("a report on %r (or the note of the reply owed) was refused too (%s)", keys.errors, answer)


def _reply_ids(payload: bytes) -> tuple[str, str]:
    """The trace and turn ids of an encoded reply, for a report (``"?"`` when it does not decode)."""
    try:
        reply = codec.decode_reply(payload)
    except Exception:  # ours to write, so always a Reply; the report must not fail on it
        return "?", "?"
    return reply.trace_id, reply.turn_id


async def send_reply(redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str, stream: str, reply: Reply) -> None:
    """Publish a turn's reply and mark it sent: XADD the :class:`Reply` to ``stream`` (the
    turn's checked ``reply_to`` or ``<ns>:replies``), then ``HSET reply:<turn id>``. The mark is
    written only after the XADD succeeded (a failed write leaves it unsent, to be sent again). A
    ``stream`` that refuses it gets it redirected (:func:`redirect_refused_replies`)."""
    entry: Entry = (stream, {REPLY_FIELD: codec.encode(reply)})
    try:
        await redis.xadd(entry[0], xadd_fields(entry[1]))
    except ResponseError as exc:
        (answer,) = await redirect_refused_replies(redis, keys, [entry], [exc])
        if isinstance(answer, Exception):
            raise answer from None
    await mark_reply_sent(redis, keys, trace_id, turn_id)


async def send_refusal(redis: aioredis.Redis, stream: str, reply: Reply) -> None:
    """Publish the failed reply of a turn refused before it could name a trace it may touch (a
    backend's turn into another backend's conversation, :mod:`agentstream.wire.backends`): one
    XADD to ``stream`` (the sender's own replies stream), nothing marked or written in any trace."""
    await redis.xadd(stream, {REPLY_FIELD: codec.encode(reply)})


async def mark_reply_sent(redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str) -> None:
    """Mark a turn's reply as written (``HSET reply:<turn id> 1``)."""
    await redis.hset(keys.trace_keys(trace_id), f"reply:{turn_id}", b"1")


async def publish_turn_end(
    redis: aioredis.Redis, keys: Keys, trace_id: str, turn_id: str, entries: Sequence[Entry]
) -> None:
    """Publish what a turn's end tells the streams around it and mark its reply sent.

    XADD each of ``entries`` in order (the cancels of the children it leaves running on
    ``<ns>:cancel``, then its reply on its reply stream, or, for a child's task, the child's
    ending on the trace's partition of ``<ns>:child-endings``), in one pipeline without a
    transaction (the streams are in other hash slots; on a cluster each node gets its own); then,
    only when every XADD succeeded, ``HSET reply:<turn id> 1`` in the trace's key hash. Two round
    trips.

    Raises:
        redis.exceptions.ResponseError: an XADD failed (WRONGTYPE on a ``reply_to`` that is not a
            stream...): nothing is marked, so the reply is sent again on the next look.
        redis.exceptions.ConnectionError, TimeoutError: as redis-py raises them.
    """
    pipe = redis.pipeline(transaction=False)
    for stream, fields in entries:
        pipe.xadd(stream, xadd_fields(fields))
    answers = await pipe.execute(raise_on_error=False)
    if any(isinstance(a, Exception) for a in answers):
        answers = await redirect_refused_replies(redis, keys, entries, answers)
    failed = next((a for a in answers if isinstance(a, Exception)), None)
    if failed is not None:  # not marked: sent again on the next look
        raise failed
    await mark_reply_sent(redis, keys, trace_id, turn_id)


async def publish_replies(
    redis: aioredis.Redis, keys: Keys, trace_id: str, entries: Sequence[Entry], marks: Sequence[str]
) -> None:
    """Publish the replies a trace still owes and mark them sent, in one round trip.

    One pipeline without a transaction: XADD each of ``entries`` in order (each ended turn's
    reply, with what its end tells other traces: see :func:`publish_turn_end`), then
    ``HSET <mark> 1`` in the trace's key hash for each of ``marks`` (``reply:<turn id>``), after
    the XADDs. When any command failed, the marks are deleted again (one HDEL) and the first
    error is raised: nothing stays marked sent that was not written. Nothing is sent when
    ``marks`` is empty.

    Raises:
        redis.exceptions.ResponseError: a command failed (the marks were removed again).
        redis.exceptions.ConnectionError, TimeoutError: as redis-py raises them.
    """
    if not marks:
        return
    pipe = redis.pipeline(transaction=False)
    for stream, fields in entries:
        pipe.xadd(stream, xadd_fields(fields))
    for mark in marks:  # after the XADDs: marked only once written
        pipe.hset(keys.trace_keys(trace_id), mark, b"1")
    results = await pipe.execute(raise_on_error=False)
    if any(isinstance(r, Exception) for r in results[: len(entries)]):
        results[: len(entries)] = await redirect_refused_replies(redis, keys, entries, results[: len(entries)])
    failed = next((r for r in results if isinstance(r, Exception)), None)
    if failed is not None:
        await redis.hdel(keys.trace_keys(trace_id), *marks)
        raise failed


async def replies_sent(redis: aioredis.Redis, keys: Keys, trace_id: str, turn_ids: Sequence[str]) -> list[bool]:
    """Whether each turn's reply was marked written, in the order of ``turn_ids`` (one HMGET)."""
    if not turn_ids:
        return []
    marks = await redis.hmget(keys.trace_keys(trace_id), [f"reply:{t}" for t in turn_ids])
    return [mark is not None for mark in marks]


async def publish_compaction(redis: aioredis.Redis, keys: Keys, trace_id: str, job_payload: bytes, marker: str) -> None:
    """Ask for a summary: XADD the encoded compaction job to the trace's partition of
    ``<ns>:compactions`` and set its marker in the trace's key hash (one pipeline, no
    transaction: a job published twice is harmless, the compaction is appended once by key)."""
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(keys.for_trace(keys.compactions, trace_id), {COMPACTION_FIELD: job_payload})
    pipe.hset(keys.trace_keys(trace_id), marker, b"1")
    await pipe.execute()


async def admit_child(
    redis: aioredis.Redis, keys: Keys, root_trace_id: str, child_trace_id: str, max_descendants: int
) -> bool:
    """Count a child trace among its root's descendants, unless the root has ``max_descendants``
    already → whether the child may open (True for a child admitted before: a delegation job
    delivered twice opens the same child).

    One Lua script on the root's descendants set (``Keys.descendants``, one key: SISMEMBER,
    SCARD, SADD), so two delegations racing for the last place cannot both get it. Sent as
    EVALSHA (the script is loaded with SCRIPT LOAD when the server does not have it).

    Raises:
        redis.exceptions.ResponseError, ConnectionError, TimeoutError: as redis-py raises them.
    """
    admit = redis.register_script(_ADMIT_CHILD_LUA)
    return bool(await admit(keys=[keys.descendants(root_trace_id)], args=[child_trace_id, max_descendants]))


async def ping(redis: aioredis.Redis) -> None:
    """Check that the Redis server answers (PING), for readiness probes.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError, ResponseError (say, NOAUTH): as redis-py
            raises them when it does not.
    """
    await redis.ping()


async def group_names(redis: aioredis.Redis, stream: str) -> set[str]:
    """The names of the consumer groups on ``stream`` (XINFO GROUPS).

    Raises:
        redis.exceptions.ResponseError: the stream does not exist (``no such key``).
    """
    groups = await redis.xinfo_groups(stream)
    return {g["name"].decode() if isinstance(g["name"], bytes) else g["name"] for g in groups}


async def groups_caught_up(redis: aioredis.Redis, stream: str) -> bool:
    """Whether every consumer group on ``stream`` has read and acknowledged all of it: no
    pending entries and no entry after its last delivered id (XINFO GROUPS, then one XRANGE
    ``COUNT 1`` per group that has nothing pending). True for a stream without groups.

    Raises:
        redis.exceptions.ResponseError: the stream does not exist (``no such key``).
    """
    for info in await redis.xinfo_groups(stream):
        if info.get("pending"):
            return False
        last = info.get("last-delivered-id") or b"0-0"
        if await redis.xrange(stream, min=f"({last.decode() if isinstance(last, bytes) else last}", max="+", count=1):
            return False
    return True


async def read_replies(
    redis: aioredis.Redis, keys: Keys, after: str, *, block_ms: int, count: int = 100
) -> list[tuple[str, Reply]]:
    """The replies on ``<ns>:replies`` after entry id ``after`` (exclusive; ``"0-0"``: from the
    start), waiting up to ``block_ms`` milliseconds for one (XREAD BLOCK, at most ``count``)
    → ``[(entry id, Reply)]`` in order, ``[]`` when none came.

    Raises:
        KeyError: an entry has no ``reply`` field.
        msgspec.DecodeError: an entry's ``reply`` is not a :class:`Reply`.
    """
    out = []
    reply = cast("StreamsReply | None", await redis.xread({keys.replies: after}, block=block_ms, count=count))
    for _, entries in reply or []:
        for entry_id, fields in entries:
            out.append(
                (
                    entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
                    codec.decode_reply(fields[REPLY_FIELD]),
                )
            )
    return out


async def set_child_deadline(redis: aioredis.Redis, keys: Keys, child_trace_id: str, deadline_ms: int) -> None:
    """Remember when a delegated child must have answered (ZADD NX on
    ``<ns>:delegation:deadlines``, Unix ms): a child's first deadline stays."""
    await redis.zadd(keys.delegation_deadlines, {child_trace_id: deadline_ms}, nx=True)


async def clear_child_deadline(redis: aioredis.Redis, keys: Keys, child_trace_id: str) -> None:
    """Forget a child's deadline (ZREM): it answered, or was ended."""
    await redis.zrem(keys.delegation_deadlines, child_trace_id)


async def children_past_deadline(redis: aioredis.Redis, keys: Keys, now_ms: int, limit: int) -> list[str]:
    """The child traces whose deadline is at or before ``now_ms`` (Unix ms), oldest first, at
    most ``limit`` (ZRANGEBYSCORE)."""
    due = cast(
        "list[bytes | str]", await redis.zrangebyscore(keys.delegation_deadlines, "-inf", now_ms, start=0, num=limit)
    )
    return [raw.decode() if isinstance(raw, bytes) else raw for raw in due]


async def note_approval_due(redis: aioredis.Redis, keys: Keys, trace_id: str, due_ms: int) -> None:
    """Make sure the trace is woken at ``due_ms`` (Unix ms), when a call that awaits approval
    is due to be denied: ZADD of the trace to its partition's ``<ns>:approvals:due`` (its score
    replaced: the earliest due of the calls it waits on now). The watchdog of the agent loops
    wakes the traces that are due (:class:`agentstream.runtime.watchdog.Watchdog`)."""
    await redis.zadd(keys.approvals_due(keys.partition(trace_id)), {trace_id: due_ms})


async def forget_approval_due(redis: aioredis.Redis, keys: Keys, trace_id: str) -> None:
    """The trace waits on no approval any more: ZREM it from its approvals-due set."""
    await redis.zrem(keys.approvals_due(keys.partition(trace_id)), trace_id)


async def publish_approval(redis: aioredis.Redis, keys: Keys, message: ApprovalMessage) -> str:
    """Publish an approval or a denial: XADD the :class:`ApprovalMessage` (field ``approval``) to
    ``<ns>:approvals``, which the agent loop's group records in the trace once per call → the entry id."""
    entry_id = await redis.xadd(keys.approvals, {APPROVAL_FIELD: codec.encode(message)})
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id
