"""Reading stream entries without losing a field given twice.

Redis keeps every field/value pair of an ``XADD``; redis-py folds an entry's pairs into a dict,
so of ``turn A turn B`` only ``B`` is left and nobody can tell. :func:`keep_doubled_fields`
installs response callbacks on a client for the commands that return stream entries (XREAD,
XREADGROUP, XRANGE, XREVRANGE, XCLAIM, XAUTOCLAIM): an entry whose fields repeat comes back as
an :class:`agentstream.wire.entries.EntryFields` (a dict, last value per field, plus every pair
and the repeated names), every other entry exactly as redis-py's own callback makes it. The
readers then refuse such an entry naming the field (:func:`agentstream.wire.entries.doubled_refusal`).

Each callback runs redis-py's own one, then compares each entry's number of fields with its
number of pairs in the raw reply (a few ``len`` calls an entry, against ~140 µs of client CPU
per command); only an entry that repeats a field is built again. It works for the reply shapes of RESP2 and
RESP3 and every ``legacy_responses`` setting (XREAD's reply is a list of ``[stream, entries]``
or a map of stream → entries; an entry's fields are a flat array in both), for
:class:`redis.Redis`, :class:`redis.asyncio.Redis` and :class:`redis.asyncio.cluster.RedisCluster`
(whose nodes and pipelines share the cluster's callbacks). A sync :class:`redis.cluster.RedisCluster`
applies its nodes' callbacks first, so there each node present is given the callbacks (nodes
the client learns later are not); agentstream's services use the asyncio clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from agentstream.wire.entries import EntryFields

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

__all__ = ["STREAM_COMMANDS", "Entries", "StreamsReply", "entry_fields", "keep_doubled_fields", "xadd_fields"]

Entries = list[tuple[bytes, dict[bytes, bytes]]]
"""Stream entries as a client with ``decode_responses=False`` reads them (XRANGE, XREVRANGE,
each stream's part of an XREAD): ``[(entry id, {field: value})]``. redis-py types its replies
for every client setting at once; the readers cast them to this."""

StreamsReply = list[tuple[bytes, Entries]]
"""An XREAD or XREADGROUP reply (RESP2, ``decode_responses=False``): ``[(stream, entries)]``,
each pair a two-item list; empty or None when nothing came."""


def xadd_fields(fields: dict[bytes, bytes]) -> dict[FieldT, EncodableT]:
    """``fields`` (the same dict) as redis-py types the fields XADD takes: a ``dict`` of its own
    key and value unions, which to a type checker a ``dict[bytes, bytes]`` is not (a dict is
    invariant)."""
    return cast("dict[FieldT, EncodableT]", fields)


STREAM_COMMANDS = ("XREAD", "XREADGROUP", "XRANGE", "XREVRANGE", "XCLAIM", "XAUTOCLAIM")
"""The commands whose replies hold stream entries (their fields as a flat array of pairs)."""

_MARK = "_agentstream_keeps_doubled"


def keep_doubled_fields(client: Any) -> Any:
    """Install the callbacks of :data:`STREAM_COMMANDS` that keep a repeated field (idempotent) → ``client``.

    Args:
        client: a redis-py client: sync or asyncio ``Redis``, asyncio ``RedisCluster`` (sync
            ``RedisCluster``: its nodes known now, see the module docstring).
    """
    nodes = _sync_cluster_nodes(client)
    if nodes is not None:
        for node in nodes:
            keep_doubled_fields(node)
        return client
    callbacks = client.response_callbacks
    for command in STREAM_COMMANDS:
        current = callbacks.get(command)
        if getattr(current, _MARK, False):
            continue
        client.set_response_callback(command, _keeping(command, current))
    return client


def entry_fields(flat: Sequence[Any]) -> dict:
    """An entry's flat ``[field, value, ...]`` (as a script returns it) → its fields: a dict, or
    an :class:`~agentstream.wire.entries.EntryFields` when a field repeats."""
    it = iter(flat)
    fields = dict(zip(it, it, strict=True))
    return EntryFields.from_flat(flat) if len(fields) * 2 < len(flat) else fields


def _sync_cluster_nodes(client: Any) -> list[Any] | None:
    """The node clients of a sync RedisCluster (None for any other client)."""
    if not hasattr(client, "cluster_response_callbacks") or not hasattr(client, "get_nodes"):
        return None
    return [node.redis_connection for node in client.get_nodes() if getattr(node, "redis_connection", None) is not None]


def _keeping(command: str, parse: Callable[..., Any] | None) -> Callable[..., Any]:
    def parse_keeping_doubled(response: Any, **options: Any) -> Any:
        if options.get("parse_justid") or response is None:  # ids only (JUSTID), or nothing
            return parse(response, **options) if parse is not None else response
        raw = _raw_lists(command, response)  # before parsing: XAUTOCLAIM's parser replaces its list
        parsed = parse(response, **options) if parse is not None else response
        if parse is None:
            return parsed
        for raw_entries, entries in zip(raw, _parsed_lists(command, parsed), strict=False):
            for i, (raw_entry, entry) in enumerate(zip(raw_entries or (), entries, strict=False)):
                # a field given twice: the dict has fewer fields than the entry has pairs
                if (
                    raw_entry
                    and raw_entry[1]
                    and entry
                    and entry[1] is not None
                    and len(raw_entry[1]) > 2 * len(entry[1])
                ):
                    entries[i] = (entry[0], EntryFields.from_flat(raw_entry[1]), *entry[2:])
        return parsed

    setattr(parse_keeping_doubled, _MARK, True)
    return parse_keeping_doubled


def _raw_lists(command: str, response: Any) -> list[Any]:
    """The raw reply's lists of entries (``[id, [field, value, ...]]`` each)."""
    if command in ("XREAD", "XREADGROUP"):
        if isinstance(response, dict):  # RESP3: stream → entries
            return list(response.values())
        return [stream[1] for stream in response if stream]
    if command == "XAUTOCLAIM":  # [next id, entries, deleted ids]
        return [response[1]] if len(response) > 1 else []
    return [response]


def _parsed_lists(command: str, parsed: Any) -> list[list[Any]]:
    """The parsed reply's (mutable) lists of entries (``(id, fields, ...)`` each)."""
    if command in ("XREAD", "XREADGROUP"):
        if isinstance(parsed, dict):
            out = []
            for value in parsed.values():  # entries, or [entries] (RESP3 with legacy shapes)
                if value and isinstance(value[0], list):
                    out.extend(value)
                else:
                    out.append(value)
            return out
        return [stream[1] for stream in parsed if stream]
    if command == "XAUTOCLAIM":
        return [parsed[1]] if len(parsed) > 1 and isinstance(parsed[1], list) else []
    return [parsed] if isinstance(parsed, list) else []
