"""The one encoder and the one decoder of trace events, built once per process.

A stored trace entry is a Redis stream entry with two fields:

- ``v``: the trace schema version that wrote it (ASCII digits);
- ``e``: the event, as msgspec JSON with a ``type`` tag (see :mod:`agentstream.events`).

JSON, not msgpack, so that backends in any language can read a trace with plain XRANGE.
Encoding is deterministic: the same event always gives the same bytes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from agentstream.errors import EventDecodeError, SchemaVersionError, TurnRejected
from agentstream.events import TRACE_SCHEMA_VERSION, CancelMessage, Event, Reply, ToolJob, TurnMessage, Wake

_event_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(Event)
_turn_decoder = msgspec.json.Decoder(TurnMessage)
_job_decoder = msgspec.json.Decoder(ToolJob)
_wake_decoder = msgspec.json.Decoder(Wake)
_reply_decoder = msgspec.json.Decoder(Reply)
_cancel_decoder = msgspec.json.Decoder(CancelMessage)

VERSION_FIELD = b"v"
EVENT_FIELD = b"e"
_VERSION_BYTES = str(TRACE_SCHEMA_VERSION).encode()


def encode(obj: Any) -> bytes:
    """Any event or wire message → its JSON bytes (deterministic)."""
    return _event_encoder.encode(obj)


def encode_entry(event: Event) -> dict[bytes, bytes]:
    """An event → the fields of its trace stream entry."""
    return {VERSION_FIELD: _VERSION_BYTES, EVENT_FIELD: _event_encoder.encode(event)}


def decode_entry(fields: dict[bytes, bytes], *, trace_id: str = "?", entry_id: str = "?") -> Event:
    """The fields of a trace stream entry → its event.

    Raises:
        SchemaVersionError: the entry was written by a newer schema version.
        EventDecodeError: the entry is missing a field or is not a known event.
    """
    raw_version = fields.get(VERSION_FIELD)
    payload = fields.get(EVENT_FIELD)
    if raw_version is None or payload is None:
        raise EventDecodeError(
            f"trace {trace_id!r} entry {entry_id}: missing field 'v' or 'e' (fields: "
            f"{sorted(k.decode(errors='replace') for k in fields)})"
        )
    try:
        version = int(raw_version)
    except ValueError:
        raise EventDecodeError(f"trace {trace_id!r} entry {entry_id}: bad version {raw_version!r}") from None
    if version > TRACE_SCHEMA_VERSION:
        raise SchemaVersionError(
            f"trace {trace_id!r} entry {entry_id} has schema version {version}, newer than "
            f"{TRACE_SCHEMA_VERSION} that this agentstream reads; upgrade agentstream"
        )
    try:
        return _event_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"trace {trace_id!r} entry {entry_id}: {exc}") from exc


def decode_entries(
    entries: Iterable[tuple[bytes, dict[bytes, bytes]]], *, trace_id: str = "?"
) -> list[tuple[str, Event]]:
    """Stream entries ``(id, fields)`` → ``[(id, event)]``, with the garbage collector paused.

    Bulk decoding allocates many small objects; pausing the collector roughly halves the time
    (see TOOLING.md's measurements).
    """
    with gc_paused():
        out = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            out.append((entry_id, decode_entry(fields, trace_id=trace_id, entry_id=entry_id)))
        return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (restores its previous state)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def decode_turn(payload: bytes | str) -> TurnMessage:
    """The JSON of a published turn → a :class:`TurnMessage`.

    Raises:
        TurnRejected: the payload is not JSON, not an object, misses a field or has a wrong type;
            the reason names the field (msgspec's path, such as ``$.turn_id``), and carries the
            trace and turn ids when they could be read.
    """
    try:
        turn = _turn_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        ids = _loose_ids(payload)
        raise TurnRejected(f"turn message does not match the schema: {exc}", **ids) from exc
    except msgspec.DecodeError as exc:
        raise TurnRejected(f"turn message is not valid JSON: {exc}") from exc
    for name in ("trace_id", "turn_id", "agent", "text"):
        if not getattr(turn, name).strip():
            ids = {"trace_id": turn.trace_id.strip() or None, "turn_id": turn.turn_id.strip() or None}
            raise TurnRejected(f"turn message field `$.{name}` is empty (only whitespace)", **ids)
    return turn


class MissingField(msgspec.DecodeError):
    """A work stream entry without the field that carries its message."""


def entry_field(fields: dict[bytes, bytes], name: bytes) -> bytes:
    """The field ``name`` of a work stream entry (a wake-up's ``wake``, a job's ``job``, ...).

    Raises:
        MissingField: (a ``msgspec.DecodeError``) the entry has no such field; the message
            names it and the fields the entry has.
    """
    payload = fields.get(name)
    if payload is None:
        present = sorted(k.decode(errors="replace") for k in fields)
        raise MissingField(f"entry has no field {name.decode()!r} (fields: {present})")
    return payload


def fields_json(fields: dict[bytes, bytes]) -> bytes:
    """A stream entry's fields as one JSON object (what an operator sees of an entry that could not be read)."""
    return _event_encoder.encode({k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()})


def reply_schema() -> dict[str, Any]:
    """The JSON schema (2020-12) of the reply message the agent loop publishes."""
    schema = msgspec.json.schema(Reply)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["description"] = (
        "An agentstream reply: the JSON in the field `reply` of an entry on the replies stream "
        "(default `agentstream:replies`, or the turn's `reply_to`)."
    )
    return schema


def _loose_ids(payload: bytes | str) -> dict[str, str | None]:
    """Best effort: the trace and turn ids of a payload that failed validation."""
    try:
        obj = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return {"trace_id": None, "turn_id": None}
    if not isinstance(obj, dict):
        return {"trace_id": None, "turn_id": None}
    trace_id, turn_id = obj.get("trace_id"), obj.get("turn_id")
    return {
        "trace_id": trace_id if isinstance(trace_id, str) and trace_id.strip() else None,
        "turn_id": turn_id if isinstance(turn_id, str) and turn_id.strip() else None,
    }


def decode_job(payload: bytes) -> ToolJob:
    """The JSON of a tool job → :class:`ToolJob` (raises ``msgspec.DecodeError``)."""
    return _job_decoder.decode(payload)


def decode_wake(payload: bytes) -> Wake:
    """The JSON of a wake-up → :class:`Wake` (raises ``msgspec.DecodeError``)."""
    return _wake_decoder.decode(payload)


def decode_cancel(payload: bytes) -> CancelMessage:
    """The JSON of a cancel request → :class:`CancelMessage` (raises ``msgspec.DecodeError``)."""
    return _cancel_decoder.decode(payload)


def decode_reply(payload: bytes) -> Reply:
    """The JSON of a reply → :class:`Reply` (raises ``msgspec.DecodeError``)."""
    return _reply_decoder.decode(payload)


def turn_message_schema() -> dict[str, Any]:
    """The JSON schema (2020-12) of the turn message that other backends publish."""
    schema = msgspec.json.schema(TurnMessage)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["description"] = (
        "An agentstream turn. Publish its JSON as the field `turn` of an entry on the turns "
        "stream (default `agentstream:turns`)."
    )
    return schema
