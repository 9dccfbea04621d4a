"""Backends confined to their own conversations: who may touch which trace and reply stream.

A deployment that names its backends (setting ``AGENTSTREAM_BACKENDS``, e.g.
``backend-7,backend-8``) gives each backend ``b``:

- its own turns stream ``<ns>:backends:<b>:turns`` (partitioned as the shared turns stream:
  ``...:turns:p<k>``), cancel stream ``<ns>:backends:<b>:cancel`` and approvals stream
  ``<ns>:backends:<b>:approvals``, which a Redis ACL lets only ``b`` write (every key under
  ``<ns>:backends:<b>:``);
- its conversations: the trace ids that begin with ``<b>:`` (``backend-7:conv-42``; a
  subagent's child trace ``backend-7:conv-42/...`` too);
- its replies streams: ``<ns>:replies:<b>`` and the streams under ``<ns>:replies:<b>:``.

A turn, a cancel or an approval read from ``b``'s stream may only name ``b``'s conversations, and
a turn only ``b``'s replies streams (a turn without ``reply_to`` is answered on
``<ns>:replies:<b>``); a cancel's ``by`` is ``b``, whatever the message says, and an approval's
is ``b/<its by>``. Redis does not record who wrote an entry,
so the stream an entry came on is the only sender the services can trust: these rules, with
the ACL, make a backend unable to start, continue, read, cancel or be answered about another
backend's conversation. Entries of the shared streams (``<ns>:turns``, ``<ns>:cancel``) are
trusted as before (``<ns>:approvals`` too): in a confined deployment only the services, the
gateway and operators may write them (the ACL gives backends no access to them).

A backend's name is 1 to 64 of ``A-Z a-z 0-9 _ -``, beginning with a letter or a digit: no
``:`` (so no backend's prefix is inside another's), no hash-tag or glob character (it goes into
key names, ACL patterns and the trace's hash tag ``{<trace id>}``).

Pure: no Redis, no asyncio. The agent loop and the gateway decide with these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from agentstream.errors import ConfigError
from agentstream.wire.events import APPROVAL_BY_MAX_CHARS, ApprovalMessage, CancelMessage

BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
"""What a backend's name is: 1 to 64 of ``A-Z a-z 0-9 _ -``, the first a letter or a digit."""

TRACE_SEPARATOR = ":"
"""What follows a backend's name at the start of its trace ids (``backend-7:conv-42``)."""


def backend_name_problem(name: str) -> str | None:
    """Why ``name`` may not name a backend, or None when it may (see :data:`BACKEND_NAME`)."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a text"
    if not BACKEND_NAME.match(name):
        return (
            "a backend's name is 1 to 64 of the letters A-Z a-z, the digits, '_' and '-', beginning with "
            "a letter or a digit (it goes into key names, ACL patterns and trace ids)"
        )
    return None


def check_backends(names: Iterable[str]) -> tuple[str, ...]:
    """The backends' names, each once, in order, when every one may name a backend.

    Raises:
        ConfigError: a name cannot be used (:func:`backend_name_problem`), or is given twice;
            the message names it and the setting ``AGENTSTREAM_BACKENDS``.
    """
    seen: list[str] = []
    for name in names:
        problem = backend_name_problem(name)
        if problem:
            raise ConfigError(f"backend name {name!r} (AGENTSTREAM_BACKENDS) cannot be used: {problem}")
        if name in seen:
            raise ConfigError(f"backend name {name!r} is given twice in AGENTSTREAM_BACKENDS")
        seen.append(name)
    return tuple(seen)


def trace_prefix(backend: str) -> str:
    """What every trace id of ``backend``'s conversations begins with: ``<backend>:``."""
    return f"{backend}{TRACE_SEPARATOR}"


def owns_trace(backend: str, trace_id: str) -> bool:
    """Whether ``trace_id`` is one of ``backend``'s conversations (or their child traces): it
    begins with ``<backend>:`` and something follows."""
    prefix = trace_prefix(backend)
    return trace_id.startswith(prefix) and len(trace_id) > len(prefix)


def trace_refusal(backend: str | None, trace_id: str, what: str = "turn") -> str | None:
    """Why a ``what`` (``"turn"``, ``"cancel"``, a gateway key's request) from ``backend`` may not
    touch trace ``trace_id`` → the reason, or None when it may (``backend`` None: a trusted
    sender, which may touch any trace)."""
    if backend is None or owns_trace(backend, trace_id):
        return None
    return (
        f"{what} from backend {backend!r} names trace {trace_id!r}, which is not one of its conversations: "
        f"a backend's trace ids begin with {trace_prefix(backend)!r} (such as {trace_prefix(backend) + 'conv-1'!r})"
    )


