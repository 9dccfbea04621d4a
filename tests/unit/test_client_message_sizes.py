"""A client's message is refused for its size before anything decodes it, with one reason for
turns, cancels and approvals (:func:`agentstream.wire.checks.size_refusal`)."""

from __future__ import annotations

import msgspec
import pytest

from agentstream.errors import TurnRejected
from agentstream.wire.checks import (
    DEFAULT_LIMITS,
    WireLimits,
    size_refusal,
    validate_approval,
    validate_cancel,
    validate_turn,
)
from agentstream.wire.keys import Keys

LIMIT = DEFAULT_LIMITS.max_turn_bytes
OVER = "over the limit AGENTSTREAM_MAX_TURN_BYTES=524,288"


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b"x" * LIMIT, None),
        (b"x" * (LIMIT + 1), f"the cancel message is 524,289 bytes, {OVER}"),
        (b"\x00" * 5_000_000, f"the cancel message is 5,000,000 bytes, {OVER}"),
        ("é" * (LIMIT // 2 + 1), f"is 524,290 bytes, {OVER}"),  # UTF-8 bytes, not characters
    ],
)
def test_the_size_rule(payload, says):
    refusal = size_refusal(payload, "the cancel message")
    assert refusal is None if says is None else (refusal is not None and says in refusal), refusal


@pytest.mark.parametrize("payload", [b"\x00" * 5_000_000, b'{"trace_id": "' + b"{" * 600_000 + b'"}'])
def test_cancels_approvals_and_turns_say_the_same_for_a_large_message(payload):
    with pytest.raises(msgspec.DecodeError) as cancel:
        validate_cancel(payload)
    with pytest.raises(msgspec.DecodeError) as approval:
        validate_approval(payload, DEFAULT_LIMITS)
    with pytest.raises(TurnRejected) as turn:
        validate_turn(payload, keys=Keys("ns"))
    size = f"is {len(payload):,} bytes, {OVER}"
    assert str(cancel.value) == f"the cancel message {size}"
    assert str(approval.value) == f"the approval message {size}"
    assert turn.value.reason == f"the turn message {size}"


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b'{"trace_id": "c1"}', None),
        (b'{"trace_id": "c1", "turn_id": ""}', None),  # no turn id: the running turn
        (
            b'{"trace_id": "' + "é".encode() * 200 + b'"}',
            "`$.trace_id` is 400 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES",
        ),
        (b'{"trace_id": "c1", "turn_id": "' + b"t" * 300 + b'"}', "`$.turn_id` is 300 bytes"),
        (b'{"trace_id": "c1", "turn_id": "  "}', "`$.turn_id` cannot be empty"),
        (b'{"trace_id": "a}b"}', "it contains '}'"),
        (b"[" * 40 + b"]" * 40, "nesting is 40 levels deep"),
        (b"\x00", "malformed"),
    ],
)
def test_a_cancel_is_held_to_the_wires_rules(payload, says):
    if says is None:
        assert validate_cancel(payload).trace_id == "c1"
        return
    with pytest.raises(msgspec.DecodeError) as refused:
        validate_cancel(payload)
    assert says in str(refused.value), str(refused.value)


def test_the_configured_limit_is_the_one_applied():
    assert size_refusal(b"x" * 2000, "the cancel message", WireLimits(max_turn_bytes=1024)) is not None
    assert validate_cancel(b'{"trace_id": "c1", "reason": "' + b"r" * 100 + b'"}', WireLimits(max_turn_bytes=1024))
