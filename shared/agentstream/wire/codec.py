"""The one encoder and the one decoder of trace events, built once per process.

A stored trace entry is a Redis stream entry with two fields:

- ``v``: the trace schema version that wrote it (ASCII digits);
- ``e``: the event, as msgspec JSON with a ``type`` tag (see :mod:`agentstream.wire.events`).

JSON, not msgpack, so that backends in any language can read a trace with plain XRANGE.
Encoding is deterministic: the same event always gives the same bytes.

An app's own element and event types (see :mod:`agentstream.wire.registry`) are read by the app's
:class:`TraceCodec`. A stored event of a type the reader does not register is read as an
:class:`~agentstream.wire.events.UnknownEvent`, and a stored element of an unregistered kind as an
:class:`~agentstream.wire.events.UnknownElement`, each holding what was stored: a trace written by
another version of an app stays readable, and the context builder refuses the placeholders
instead of skipping them.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterable
from typing import Any, TypedDict, TypeVar, cast

import msgspec

from agentstream.errors import EventDecodeError, SchemaVersionError, TurnRejected
from agentstream.wire.entries import EntryFields, doubled_refusal
from agentstream.wire.events import (
    BUSY_POLICIES,
    TRACE_SCHEMA_VERSION,
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    CancelMessage,
    Event,
    ForkedFrom,
    Reply,
    TaskInput,
    ToolJob,
    ToolOutput,
    TurnInput,
    TurnMessage,
    UnknownElement,
    UnknownEvent,
    Wake,
)
from agentstream.wire.failures import with_failure_codes
from agentstream.wire.jsontext import control_character, duplicate_key, unicode_problem
from agentstream.wire.keys import trace_id_problem
from agentstream.wire.registry import NO_APP_TYPES, AppTypes, element_union, event_union, tag_of

_event_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(Event)
_turn_decoder = msgspec.json.Decoder(TurnMessage)
_job_decoder = msgspec.json.Decoder(ToolJob)
_wake_decoder = msgspec.json.Decoder(Wake)
_reply_decoder = msgspec.json.Decoder(Reply)
_cancel_decoder = msgspec.json.Decoder(CancelMessage)
_approval_decoder = msgspec.json.Decoder(ApprovalMessage)

VERSION_FIELD = b"v"
EVENT_FIELD = b"e"
_VERSION_BYTES = str(TRACE_SCHEMA_VERSION).encode()


def encode(obj: Any) -> bytes:
    """Any event or wire message → its JSON bytes (deterministic)."""
    return _event_encoder.encode(obj)


ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)
"""What encoding a value a tool or a model returned may raise: a value of a type JSON has no form
for (TypeError), a string holding a lone UTF-16 surrogate, which UTF-8 cannot encode (RFC 3629
§3: UnicodeEncodeError, a ValueError), an integer past msgspec's range, nesting past the stack."""


WRITTEN_BEFORE_3 = b"2"
"""The schema version an entry is written under when it needs nothing of version 3."""


def entry_version(events: Iterable[Event]) -> bytes:
    """The trace schema version an append of ``events`` is written under: the oldest that reads
    every one of them. That is 2, unless one needs 3: an approval's events, a fork's first event, or
    a turn input that rolls a turn back. So during a rolling update a release that reads up to 2
    (0.1.0, 0.2.0) reads what this one writes, and refuses visibly only what it cannot read
    (tests/e2e/test_upgrade_skew.py)."""
    for event in events:
        if isinstance(event, (ApprovalAwaited, ApprovalDecided, ForkedFrom)) or (
            isinstance(event, TurnInput) and event.rolls_back is not None
        ):
            return _VERSION_BYTES
    return WRITTEN_BEFORE_3


def encode_entry(event: Event) -> dict[bytes, bytes]:
    """An event → the fields of its trace stream entry (its version: :func:`entry_version`)."""
    return {VERSION_FIELD: entry_version((event,)), EVENT_FIELD: _event_encoder.encode(event)}