def owns_reply_stream(backend: str, replies: str, reply_to: str) -> bool:
    """Whether ``reply_to`` is one of ``backend``'s replies streams: ``<replies>:<backend>`` or a
    stream under it (``replies`` is the namespace's replies stream, ``<ns>:replies``)."""
    own = f"{replies}:{backend}"
    return reply_to == own or reply_to.startswith(f"{own}:")


def reply_stream_of(backend: str, replies: str) -> str:
    """``backend``'s replies stream: ``<replies>:<backend>`` (where its turns without a
    ``reply_to``, and its refused turns, are answered)."""
    return f"{replies}:{backend}"


def reply_refusal(backend: str | None, replies: str, reply_to: str | None) -> str | None:
    """Why a turn from ``backend`` may not be answered on ``reply_to`` → the reason, or None when
    it may (``backend`` None: trusted; a missing ``reply_to`` is the backend's own stream)."""
    if backend is None or reply_to is None or owns_reply_stream(backend, replies, reply_to):
        return None
    own = reply_stream_of(backend, replies)
    return (
        f"turn from backend {backend!r} asks for its reply on {reply_to!r}, which is not one of its replies "
        f"streams ({own!r} or a stream under {own + ':'!r})"
    )


@dataclass(frozen=True)
class TurnScope:
    """What a turn from a backend's stream may do (see :func:`turn_scope`).

    Attributes:
        refusal: why the turn may not touch what it names; None when it may.
        reply_to: where its reply (or its refusal) goes: the turn's own ``reply_to`` when it may
            use it, else the backend's replies stream; None for a trusted turn that named none
            (the default replies stream).
    """

    refusal: str | None
    reply_to: str | None


def turn_scope(backend: str | None, replies: str, trace_id: str | None, reply_to: str | None) -> TurnScope:
    """Whether a turn read from ``backend``'s turns stream (None: a shared, trusted stream) may
    enter trace ``trace_id`` and be answered on ``reply_to``, and where its reply goes.

    ``trace_id`` None (a turn too malformed to name one) touches no trace: it is not refused
    here (the wire's own checks report it). A refused turn is answered on the backend's own
    replies stream, never on the stream it named. Pure.
    """
    if backend is None:
        return TurnScope(None, reply_to)
    refusal = trace_refusal(backend, trace_id, "turn") if trace_id is not None else None
    refusal = refusal or reply_refusal(backend, replies, reply_to)
    own = reply_stream_of(backend, replies)
    if refusal is not None or reply_to is None:
        return TurnScope(refusal, own)
    return TurnScope(None, reply_to)


def confined_cancel(backend: str | None, message: CancelMessage) -> tuple[CancelMessage | None, str | None]:
    """A cancel read from ``backend``'s cancel stream (None: the shared, trusted one) → (the cancel
    to act on, None) or (None, why it is refused).

    A backend may cancel only its own conversations' turns, and its cancel's ``by`` is the
    backend's name whatever the message says. A cancel of the shared stream is taken as it is.
    """
    if backend is None:
        return message, None
    refusal = trace_refusal(backend, message.trace_id, "cancel")
    if refusal is not None:
        return None, refusal
    return msgspec.structs.replace(message, by=backend), None


def confined_approval(backend: str | None, message: ApprovalMessage) -> tuple[ApprovalMessage | None, str | None]:
    """An approval read from ``backend``'s approvals stream (None: the shared, trusted one) →
    (the approval to act on, None) or (None, why it is refused).

    A backend may decide only its own conversations' calls, and its decision's ``by`` is the
    backend's name, followed by ``/`` and the name the message gives, if any (``billing/ana``): who
    decided stays on record, and which backend vouched for it cannot be forged. A decision of the
    shared stream is taken as it is. Pure.
    """
    if backend is None:
        return message, None
    refusal = trace_refusal(backend, message.trace_id, "approval")
    if refusal is not None:
        return None, refusal
    by = f"{backend}/{message.by}" if message.by else backend
    return msgspec.structs.replace(message, by=by[:APPROVAL_BY_MAX_CHARS]), None
