"""Which turn entries enter a trace before the one in hand (:mod:`agentstream.steps.turn_order`),
without Redis: the decision that keeps a conversation's publish order across agent-loop processes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from agentstream.steps.turn_order import earlier_turns, entry_order, may_name, trace_marks

FIELD = b"turn"


@dataclass(frozen=True)
class Turn:
    trace_id: str
    turn_id: str


def check(entry_id: str, fields) -> Turn | None:
    """The test's rules: JSON with trace_id and turn_id, and no ``bad`` key; a field given twice
    (a list of pairs here) is refused."""
    try:
        body = json.loads(fields[FIELD])
    except (ValueError, KeyError):
        return None
    if not isinstance(body, dict) or "bad" in body or "trace_id" not in body or "turn_id" not in body:
        return None
    return Turn(body["trace_id"], body["turn_id"])


def entry(entry_id: str, trace_id: str, turn_id: str, **more) -> tuple[str, dict[bytes, bytes]]:
    return entry_id, {FIELD: json.dumps({"trace_id": trace_id, "turn_id": turn_id, **more}).encode()}


def decide(read, *, trace_id="c1", entry_id="5-0", settled=(), calls: list | None = None):
    def counting(other_id, fields):
        if calls is not None:
            calls.append(other_id)
        return check(other_id, fields)

    got = earlier_turns(trace_id, entry_id, read, field=FIELD, settled=set(settled), check=counting)
    return [(e.entry_id, e.turn.turn_id) for e in got]


CASES = [
    ("nothing pending before it", [], []),
    ("one earlier turn of the trace", [entry("4-0", "c1", "a")], [("4-0", "a")]),
    (
        "earlier turns in stream order, whatever order read",
        [entry("4-1", "c1", "b"), entry("4-0", "c1", "a")],
        [
            ("4-0", "a"),
            ("4-1", "b"),
        ],
    ),
    (
        "ordered by number, not by text",
        [entry("3-10", "c1", "b"), entry("3-9", "c1", "a")],
        [("3-9", "a"), ("3-10", "b")],
    ),
    ("another trace's turns are not its business", [entry("4-0", "c2", "x"), entry("4-1", "c1", "a")], [("4-1", "a")]),
    ("a trace whose id holds this one's", [entry("4-0", "c10", "x"), entry("4-1", "xc1", "y")], []),
    ("the entry in hand and later ones are not earlier", [entry("5-0", "c1", "self"), entry("5-1", "c1", "later")], []),
    (
        "a malformed earlier entry is left to its own handler",
        [
            entry("4-0", "c1", "a", bad=1),
            entry("4-1", "c1", "b"),
        ],
        [("4-1", "b")],
    ),
    ("an entry without a turn field", [("4-0", {b"other": b'"c1"'})], []),
    ("a payload that is not JSON but names the trace", [("4-0", {FIELD: b'{"trace_id": "c1", '})], []),
    (
        "the first entry of a turn id; its copies are absorbed by their handlers",
        [
            entry("4-0", "c1", "a"),
            entry("4-1", "c1", "a"),
        ],
        [("4-0", "a")],
    ),
    (
        "an earlier copy of the turn in hand enters first (the first published is the turn)",
        [entry("4-0", "c1", "mine")],
        [("4-0", "mine")],
    ),
    (
        "the same entry read twice (pages overlap) counts once",
        [entry("4-0", "c1", "a"), entry("4-0", "c1", "a")],
        [("4-0", "a")],
    ),
    ("an id that is not a stream entry id is ignored", [entry("x", "c1", "a"), entry("4-", "c1", "b")], []),
]


@pytest.mark.parametrize(("read", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_which_entries_enter_before_the_one_in_hand(read, expected):
    assert decide(read) == expected


def test_entries_this_process_settled_are_not_admitted_again():
    read = [entry("4-0", "c1", "a"), entry("4-1", "c1", "b")]
    assert decide(read, settled={"4-0"}) == [("4-1", "b")]


def test_payloads_that_cannot_name_the_trace_are_never_decoded():
    calls: list[str] = []
    read = [entry("4-0", "other", "x"), entry("4-1", "c1", "a"), ("4-2", {FIELD: b"\xff not json"})]
    assert decide(read, calls=calls) == [("4-1", "a")]
    assert calls == ["4-1"]


@pytest.mark.parametrize(
    "payload",
    [
        json.dumps({"trace_id": "conv/é", "turn_id": "a"}).encode(),  # ensure_ascii: \u00e9
        b'{"trace_id": "conv\\/\xc3\xa9", "turn_id": "a"}',  # an escaped slash
        b'{"trace_id": "\\u0063onv/\xc3\xa9", "turn_id": "a"}',  # a plain letter escaped
        json.dumps({"trace_id": "conv/é", "turn_id": "a"}, ensure_ascii=False).encode(),
    ],
    ids=["ascii-escaped", "escaped-slash", "escaped-letter", "utf-8"],
)
def test_a_trace_id_spelled_with_json_escapes_still_counts(payload):
    assert may_name(payload, trace_marks("conv/é"))
    assert decide([("4-0", {FIELD: payload})], trace_id="conv/é") == [("4-0", "a")]


def test_the_marks_of_a_trace_id_with_quotes_and_backslashes_are_its_json_text():
    marks = trace_marks('a"b\\c')
    assert marks[0] == b'a\\"b\\\\c'
    assert may_name(json.dumps({"trace_id": 'a"b\\c'}).encode(), marks)
    assert not may_name(b'{"trace_id": "abc"}', marks)


def test_entry_ids_sort_as_redis_orders_them():
    assert entry_order("10-0") > entry_order("9-5") > entry_order("9-4")
    with pytest.raises(ValueError, match="not a stream entry id"):
        entry_order("9")