_ELEMENT_HOLDERS = (TurnInput, TaskInput, ToolOutput)
"""The built-in events whose ``elements`` may hold an app's element types."""


class TraceCodec:
    """Reads trace entries for one app's registered types (see :mod:`agentstream.wire.registry`).

    Entries of built-in types only take one msgspec decode. An entry that holds an app's
    element inside a built-in event, or a type the app does not register, takes a slower path:
    the JSON is read as builtins and converted piece by piece.

    Args:
        types: the app's types (default: none of its own).
    """

    def __init__(self, types: AppTypes | None = None) -> None:
        self.types = types if types is not None else NO_APP_TYPES
        self._events = event_union(self.types)
        self._elements = element_union(self.types)
        self._decoder = _event_decoder if not self.types.event_types else msgspec.json.Decoder(self._events)
        self._event_tags = {tag_of(cls): cls for cls in self.types.events}
        self._element_kinds = {tag_of(cls) for cls in self.types.elements}

    def unstorable(self, event: Any) -> str | None:
        """Why ``event`` cannot be stored in a trace and read back as it is →
        ``"<error type>: <message>"``, or None when it can: it must encode as JSON (see
        :data:`ENCODE_ERRORS`) and that JSON must decode back (a NaN in a ``float`` field encodes
        as ``null``, which the field refuses). What a service checks before it appends what a
        tool or a model returned, so such a value becomes an error result or a failure, not an
        append that fails on every delivery or an entry no step can read."""
        try:
            self.decode(_event_encoder.encode(event))
        except ENCODE_ERRORS as exc:  # UnicodeEncodeError is a ValueError
            return f"{type(exc).__name__}: {exc}"
        except EventDecodeError as exc:
            return f"it would not read back: {exc.__cause__ or exc}"
        return None

    def decode(self, payload: bytes, *, trace_id: str = "?", entry_id: str = "?") -> Any:
        """An event's JSON → the event (a placeholder for an unregistered type).

        Raises:
            EventDecodeError: the payload is not JSON, not an object with a string ``type``, or a
                registered type's fields do not fit it.
        """
        try:
            try:
                return self._decoder.decode(payload)
            except msgspec.ValidationError as exc:
                return self._decode_loose(payload, exc, trace_id, entry_id)
        except msgspec.DecodeError as exc:
            raise EventDecodeError(f"trace {trace_id!r} entry {entry_id}: {exc}") from exc
        except RecursionError as exc:
            raise EventDecodeError(f"trace {trace_id!r} entry {entry_id}: {TOO_DEEP}") from exc

    def _decode_loose(self, payload: bytes, error: Exception, trace_id: str, entry_id: str) -> Any:
        def fail() -> EventDecodeError:
            return EventDecodeError(f"trace {trace_id!r} entry {entry_id}: {error}")

        obj = msgspec.json.decode(payload)
        tag = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(tag, str):
            raise fail() from error
        cls = self._event_tags.get(tag)
        if cls is None:
            turn_id = obj.get("turn_id")
            return UnknownEvent(stored_type=tag, raw=obj, turn_id=turn_id if isinstance(turn_id, str) else "")
        elements = obj.get("elements")
        if cls not in _ELEMENT_HOLDERS or not isinstance(elements, list):
            raise fail() from error
        try:
            event = msgspec.convert({k: v for k, v in obj.items() if k != "elements"}, self._events)
            return msgspec.structs.replace(event, elements=tuple(self.element(e) for e in elements))
        except msgspec.ValidationError:
            raise fail() from error

    def element(self, obj: Any) -> Any:
        """A stored element (JSON-compatible builtins) → the element, or an UnknownElement for an unregistered kind.

        Raises:
            msgspec.ValidationError: a registered kind's fields do not fit.
        """
        try:
            return msgspec.convert(obj, self._elements)
        except msgspec.ValidationError:
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if not isinstance(kind, str) or kind in self._element_kinds:
                raise
            element_id = obj.get("id")
            return UnknownElement(id=element_id if isinstance(element_id, str) else "", stored_kind=kind, raw=obj)

    def decode_entry(self, fields: dict[bytes, bytes], *, trace_id: str = "?", entry_id: str = "?") -> Any:
        """The fields of a trace stream entry → its event (see :func:`decode_entry`)."""
        payload = _checked_payload(fields, trace_id, entry_id)
        return self.decode(payload, trace_id=trace_id, entry_id=entry_id)

    def decode_entries(
        self, entries: Iterable[tuple[bytes, dict[bytes, bytes]]], *, trace_id: str = "?"
    ) -> list[tuple[str, Any]]:
        """Stream entries ``(id, fields)`` → ``[(id, event)]`` (see :func:`decode_entries`)."""
        with gc_paused():
            out = []
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                out.append((entry_id, self.decode_entry(fields, trace_id=trace_id, entry_id=entry_id)))
            return out


