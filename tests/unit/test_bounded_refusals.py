"""Refusals of a client's message stay small (issue 36 trial): a reason that quotes what the sender
wrote is cut before it is stored in a trace, sent on a reply or logged, and JSON nested inside a
field is held to the wire's depth limit like the message around it. Pure: no Redis."""

from __future__ import annotations

import json

import msgspec
import pytest

from agentstream.errors import REASON_MAX_CHARS, TurnRejected, bounded_reason
from agentstream.wire import codec
from agentstream.wire.checks import DEFAULT_LIMITS, validate_approval, validate_turn
from agentstream.wire.keys import Keys

KEYS = Keys("ns")
TURN = {"trace_id": "c1", "turn_id": "t1", "agent": "a", "text": "hi"}


def test_a_turn_with_a_huge_unknown_field_name_is_refused_with_a_bounded_reason():
    payload = json.dumps({**TURN, "f" * 400_000: 1})
    with pytest.raises(TurnRejected) as refused:
        validate_turn(payload, keys=KEYS)
    reason = refused.value.reason
    assert "unknown field" in reason and len(reason) <= REASON_MAX_CHARS + 60
    assert "characters in all" in reason  # the cut says so
    assert (refused.value.trace_id, refused.value.turn_id) == ("c1", "t1")  # still answered on its reply


def test_a_turn_naming_a_huge_model_is_refused_at_the_wire_by_the_id_limit():
    with pytest.raises(TurnRejected) as refused:
        validate_turn(json.dumps({**TURN, "model": "M" * 400_000}), keys=KEYS)
    assert "`$.model`" in refused.value.reason and "AGENTSTREAM_MAX_ID_BYTES" in refused.value.reason
    assert len(refused.value.reason) < 300


def test_a_short_reason_is_kept_whole():
    assert bounded_reason("turn message field `$.text` is empty") == "turn message field `$.text` is empty"
    assert TurnRejected("x" * REASON_MAX_CHARS).reason == "x" * REASON_MAX_CHARS


@pytest.mark.parametrize("depth", [DEFAULT_LIMITS.max_json_depth + 1, 5000])
def test_edited_arguments_nested_past_the_wire_depth_are_refused_as_malformed_not_crashing(depth):
    arguments = '{"x": ' + "[" * depth + "]" * depth + "}"
    payload = json.dumps({"trace_id": "c1", "call_id": "c", "approved": True, "arguments": arguments}).encode()
    with pytest.raises(msgspec.DecodeError) as refused:
        validate_approval(payload, DEFAULT_LIMITS)
    said = str(refused.value)
    assert "`$.arguments`" in said
    assert "AGENTSTREAM_MAX_JSON_DEPTH" in said or "nested too deeply" in said  # past the decoder's own depth


def test_the_codec_alone_reports_too_deep_edited_arguments_as_a_decode_error():
    arguments = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    payload = json.dumps({"trace_id": "c1", "call_id": "c", "approved": True, "arguments": arguments}).encode()
    with pytest.raises(msgspec.DecodeError) as refused:  # not RecursionError: the handler reports it
        codec.decode_approval(payload)
    assert "`$.arguments`" in str(refused.value)
