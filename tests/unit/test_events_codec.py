import json

import msgspec
import pytest

from agentstream.errors import EventDecodeError, SchemaVersionError, TurnRejected
from agentstream.wire import codec
from agentstream.wire.events import (
    TRACE_SCHEMA_VERSION,
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
    UnknownEvent,
    Usage,
)

EVENTS = [
    TurnInput(turn_id="t1", agent="a", text="hi", metadata={"k": "v"}),
    ModelOutput(
        turn_id="t1",
        step=0,
        content="",
        reasoning="think",
        tool_calls=(ToolCall(id="c1", name="f", arguments='{"x": 1}'),),
        provider="openai",
        model="m",
        replay_blocks=({"type": "thinking", "signature": "SIG", "thinking": "a\n"},),
        stop_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12),
        request_sha256="ab" * 32,
    ),
    ToolOutput(turn_id="t1", call_id="c1", name="f", text="2", data={"v": 2}),
    TurnEnded(turn_id="t1", answer="2"),
    TurnFailed(turn_id="t2", code="bad_turn", reason="why"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_round_trip_is_exact(event):
    fields = codec.encode_entry(event)
    assert codec.decode_entry(fields) == event
    assert codec.encode_entry(codec.decode_entry(fields)) == fields  # byte-identical re-encode


def test_stored_tags_are_stable():
    tags = [json.loads(codec.encode(e))["type"] for e in EVENTS]
    assert tags == ["turn_input", "model_output", "tool_result", "turn_ended", "turn_failed"]


def test_replay_blocks_survive_byte_for_byte():
    block = {"type": "thinking", "thinking": "Plan: call lookup.\n", "signature": "SIG_A"}
    out = ModelOutput(turn_id="t", step=0, replay_blocks=(block,))
    assert codec.decode_entry(codec.encode_entry(out)).replay_blocks == (block,)


def test_newer_schema_version_is_refused_with_upgrade_hint():
    fields = codec.encode_entry(EVENTS[0])
    fields[b"v"] = str(TRACE_SCHEMA_VERSION + 1).encode()
    with pytest.raises(SchemaVersionError, match="upgrade agentstream"):
        codec.decode_entry(fields, trace_id="tr", entry_id="1-0")


def test_an_event_that_cannot_be_read_names_trace_and_entry():
    for payload in (b'{"kind":"nope"}', b"[1]", b'{"type":"tool_result","turn_id":1}', b'{"type": 3}'):
        with pytest.raises(EventDecodeError, match=r"trace 'tr' entry 5-0"):
            codec.decode_entry({b"v": b"1", b"e": payload}, trace_id="tr", entry_id="5-0")


def test_an_event_of_a_type_this_reader_does_not_register_is_read_as_a_placeholder_holding_it():
    event = codec.decode_entry(
        {b"v": b"1", b"e": b'{"type":"nope","turn_id":"t1","x":[1]}'}, trace_id="tr", entry_id="5-0"
    )
    assert event == UnknownEvent(stored_type="nope", turn_id="t1", raw={"type": "nope", "turn_id": "t1", "x": [1]})


def test_turn_decode_errors_say_what_and_where():
    with pytest.raises(TurnRejected, match="not valid JSON"):
        codec.decode_turn(b"{not json")
    with pytest.raises(TurnRejected, match=r"\$\.\w+|turn_id") as info:
        codec.decode_turn(b'{"trace_id": "c", "agent": "a", "text": "x"}')
    assert info.value.trace_id == "c" and info.value.turn_id is None
    with pytest.raises(TurnRejected, match=r"\$\.text"):
        codec.decode_turn(b'{"trace_id": "c", "turn_id": "t", "agent": "a", "text": 5}')
    with pytest.raises(TurnRejected, match="empty"):
        codec.decode_turn(b'{"trace_id": "c", "turn_id": " ", "agent": "a", "text": "x"}')


def test_turn_schema_is_json_schema_of_the_wire_format():
    schema = codec.turn_message_schema()
    body = schema["$defs"]["TurnMessage"]
    assert set(body["required"]) == {"trace_id", "turn_id", "agent"}  # and `text` or `input`
    assert {"text", "input"} <= set(body["properties"])
    assert schema["$schema"].startswith("https://json-schema.org/")
    msgspec.json.encode(schema)


def test_the_schema_version_went_up_with_rolls_back_and_older_entries_still_read():
    from agentstream.wire.events import TRACE_SCHEMA_VERSIONS_READ, ToolsOffered

    assert TRACE_SCHEMA_VERSION == 3 and TRACE_SCHEMA_VERSIONS_READ == (1, 2, 3)
    # each entry under the oldest version that reads it: 3 only for what 2 cannot read
    assert codec.encode_entry(EVENTS[0])[b"v"] == b"2"
    assert codec.encode_entry(TurnInput(turn_id="t2", agent="a", text="x", rolls_back="t1"))[b"v"] == b"3"
    assert codec.decode_entry(
        codec.encode_entry(ToolsOffered(turn_id="t1", step=0, agent="a")), trace_id="tr"
    ) == ToolsOffered(turn_id="t1", step=0, agent="a")
    rolled = TurnInput(turn_id="t2", agent="a", text="again", rolls_back="t1")
    assert codec.decode_entry(codec.encode_entry(rolled), trace_id="tr") == rolled
    for version in (b"1", b"2"):
        for event in EVENTS:  # written by versions 1 and 2: the same bytes, read as they were
            old = {b"v": version, b"e": codec.encode(event)}
            assert codec.decode_entry(old, trace_id="tr", entry_id="1-0") == event


def test_the_schema_version_went_up_with_approvals_and_version_2_entries_still_read():
    from agentstream.wire.events import ApprovalAwaited, ApprovalDecided

    for event in (
        ApprovalAwaited(turn_id="t1", call_id="c1", name="pay", due_ms=5, editable=True, why="w"),
        ApprovalDecided(turn_id="t1", call_id="c1", name="pay", approved=False, by="ana", reason="r"),
    ):
        assert codec.decode_entry(codec.encode_entry(event), trace_id="tr") == event
    for event in EVENTS:  # written by version 2: read as they were
        old = {b"v": b"2", b"e": codec.encode(event)}
        assert codec.decode_entry(old, trace_id="tr", entry_id="1-0") == event