def decode_entry(fields: dict[bytes, bytes], *, trace_id: str = "?", entry_id: str = "?") -> Event | UnknownEvent:
    """The fields of a trace stream entry → its event (built-in types; others become placeholders).

    Raises:
        SchemaVersionError: the entry was written by a newer schema version.
        EventDecodeError: the entry is missing a field or its event cannot be read.
    """
    # the default codec registers the built-in types only: what it reads is one of them or a placeholder
    return cast("Event | UnknownEvent", DEFAULT_CODEC.decode_entry(fields, trace_id=trace_id, entry_id=entry_id))


def _checked_payload(fields: dict[bytes, bytes], trace_id: str, entry_id: str) -> bytes:
    doubled = doubled_refusal(fields) if type(fields) is not dict else None
    if doubled is not None:
        raise EventDecodeError(f"trace {trace_id!r} entry {entry_id}: {doubled}")
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
    return payload


def decode_entries(
    entries: Iterable[tuple[bytes, dict[bytes, bytes]]], *, trace_id: str = "?"
) -> list[tuple[str, Event]]:
    """Stream entries ``(id, fields)`` → ``[(id, event)]``, with the garbage collector paused.

    Bulk decoding allocates many small objects; pausing the collector roughly halves the time
    (see TOOLING.md's measurements). Built-in types only: an app's store reads with its own
    :class:`TraceCodec`.
    """
    return DEFAULT_CODEC.decode_entries(entries, trace_id=trace_id)


