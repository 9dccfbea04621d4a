"""The wire's one rule for ids (:func:`agentstream.wire.checks.id_refusal`): what the agent loop,
the gateway, the commands and a fork all refuse, under the configured ``AGENTSTREAM_MAX_ID_BYTES``
(UTF-8 bytes, not characters)."""

from __future__ import annotations

import pytest

from agentstream.wire.checks import DEFAULT_LIMITS, WireLimits, id_refusal, quoted, validate_approval, validate_turn
from agentstream.wire.keys import Keys

LIMIT = DEFAULT_LIMITS.max_id_bytes  # 256

CASES = [  # (value, names_trace, limits, None or what the reason must say)
    ("t1", False, DEFAULT_LIMITS, None),
    ("a" * LIMIT, False, DEFAULT_LIMITS, None),
    ("a" * (LIMIT + 1), False, DEFAULT_LIMITS, "a trace id is 257 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES=256"),
    ("é" * (LIMIT // 2), False, DEFAULT_LIMITS, None),  # 256 bytes, 128 characters
    ("é" * 200, False, DEFAULT_LIMITS, "is 400 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES=256"),  # 200 characters
    ("a" * 255 + "é", False, DEFAULT_LIMITS, "is 257 bytes"),  # 256 characters, 257 bytes
    ("🙂" * 64, False, DEFAULT_LIMITS, None),  # 4 bytes each: 256
    ("🙂" * 65, False, DEFAULT_LIMITS, "is 260 bytes"),
    ("x" * 10_000, False, DEFAULT_LIMITS, "is 10,000 bytes"),
    ("a" * 300, False, WireLimits(max_id_bytes=1024), None),  # the configured limit, not 256
    ("a" * 300, False, WireLimits(max_id_bytes=64), "over the limit AGENTSTREAM_MAX_ID_BYTES=64"),
    ("", False, DEFAULT_LIMITS, "cannot be empty"),
    ("   ", False, DEFAULT_LIMITS, "cannot be empty"),
    ("\t\n", False, DEFAULT_LIMITS, "cannot be empty"),
    ("a\x00b", False, DEFAULT_LIMITS, "may not hold U+0000 (a control character) at index 1"),
    ("a\x1b[31m", False, DEFAULT_LIMITS, "may not hold U+001B"),
    ("a\u202eb", False, DEFAULT_LIMITS, "may not hold U+202E (an invisible format character)"),
    ("a\u2028b", False, DEFAULT_LIMITS, "may not hold U+2028"),
    ("x}a", False, DEFAULT_LIMITS, None),  # a turn id names no hash tag
    ("x}a", True, DEFAULT_LIMITS, "a trace id cannot name a trace: it contains '}'"),
    ("a/../b", True, DEFAULT_LIMITS, "cannot name a trace"),
    ("root/child", True, DEFAULT_LIMITS, None),  # a delegated task's trace
    (123, False, DEFAULT_LIMITS, "is a int, not a text"),
]


@pytest.mark.parametrize("value, names_trace, limits, says", CASES)
def test_the_id_rule(value, names_trace, limits, says):
    refusal = id_refusal(value, "a trace id", limits, names_trace=names_trace)
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and says in refusal, refusal
        assert refusal.startswith("a trace id ")


def test_the_size_is_checked_before_the_characters_and_the_value_is_not_quoted():
    refusal = id_refusal("\x00" * 10_000, "a call id")
    assert refusal == "a call id is 10,000 bytes, over the limit AGENTSTREAM_MAX_ID_BYTES=256"


def test_the_turn_and_the_approval_refuse_an_id_with_the_same_reason():
    keys = Keys("ns")
    long_id = "é" * 200
    turn = f'{{"trace_id": "{long_id}", "turn_id": "t1", "agent": "a", "text": "hi"}}'
    with pytest.raises(Exception) as refused:
        validate_turn(turn, keys=keys)
    assert refused.value.reason == id_refusal(long_id, "turn message field `$.trace_id`")
    assert refused.value.limit == "AGENTSTREAM_MAX_ID_BYTES"
    approval = f'{{"trace_id": "tr", "call_id": "{long_id}", "approved": true}}'.encode()
    with pytest.raises(Exception) as refused_approval:
        validate_approval(approval, DEFAULT_LIMITS)
    assert str(refused_approval.value) == id_refusal(long_id, "approval message field `$.call_id`")


def test_a_quoted_value_is_bounded():
    assert quoted("abc") == "'abc'"
    long = quoted("z" * 10_000)
    assert long.startswith("'" + "z" * 64 + "'") and "(10,000 characters)" in long and len(long) < 100
