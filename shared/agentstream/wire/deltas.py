"""The delta stream's wire format: what a model writes while it writes (pure).

Each entry of a trace's delta stream has one field ``d`` holding the JSON of a :class:`Delta`
(kinds, order and how to follow them: :mod:`agentstream.runtime.deltas`). A model adapter sends
them to a :class:`DeltaSink`; the runtime's sink XADDs them, :class:`ListSink` keeps them.
"""

from __future__ import annotations

import secrets
from typing import Literal, Protocol

import msgspec

DeltaKind = Literal["start", "text", "reasoning", "tool_call", "abort", "end"]


class Delta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One piece of a model's reply as it is written (see the module docstring for kinds).

    Attributes:
        kind: what this piece is.
        turn_id: the turn of the model call.
        step: the model call's step within the turn.
        attempt: the id of the HTTP attempt that wrote it.
        text: the text piece (``text``, ``reasoning``, ``tool_call`` arguments).
        index: the tool call's position in the reply (``tool_call``).
        call_id: the tool call's id, when this piece first tells it.
        name: the tool's name, when this piece first tells it.
        reason: why the attempt failed (``abort``).
        stop_reason: why the model stopped (``end``).
    """

    kind: DeltaKind
    turn_id: str = ""
    step: int = 0
    attempt: str = ""
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""
    reason: str = ""
    stop_reason: str = ""


_encoder = msgspec.json.Encoder()

_decoder = msgspec.json.Decoder(Delta)


def encode_delta(delta: Delta) -> bytes:
    """A delta → its JSON bytes (the ``d`` field of an entry)."""
    return _encoder.encode(delta)


def decode_delta(payload: bytes | str) -> Delta:
    """The ``d`` field of an entry → a Delta (raises ``msgspec.DecodeError``)."""
    return _decoder.decode(payload)


def new_attempt_id() -> str:
    """A fresh attempt id (12 hex characters, random)."""
    return secrets.token_hex(6)


class DeltaSink(Protocol):
    """Where a model adapter sends the pieces of a reply while it streams."""

    async def emit(self, delta: Delta) -> None:
        """Send one piece; must not raise for a failure of its own transport."""


class ListSink:
    """A sink that keeps every delta in :attr:`deltas` (for tests and scripts)."""

    def __init__(self) -> None:
        self.deltas: list[Delta] = []

    async def emit(self, delta: Delta) -> None:
        self.deltas.append(delta)