class gc_paused:
    """Pause the cyclic garbage collector for the block (restores its previous state).

    Use as ``with gc_paused():``. (A class rather than a generator context manager: every step
    enters a few of these.)"""

    __slots__ = ("_was_enabled",)

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(.*)`(?: - at `\$(.*)`)?$")


def decode_turn(payload: bytes | str) -> TurnMessage:
    """The JSON of a published turn → a :class:`TurnMessage`.

    Raises:
        TurnRejected: the payload is not JSON, not an object, misses a field, has a field the
            message does not define, or a wrong type; the reason names the field (msgspec's
            path, such as ``$.turn_id``), and carries the trace and turn ids when they could be
            read.
    """
    try:
        turn = _turn_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        ids = _loose_ids(payload)
        unknown = _UNKNOWN_FIELD.match(str(exc))
        if unknown:
            known = ", ".join(TurnMessage.__struct_fields__)
            raise TurnRejected(
                f"turn message has an unknown field `{unknown.group(1)}` (at `${unknown.group(2) or ''}`); "
                f"the fields are: {known}",
                **ids,
            ) from exc
        hint = ""
        if str(exc).endswith("at `$.busy_policy`"):
            hint = f"; busy_policy takes one of {', '.join(BUSY_POLICIES)}, or is left out (the process's policy)"
        raise TurnRejected(f"turn message does not match the schema: {exc}{hint}", **ids) from exc
    except msgspec.DecodeError as exc:
        raise TurnRejected(f"turn message is not valid JSON: {unicode_problem(payload) or exc}") from exc
    except RecursionError as exc:
        raise TurnRejected(f"turn message is not readable: {TOO_DEEP}") from exc
    for name in ("trace_id", "turn_id", "agent", "text"):
        value = getattr(turn, name)
        if value is not None and not value.strip():
            ids = _Ids(trace_id=turn.trace_id.strip() or None, turn_id=turn.turn_id.strip() or None)
            raise TurnRejected(f"turn message field `$.{name}` is empty (only whitespace)", **ids)
    if (turn.text is None) == (turn.input is None):
        ids = _Ids(trace_id=turn.trace_id, turn_id=turn.turn_id)
        which = "has both `$.text` and `$.input`" if turn.text is not None else "has neither `$.text` nor `$.input`"
        raise TurnRejected(
            f"turn message {which}: give the message as `text`, or the agent's typed input as `input`", **ids
        )
    doubled = duplicate_key(payload)
    if doubled is not None:
        path, key = doubled
        ids = _Ids(
            trace_id=None if (path, key) == ("$", "trace_id") else turn.trace_id,
            turn_id=None if (path, key) == ("$", "turn_id") else turn.turn_id,
        )
        raise TurnRejected(f"turn message {_twice(path, key)}", **ids)
    for name in ID_FIELDS:
        value = getattr(turn, name)
        found = control_character(value) if value else None
        if found is not None:
            ids = _Ids(
                trace_id=None if name == "trace_id" else turn.trace_id,
                turn_id=None if name == "turn_id" else turn.turn_id,
            )
            raise TurnRejected(f"turn message field `$.{name}` holds {found}; {ID_RULE}", **ids)
    if turn.elements:
        from agentstream.wire.registry import check_elements

        try:
            check_elements(turn.elements, where="turn message field `$.elements`")
        except ValueError as exc:
            raise TurnRejected(str(exc), trace_id=turn.trace_id, turn_id=turn.turn_id) from None
    return turn


class MissingField(msgspec.DecodeError):
    """A work stream entry without the field that carries its message."""


class DoubledField(msgspec.DecodeError):
    """A work stream entry that gives a field more than once (see :mod:`agentstream.wire.entries`)."""


def entry_field(fields: dict[bytes, bytes], name: bytes) -> bytes:
    """The field ``name`` of a work stream entry (a wake-up's ``wake``, a job's ``job``, ...).

    Raises:
        DoubledField: (a ``msgspec.DecodeError``) the entry gives some field (this one or
            another) more than once; the message names each and how many times.
        MissingField: (a ``msgspec.DecodeError``) the entry has no such field; the message
            names it and the fields the entry has.
    """
    doubled = doubled_refusal(fields) if type(fields) is not dict else None
    if doubled is not None:
        raise DoubledField(f"entry {doubled}")
    payload = fields.get(name)
    if payload is None:
        present = sorted(k.decode(errors="replace") for k in fields)
        raise MissingField(f"entry has no field {name.decode()!r} (fields: {present})")
    return payload


def fields_json(fields: dict[bytes, bytes]) -> bytes:
    """A stream entry's fields as one JSON object (what an operator sees of an entry that could
    not be read); an entry that repeats a field (:class:`~agentstream.wire.entries.EntryFields`)
    as a JSON array of its ``[field, value]`` pairs, every one in the order stored."""
    if isinstance(fields, EntryFields) and fields.doubled:
        return _event_encoder.encode(
            [[k.decode(errors="replace"), v.decode(errors="replace")] for k, v in fields.pairs]
        )
    return _event_encoder.encode({k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()})


def entry_shown(fields: dict[bytes, bytes], name: bytes) -> bytes:
    """What the errors stream shows of a work stream entry that could not be read: its field
    ``name``, or all of the entry (:func:`fields_json`) when it lacks that field or repeats one."""
    payload = fields.get(name)
    if payload is None or (type(fields) is not dict and doubled_refusal(fields) is not None):
        return fields_json(fields)
    return payload


DEFAULT_CODEC = TraceCodec()
"""The codec of built-in types only."""


JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""The ``$schema`` of every schema the wire publishes (the first key of each)."""


def reply_schema() -> dict[str, Any]:
    """The JSON schema (2020-12) of the reply message the agent loop publishes."""
    schema = {
        "$schema": JSON_SCHEMA_DIALECT,
        **with_failure_codes(msgspec.json.schema(Reply)),
    }  # first, as readers look
    schema["description"] = (
        "An agentstream reply: the JSON in the field `reply` of an entry on the replies stream "
        "(default `agentstream:replies`, or the turn's `reply_to`). Replies are at-least-once: "
        "dedupe them by (trace_id, turn_id); a turn id is unique within its trace only."
    )
    return schema


class _Ids(TypedDict):
    """A turn's ids as a refusal carries them (None: not readable)."""

    trace_id: str | None
    turn_id: str | None


def _loose_ids(payload: bytes | str) -> _Ids:
    """Best effort: the trace and turn ids of a payload that failed validation."""
    try:
        obj = msgspec.json.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return {"trace_id": None, "turn_id": None}
    if not isinstance(obj, dict):
        return {"trace_id": None, "turn_id": None}
    trace_id, turn_id = obj.get("trace_id"), obj.get("turn_id")
    return {
        "trace_id": trace_id if isinstance(trace_id, str) and trace_id.strip() else None,
        "turn_id": turn_id if isinstance(turn_id, str) and turn_id.strip() else None,
    }


TOO_DEEP = "its JSON is nested too deeply to read"

ID_FIELDS = ("trace_id", "turn_id", "agent", "reply_to", "model")
"""The fields of a turn that name things (Redis keys, agents, endpoints): no control characters."""

ID_RULE = "ids name Redis keys and appear in logs, so they may not hold control or invisible characters"


def _twice(path: str, key: str) -> str:
    return (
        f"names the key `{key}` twice in the object at `{path}`: each key may appear once "
        "(RFC 8259 §4 leaves duplicates to each reader, so two readers could disagree)"
    )


_T = TypeVar("_T")


def _guarded(decoder: msgspec.json.Decoder[_T], payload: bytes) -> _T:
    """``decoder.decode(payload)``, with nesting too deep for the decoder (msgspec raises
    RecursionError) reported as a ``msgspec.DecodeError`` like any other unreadable payload."""
    try:
        return decoder.decode(payload)
    except RecursionError as exc:
        raise msgspec.DecodeError(TOO_DEEP) from exc
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        problem = unicode_problem(payload)
        if problem is None:
            raise
        raise msgspec.DecodeError(f"JSON is not Unicode: {problem}") from exc


def decode_job(payload: bytes) -> ToolJob:
    """The JSON of a tool job → :class:`ToolJob` (raises ``msgspec.DecodeError``)."""
    return _guarded(_job_decoder, payload)


def decode_wake(payload: bytes) -> Wake:
    """The JSON of a wake-up → :class:`Wake` (raises ``msgspec.DecodeError``)."""
    return _guarded(_wake_decoder, payload)


def decode_cancel(payload: bytes) -> CancelMessage:
    """The JSON of a cancel request (a client's) → :class:`CancelMessage`.

    Raises:
        msgspec.DecodeError: not JSON (not Unicode: the reason says where), not a cancel, a key
            named twice, a ``trace_id``/``turn_id`` with a control character, or a ``trace_id``
            that may not name a trace (:func:`agentstream.wire.keys.trace_id_problem`).
    """
    message = _guarded(_cancel_decoder, payload)
    doubled = duplicate_key(payload)
    if doubled is not None:
        raise msgspec.DecodeError(f"cancel message {_twice(*doubled)}")
    for name in ("trace_id", "turn_id"):
        found = control_character(getattr(message, name))
        if found is not None:
            raise msgspec.DecodeError(f"cancel message field `$.{name}` holds {found}; {ID_RULE}")
    problem = trace_id_problem(message.trace_id)
    if problem is not None:
        raise msgspec.DecodeError(f"cancel message field `$.trace_id` is {message.trace_id!r}: {problem}")
    return message


def decode_approval(payload: bytes) -> ApprovalMessage:
    """The JSON of an approval or denial (a client's) → :class:`ApprovalMessage`.

    Raises:
        msgspec.DecodeError: not JSON (not Unicode: the reason says where), not an approval (a
            field missing, unknown, of the wrong type or over its length), a key named twice, a
            ``trace_id``/``call_id``/``by`` with a control character, a ``trace_id`` that may not
            name a trace (:func:`agentstream.wire.keys.trace_id_problem`), or ``arguments`` that
            are not a JSON object.
    """
    message = _guarded(_approval_decoder, payload)
    doubled = duplicate_key(payload)
    if doubled is not None:
        raise msgspec.DecodeError(f"approval message {_twice(*doubled)}")
    for name in ("trace_id", "call_id", "by"):
        found = control_character(getattr(message, name))
        if found is not None:
            raise msgspec.DecodeError(f"approval message field `$.{name}` holds {found}; {ID_RULE}")
    problem = trace_id_problem(message.trace_id)
    if problem is not None:
        raise msgspec.DecodeError(f"approval message field `$.trace_id` is {message.trace_id!r}: {problem}")
    if message.arguments is not None:
        try:
            edited = msgspec.json.decode(message.arguments)
        except msgspec.DecodeError as exc:
            raise msgspec.DecodeError(f"approval message field `$.arguments` is not JSON: {exc}") from None
        except RecursionError:
            raise msgspec.DecodeError(f"approval message field `$.arguments` is not readable: {TOO_DEEP}") from None
        if not isinstance(edited, dict):
            raise msgspec.DecodeError(
                f"approval message field `$.arguments` must hold a JSON object (as text), got {type(edited).__name__}"
            )
    return message


def decode_reply(payload: bytes) -> Reply:
    """The JSON of a reply → :class:`Reply` (raises ``msgspec.DecodeError``)."""
    return _guarded(_reply_decoder, payload)


def turn_message_schema() -> dict[str, Any]:
    """The JSON schema (2020-12) of the turn message that other backends publish."""
    schema = {"$schema": JSON_SCHEMA_DIALECT, **msgspec.json.schema(TurnMessage)}  # first, as readers look
    schema["description"] = (
        "An agentstream turn. Publish its JSON as the field `turn` of an entry on the turns "
        "stream (default `agentstream:turns`)."
    )
    return schema


def agent_turn_schema(agent_name: str, input_type: Any) -> dict[str, Any]:
    """The JSON schema (2020-12) of a turn for one agent: the turn message with ``agent`` fixed
    to its name and ``input`` the agent's typed input (a pydantic model: see
    :mod:`agentstream.declarations.inputs`); ``text`` is offered only when that type has a ``text`` field."""
    import copy

    schema = copy.deepcopy(turn_message_schema())
    body = schema["$defs"]["TurnMessage"]
    body["properties"]["agent"] = {"const": agent_name}
    own = input_type.model_json_schema(ref_template="#/$defs/{model}")
    for name, definition in own.pop("$defs", {}).items():
        schema["$defs"].setdefault(name, definition)
    own.setdefault("description", f"the turn's typed input ({input_type.__name__})")
    body["properties"]["input"] = own
    if "text" not in input_type.model_fields:
        body["properties"].pop("text", None)
    body["description"] = f"A turn for agent {agent_name!r}: its payload is `input` ({input_type.__name__})" + (
        " or, for the message alone, `text`." if "text" in input_type.model_fields else "."
    )
    schema["description"] = (
        f"An agentstream turn for agent {agent_name!r} (publish its JSON as the field `turn` on the turns stream)."
    )
    return schema
