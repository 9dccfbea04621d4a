"""The wire's rules: what a published turn may be, where a reply may go, and how much is kept.

Any backend that can XADD to the turns stream is a client, not a peer. This module holds the
checks every entry point applies to what a client sends (the agent loop on the turns stream,
and an HTTP gateway beside it) — pure functions, no Redis, no asyncio:

- :func:`validate_turn`: a published turn's bytes → a :class:`~agentstream.wire.events.TurnMessage`,
  or a :class:`~agentstream.errors.TurnRejected` with code ``bad_turn``, a reason that names
  the field or the limit (with the actual size), and what the failure reply may use: the
  trace and turn ids, a ``reply_to`` that passed :func:`reply_stream_refusal`, the metadata
  when it is within its limit.
- :func:`doubled_turn_refusal`: a turns-stream entry that gives a field more than once (Redis
  keeps every pair) is refused as a whole, naming the field (:mod:`agentstream.wire.entries`).
- :func:`reply_stream_refusal`: a reply goes only to the namespace's replies stream or a stream
  matching the configured reply patterns (default ``<ns>:replies`` and ``<ns>:replies:*``;
  ``AGENTSTREAM_REPLY_STREAMS`` adds glob patterns). A stream inside the namespace that is not a
  replies stream (the turns, tool, wake, cancel, delegation streams, a trace) is refused
  whatever the patterns say, so no setting lets a client write into the services' own keys.
- :func:`tool_arguments_refusal`, :func:`tool_result_refusal`: the largest tool arguments and
  results the tool worker runs and records.
- :func:`excerpt`, :func:`error_fields`: the bounded excerpt of a bad payload that the errors and
  dead-letter streams keep (they are capped with ``MAXLEN ~``, :attr:`WireLimits.errors_maxlen`).

Sizes are in bytes of UTF-8 (what Redis stores), depth counts nested JSON arrays and objects
(the turn object itself is depth 1). Every limit is a setting (see :mod:`agentstream.ops.settings`);
:data:`LIMIT_SETTINGS` names the variable of each, and errors name it too.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from agentstream.errors import TurnRejected
from agentstream.wire import codec
from agentstream.wire.entries import EntryFields, doubled_refusal
from agentstream.wire.events import ApprovalMessage, CancelMessage, TurnMessage
from agentstream.wire.failures import FailureCode
from agentstream.wire.jsontext import control_character, duplicate_key
from agentstream.wire.keys import Keys, trace_id_problem

BAD_TURN = FailureCode.BAD_TURN
"""The code of every refused turn (its reply's ``code``)."""

LIMIT_SETTINGS = {
    "max_turn_bytes": "AGENTSTREAM_MAX_TURN_BYTES",
    "max_metadata_bytes": "AGENTSTREAM_MAX_METADATA_BYTES",
    "max_json_depth": "AGENTSTREAM_MAX_JSON_DEPTH",
    "max_id_bytes": "AGENTSTREAM_MAX_ID_BYTES",
    "max_tool_arguments_bytes": "AGENTSTREAM_MAX_TOOL_ARGUMENTS_BYTES",
    "max_tool_result_bytes": "AGENTSTREAM_MAX_TOOL_RESULT_BYTES",
    "excerpt_bytes": "AGENTSTREAM_EXCERPT_BYTES",
    "errors_maxlen": "AGENTSTREAM_ERRORS_MAXLEN",
    "reply_streams": "AGENTSTREAM_REPLY_STREAMS",
}
"""The environment variable of each :class:`WireLimits` field."""


@dataclass(frozen=True)
class WireLimits:
    """The limits on what a client sends and what the services keep of it.

    Attributes:
        max_turn_bytes: the largest published turn (its whole JSON), default 512 KiB.
        max_metadata_bytes: the largest ``metadata`` (keys and values together), default 16 KiB;
            it is echoed on the reply.
        max_json_depth: the deepest nesting of arrays and objects in a turn, default 16.
        max_id_bytes: the longest ``trace_id``, ``turn_id`` or ``agent`` (they name Redis keys),
            default 256.
        max_tool_arguments_bytes: the largest arguments of a tool call the tool worker runs,
            default 256 KiB (larger ones get an error result the model sees).
        max_tool_result_bytes: the largest tool result recorded (text and data), default 1 MiB
            (a larger one is replaced by an error result).
        excerpt_bytes: how much of a bad payload the errors and dead-letter streams keep,
            default 2 KiB.
        errors_maxlen: the approximate length cap (``MAXLEN ~``) of the errors stream and of
            each dead-letter stream, default 10,000 entries.
        reply_streams: glob patterns (Redis ``KEYS`` syntax, as ACL key patterns) of streams a
            turn's ``reply_to`` may name, beside ``<ns>:replies`` and ``<ns>:replies:*``.
    """

    max_turn_bytes: int = 512 * 1024
    max_metadata_bytes: int = 16 * 1024
    max_json_depth: int = 16
    max_id_bytes: int = 256
    max_tool_arguments_bytes: int = 256 * 1024
    max_tool_result_bytes: int = 1024 * 1024
    excerpt_bytes: int = 2048
    errors_maxlen: int = 10_000
    reply_streams: tuple[str, ...] = field(default_factory=tuple)

    def reply_patterns(self, keys: Keys) -> tuple[str, ...]:
        """Every pattern a ``reply_to`` may match: the namespace's two, then the configured ones."""
        return (keys.replies, f"{keys.replies}:*", *self.reply_streams)


DEFAULT_LIMITS = WireLimits()


def parse_patterns(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"a,b c"`` (commas or spaces) or an iterable → the non-empty patterns, in order."""
    if value is None:
        return ()
    parts = re.split(r"[,\s]+", value) if isinstance(value, str) else list(value)
    return tuple(p for p in (part.strip() for part in parts) if p)


# --- reply streams ---------------------------------------------------------------------------


def reply_stream_refusal(reply_to: str, keys: Keys, limits: WireLimits = DEFAULT_LIMITS) -> str | None:
    """Why a turn may not name ``reply_to`` as its reply stream → the reason, or None when it may.

    Allowed: a stream matching one of :meth:`WireLimits.reply_patterns` (glob, case-sensitive)
    that is not one of the namespace's own keys other than its replies streams, and whose name
    holds no glob character (``* ? [ ]``: ``<ns>:replies:*`` matched its own pattern and made a
    stream of that name, which a consumer subscribing by pattern reads as every stream).
    """
    setting = LIMIT_SETTINGS["reply_streams"]
    if not reply_to:
        return "turn message field `$.reply_to` is empty; leave it out for the default replies stream"
    if len(reply_to.encode()) > limits.max_id_bytes:
        return (
            f"turn message field `$.reply_to` is {len(reply_to.encode())} bytes, over the limit "
            f"{LIMIT_SETTINGS['max_id_bytes']}={limits.max_id_bytes}"
        )
    control = control_character(reply_to)
    if control is not None:
        return f"turn message field `$.reply_to` holds {control}; a stream name may not hold control or invisible characters"
    globbed = sorted(set(reply_to) & set("*?[]"))
    if globbed:
        return (
            f"turn message field `$.reply_to` names {reply_to!r}, which holds the glob character(s) "
            f"{' '.join(globbed)}: a reply goes to one stream, named exactly (patterns are for the setting {setting})"
        )
    if reply_to.endswith(":") or "::" in reply_to:
        return (
            f"turn message field `$.reply_to` names {reply_to!r}, which has an empty part between its `:`s "
            f"(such as {keys.replies + ':'!r} with nothing after it); name a stream such as {keys.replies + ':backend-7'!r}"
        )
    own = f"{keys.namespace}:"
    replies = keys.replies
    if reply_to.startswith(own) and reply_to != replies and not reply_to.startswith(f"{replies}:"):
        return (
            f"turn message field `$.reply_to` names {reply_to!r}, a stream of agentstream's own "
            f"(namespace {keys.namespace!r}) that is not a replies stream; a reply goes to {replies!r} "
            f"or a stream under {replies + ':'!r}"
        )
    patterns = limits.reply_patterns(keys)
    if any(fnmatch.fnmatchcase(reply_to, p) for p in patterns):
        return None
    return (
        f"turn message field `$.reply_to` names {reply_to!r}, which matches none of the reply stream "
        f"patterns {list(patterns)} (the setting {setting} adds patterns)"
    )


# --- turns -----------------------------------------------------------------------------------


class _Routing(msgspec.Struct, forbid_unknown_fields=False):
    """The fields of a turn that a failure reply needs, read without decoding the rest."""

    trace_id: msgspec.Raw = msgspec.Raw(b"null")
    turn_id: msgspec.Raw = msgspec.Raw(b"null")
    reply_to: msgspec.Raw = msgspec.Raw(b"null")
    metadata: msgspec.Raw = msgspec.Raw(b"null")


_routing_decoder = msgspec.json.Decoder(_Routing)
_str_decoder = msgspec.json.Decoder(str | None)
_metadata_decoder = msgspec.json.Decoder(dict[str, str] | None)


@dataclass(frozen=True)
class Routing:
    """Where a refused turn's failure goes: ids, reply stream and metadata that passed the checks.

    ``trace_id``/``turn_id`` are None when missing, not strings, empty or longer than
    ``max_id_bytes`` (``trace_id`` also when :func:`~agentstream.wire.keys.trace_id_problem`
    refuses it); ``reply_to`` is None when missing or refused (the failure reply then goes
    to the default replies stream), ``reply_to_refusal`` says why it was refused; ``metadata``
    is empty when missing, malformed or over ``max_metadata_bytes``.
    """

    trace_id: str | None = None
    turn_id: str | None = None
    reply_to: str | None = None
    reply_to_refusal: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def routing_of(payload: bytes | str, keys: Keys, limits: WireLimits = DEFAULT_LIMITS) -> Routing:
    """Best effort, never raises: the routing fields of a turn payload that may be malformed or
    too large (the other fields are skipped, not decoded)."""
    try:
        raw = _routing_decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        scanned = _scanned_routing(payload)  # too deep for the decoder, or malformed further on
        if scanned is None:
            return Routing()
        raw = scanned
    else:
        doubled = duplicate_key(payload) if json_depth(payload) <= limits.max_json_depth else None
        if doubled is not None and doubled[0] == "$" and doubled[1] in _Routing.__struct_fields__:
            raw = msgspec.structs.replace(raw, **{doubled[1]: msgspec.Raw(b"null")})  # which one was meant is unknown

    def small_str(value: msgspec.Raw) -> str | None:
        if len(value) > limits.max_id_bytes * 6 + 2:  # JSON escapes: at most 6 bytes per byte
            return None
        try:
            text = _str_decoder.decode(value)
        except msgspec.DecodeError:
            return None
        if text is None or not text.strip() or len(text.encode()) > limits.max_id_bytes or control_character(text):
            return None
        return text

    reply_to, refusal = small_str(raw.reply_to), None
    if reply_to is not None:
        refusal = reply_stream_refusal(reply_to, keys, limits)
        if refusal is not None:
            reply_to = None
    metadata: dict[str, str] = {}
    if len(raw.metadata) <= limits.max_metadata_bytes * 6 + 64:
        try:
            decoded = _metadata_decoder.decode(raw.metadata) or {}
        except msgspec.DecodeError:
            decoded = {}
        if metadata_bytes(decoded) <= limits.max_metadata_bytes:
            metadata = decoded
    trace_id = small_str(raw.trace_id)
    return Routing(
        trace_id=trace_id if trace_id is not None and trace_id_problem(trace_id) is None else None,
        turn_id=small_str(raw.turn_id),
        reply_to=reply_to,
        reply_to_refusal=refusal,
        metadata=metadata,
    )


_FIELD_STRING = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*("[^"\\]*(?:\\.[^"\\]*)*")')
    for name in ("trace_id", "turn_id", "reply_to")
}


def _scanned_routing(payload: bytes | str) -> _Routing | None:
    """The routing string fields found by a pattern, for a payload the decoder refused (the
    first occurrence of each; only the sender's own failure reply depends on it)."""
    data = payload.encode() if isinstance(payload, str) else bytes(payload)
    if not data.lstrip().startswith(b"{"):
        return None
    found = {}
    for name, pattern in _FIELD_STRING.items():
        match = pattern.search(data)
        if match is not None:
            found[name] = msgspec.Raw(match.group(1))
    return _Routing(**found) if found else None


def metadata_bytes(metadata: dict[str, str]) -> int:
    """The size of a metadata mapping: the UTF-8 bytes of its keys and values."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(payload: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped); 0 for a scalar.

    Linear in the size, without parsing (so a deeply nested payload cannot exhaust a parser's
    stack); on malformed JSON the figure is an estimate, and the decoder reports the error.
    """
    data = payload.encode() if isinstance(payload, str) else bytes(payload)
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in brackets:
        if b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def _over(what: str, size: int, limit_name: str, limit: int, unit: str = "bytes") -> str:
    return f"{what} is {size:,} {unit}, over the limit {LIMIT_SETTINGS[limit_name]}={limit:,}"


QUOTE_MAX_CHARS = 64
"""The most characters of a refused value that a reason quotes."""


def quoted(value: str, limit: int = QUOTE_MAX_CHARS) -> str:
    """``value`` as a refusal quotes it: its repr, cut to ``limit`` characters with its length. Pure."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value):,} characters)"


# --- ids ---------------------------------------------------------------------------------------


def id_refusal(
    value: object, what: str, limits: WireLimits = DEFAULT_LIMITS, *, names_trace: bool = False
) -> str | None:
    """Why ``value`` may not be an id (trace, turn, fork, call id, agent name) → the reason, or
    None when it may. The one rule every entry point applies (the agent loop to a turn, the
    gateway to a path or a body, the ``agentstream`` commands to their arguments, a fork to its
    id), so nothing one door takes is refused behind another.

    Refused, in order: not a text; empty or only whitespace; over ``limits.max_id_bytes``
    UTF-8 bytes (not characters: ``"é"`` is 2 bytes); a control or invisible character
    (:func:`~agentstream.wire.jsontext.control_character`); with ``names_trace``, what
    :func:`~agentstream.wire.keys.trace_id_problem` refuses.

    Args:
        value: the candidate id.
        what: how the reason names it (``"a trace id"``, ``"turn message field `$.trace_id`"``).
        limits: the wire's limits (``AGENTSTREAM_MAX_ID_BYTES``).
        names_trace: the id names a trace (a trace or fork id): its keys' hash tag is checked too.

    Returns:
        ``"<what> is 300 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES=256"`` and the like
        (the value itself is not quoted: the caller quotes it, bounded, if it wants); None when
        the id may be used. Pure.
    """
    if not isinstance(value, str):
        return f"{what} is a {type(value).__name__}, not a text"
    if not value.strip():
        return f"{what} cannot be empty or only spaces"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limits.max_id_bytes:
        return _over(what, size, "max_id_bytes", limits.max_id_bytes)
    found = control_character(value)
    if found is not None:
        return f"{what} may not hold {found}; {codec.ID_RULE}"
    if names_trace:
        problem = trace_id_problem(value)
        if problem is not None:
            return f"{what} cannot name a trace: {problem}"
    return None


def size_refusal(payload: bytes | str, what: str, limits: WireLimits = DEFAULT_LIMITS) -> str | None:
    """Why a client's message is refused for its size alone → the reason, or None when it is
    within ``max_turn_bytes`` (``AGENTSTREAM_MAX_TURN_BYTES``: turns, cancels and approvals, on
    the shared streams and each backend's). Checked before anything is decoded, so a large
    message is refused for its size, not for what a decoder makes of its bytes. Pure.

    Args:
        payload: the message's bytes (or text: its UTF-8 size).
        what: how the reason names it (``"the cancel message"``).

    Returns:
        ``"the cancel message is 5,000,000 bytes, over the limit AGENTSTREAM_MAX_TURN_BYTES=524,288"``,
        or None.
    """
    size = len(payload.encode("utf-8", "surrogatepass")) if isinstance(payload, str) else len(payload)
    if size > limits.max_turn_bytes:
        return _over(what, size, "max_turn_bytes", limits.max_turn_bytes)
    return None


def depth_refusal(payload: bytes | str, what: str, limits: WireLimits = DEFAULT_LIMITS) -> str | None:
    """Why a client's message is refused for its nesting (``max_json_depth``) → the reason, or None. Pure."""
    depth = json_depth(payload)
    if depth > limits.max_json_depth:
        return _over(f"{what}'s nesting", depth, "max_json_depth", limits.max_json_depth, "levels deep")
    return None


def validate_turn(
    payload: bytes | str,
    *,
    keys: Keys,
    limits: WireLimits = DEFAULT_LIMITS,
    agents: Iterable[str] | None = None,
) -> TurnMessage:
    """A published turn's JSON → the parsed turn, when every rule of the wire holds.

    The checks, in order (a payload over a limit is refused before it is decoded): the size of
    the whole turn, its nesting depth, the schema (fields, types, non-empty ids and text), the
    length of the ids (and of ``model``), the trace id's characters (:func:`~agentstream.wire.keys.trace_id_problem`:
    its refusal names no trace, so it goes to the errors stream), the size of the metadata, the
    reply stream, and (when ``agents`` is given) that the agent exists.

    Args:
        payload: the JSON text (the ``turn`` field of a turns-stream entry, or a request body).
        keys: the namespace's keys (the reply streams are relative to it).
        limits: the limits and reply patterns (see :class:`WireLimits`).
        agents: the names of the agents that may answer; None skips that check.

    Raises:
        TurnRejected: ``code`` ``bad_turn``; ``reason`` names the field or the limit and its
            setting, with the actual size; ``limit`` is the setting's name when a limit was
            passed; ``trace_id``, ``turn_id``, ``reply_to`` and ``metadata`` are what the failure
            reply may use (see :class:`Routing`).
    """

    def rejected(reason: str, limit: str | None = None) -> TurnRejected:
        route = routing_of(payload, keys, limits)
        if route.reply_to_refusal is not None and route.reply_to_refusal not in reason:
            reason = f"{reason}; also, {route.reply_to_refusal}"
        return TurnRejected(
            reason,
            trace_id=route.trace_id,
            turn_id=route.turn_id,
            reply_to=route.reply_to,
            metadata=route.metadata,
            limit=LIMIT_SETTINGS[limit] if limit else None,
        )

    too_large = size_refusal(payload, "the turn message", limits)
    if too_large is not None:
        raise rejected(too_large, "max_turn_bytes")
    too_deep = depth_refusal(payload, "the turn message", limits)
    if too_deep is not None:
        raise rejected(too_deep, "max_json_depth")
    try:
        turn = codec.decode_turn(payload)
    except TurnRejected as exc:
        raise rejected(exc.reason) from exc
    for name in ("trace_id", "turn_id", "agent", "model"):
        value = getattr(turn, name)
        refusal = id_refusal(value, f"turn message field `$.{name}`", limits) if value is not None else None
        if refusal is not None:  # the decoder refused empty ones and control characters already
            raise rejected(refusal, "max_id_bytes" if len(value.encode()) > limits.max_id_bytes else None)
    problem = trace_id_problem(turn.trace_id)
    if problem is not None:  # no failure is written under keys this id would name: the errors stream has it
        raise TurnRejected(
            f"turn message field `$.trace_id` is {turn.trace_id!r}: {problem}",
            trace_id=None,
            turn_id=turn.turn_id,
        )
    meta_size = metadata_bytes(turn.metadata)
    if meta_size > limits.max_metadata_bytes:
        raise rejected(
            _over("turn message field `$.metadata`", meta_size, "max_metadata_bytes", limits.max_metadata_bytes),
            "max_metadata_bytes",
        )
    if turn.reply_to is not None:
        refusal = reply_stream_refusal(turn.reply_to, keys, limits)
        if refusal is not None:
            raise rejected(refusal, "reply_streams")
    if agents is not None:
        known = sorted(agents)
        if turn.agent not in known:
            raise rejected(
                f"turn {turn.turn_id!r} names agent {turn.agent!r}, which this app does not have (agents: {', '.join(known)})"
            )
    return turn


def doubled_turn_refusal(
    fields: Mapping[bytes, bytes],
    where: str,
    *,
    keys: Keys,
    limits: WireLimits = DEFAULT_LIMITS,
    field_name: bytes = b"turn",
) -> TurnRejected | None:
    """Why a turns-stream entry that gives a field more than once is refused → the refusal, or
    None when every field is given once.

    The failure reply goes where every ``turn`` value of the entry agrees it would (the same
    trace id, turn id, reply stream and metadata); when they disagree it goes to none of them
    (``trace_id``/``turn_id`` None: the errors stream), as for a doubled key inside the JSON.

    Args:
        fields: the entry's fields (an :class:`~agentstream.wire.entries.EntryFields` when a field repeats).
        where: the entry, for the reason (``"entry 1-0 of agentstream:turns"``).
        field_name: the field that carries the turn.
    """
    doubled = doubled_refusal(fields)
    if doubled is None:
        return None
    values = fields.values_of(field_name) if isinstance(fields, EntryFields) else [fields.get(field_name)]
    routes = [routing_of(value, keys, limits) if value is not None else Routing() for value in values]
    route = routes[0] if all(other == routes[0] for other in routes[1:]) else Routing()
    reason = f"turn {where}: {doubled}"
    if route.reply_to_refusal is not None:
        reason = f"{reason}; also, {route.reply_to_refusal}"
    return TurnRejected(
        reason, trace_id=route.trace_id, turn_id=route.turn_id, reply_to=route.reply_to, metadata=route.metadata
    )


# --- tool calls ------------------------------------------------------------------------------


def tool_arguments_refusal(name: str, arguments: str, limits: WireLimits = DEFAULT_LIMITS) -> str | None:
    """Why a tool call's arguments are not run → a reason for the model, or None when they may be."""
    size = len(arguments.encode())
    if size <= limits.max_tool_arguments_bytes:
        return None
    return (
        f"Error: the arguments of this call to {name!r} are {size:,} bytes, over the limit "
        f"{LIMIT_SETTINGS['max_tool_arguments_bytes']}={limits.max_tool_arguments_bytes:,}; the tool was not run. "
        "Call it with smaller arguments."
    )


def tool_result_refusal(name: str, text: str, data: object, limits: WireLimits = DEFAULT_LIMITS) -> str | None:
    """Why a tool's result is not recorded → a reason for the model, or None when it may be.

    The size is the UTF-8 text plus the JSON of ``data``.
    """
    size = len(text.encode())
    if size <= limits.max_tool_result_bytes and data is not None:
        try:
            size += len(msgspec.json.encode(data))
        except (TypeError, msgspec.EncodeError):
            pass
    if size <= limits.max_tool_result_bytes:
        return None
    return (
        f"Error: the result of tool {name!r} was {size:,} bytes or more, over the limit "
        f"{LIMIT_SETTINGS['max_tool_result_bytes']}={limits.max_tool_result_bytes:,}, so it was not recorded. "
        "The tool ran; ask for less (a smaller range, a filter) if you need its output."
    )


# --- what the errors and dead-letter streams keep -----------------------------------------------


def excerpt(payload: bytes | str | None, limit: int = DEFAULT_LIMITS.excerpt_bytes) -> bytes:
    """At most ``limit`` bytes of a payload, with a note of its whole size when it was cut."""
    if payload is None:
        return b""
    data = payload.encode() if isinstance(payload, str) else bytes(payload)
    if len(data) <= limit:
        return data
    return data[:limit] + f"... [cut: {len(data):,} bytes in all]".encode()


def error_fields(
    error: str, payload: bytes | str | None, limits: WireLimits = DEFAULT_LIMITS, **extra: str
) -> dict[bytes, bytes]:
    """The fields of an errors-stream entry: ``error``, a bounded ``payload`` excerpt, ``extra``."""
    fields = {
        b"error": excerpt(error, max(limits.excerpt_bytes, 512)),
        b"payload": excerpt(payload, limits.excerpt_bytes),
    }
    for name, value in extra.items():
        fields[name.encode()] = excerpt(value, limits.excerpt_bytes)
    return fields


def validate_approval(payload: bytes, limits: WireLimits) -> ApprovalMessage:
    """A published approval message's JSON → the :class:`~agentstream.wire.events.ApprovalMessage`,
    checked against the wire's limits before it is decoded.

    Raises:
        msgspec.DecodeError: over ``max_turn_bytes`` or ``max_json_depth`` (the message, or the
            JSON of its ``arguments``), an id over ``max_id_bytes``, or anything
            :func:`agentstream.wire.codec.decode_approval` refuses;
            the message names the field or the limit and its setting.
    """
    refusal = size_refusal(payload, "the approval message", limits) or depth_refusal(
        payload, "the approval message", limits
    )
    if refusal is not None:
        raise msgspec.DecodeError(refusal)
    message = codec.decode_approval(payload)
    if message.arguments is not None:  # JSON inside the JSON: its nesting is bounded the same way
        depth = json_depth(message.arguments)
        if depth > limits.max_json_depth:
            raise msgspec.DecodeError(
                _over(
                    "approval message field `$.arguments`'s nesting",
                    depth,
                    "max_json_depth",
                    limits.max_json_depth,
                    "levels deep",
                )
            )
    for name in ("trace_id", "call_id"):
        refusal = id_refusal(getattr(message, name), f"approval message field `$.{name}`", limits)
        if refusal is not None:
            raise msgspec.DecodeError(refusal)
    return message


def validate_cancel(payload: bytes, limits: WireLimits = DEFAULT_LIMITS) -> CancelMessage:
    """A published cancel message's JSON → the :class:`~agentstream.wire.events.CancelMessage`,
    checked against the wire's limits before it is decoded, as a turn and an approval are.

    Raises:
        msgspec.DecodeError: over ``max_turn_bytes`` or ``max_json_depth``, anything
            :func:`agentstream.wire.codec.decode_cancel` refuses, or an id :func:`id_refusal`
            refuses; the message names the field or the limit and its setting.
    """
    refusal = size_refusal(payload, "the cancel message", limits) or depth_refusal(
        payload, "the cancel message", limits
    )
    if refusal is not None:
        raise msgspec.DecodeError(refusal)
    message = codec.decode_cancel(payload)
    for name in ("trace_id", "turn_id"):
        value = getattr(message, name)
        if name == "turn_id" and not value:  # no turn id: the running turn
            continue
        refusal = id_refusal(value, f"cancel message field `$.{name}`", limits)
        if refusal is not None:
            raise msgspec.DecodeError(refusal)
    return message
