"""The gateway's pure parts: the keys file, key checks, and a conversation's state from its events."""

from __future__ import annotations

import re

import pytest

from agentstream.errors import ConfigError
from agentstream.ops.apikeys import hash_key, load_keys, new_key, parse_keys
from agentstream.steps.timeline import (
    ConversationState,
    conversation_filter,
    conversation_state,
    reply_of,
    root_of,
    trace_agents,
)
from agentstream.wire.events import ModelOutput, TaskInput, ToolCall, ToolOutput, TurnEnded, TurnFailed, TurnInput


def test_a_key_is_found_by_its_hash_and_never_stored():
    key = new_key()
    ring = parse_keys({"keys": [{"name": "a", "sha256": hash_key(key), "agents": ["calc"]}]}, source="test")
    found = ring.find(key)
    assert found is not None and found.name == "a" and key not in repr(found)
    assert ring.find(key + "x") is None and ring.find("") is None
    assert found.may_use("calc") and not found.may_use("plan") and not found.all_agents
    assert found.may_see({"calc"}) and not found.may_see({"calc", "plan"})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "a", "sha256": "abc", "agents": ["x"]}, "keys[0].sha256 must be 64 hex digits"),
        ({"name": "", "sha256": "0" * 64, "agents": ["x"]}, "keys[0].name"),
        ({"name": "a", "sha256": "0" * 64, "agents": []}, "keys[0].agents"),
        ({"name": "a", "sha256": "0" * 64}, "keys[0].agents"),
        ("a string", "keys[0] is not an object"),
    ],
)
def test_a_bad_keys_entry_is_named(entry, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_keys({"keys": [entry]}, source="f.yaml")


def test_keys_from_text_and_file_add_up_and_names_are_unique(tmp_path):
    one = {"name": "a", "sha256": "0" * 64, "agents": ["*"]}
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - {name: b, sha256: '" + "1" * 64 + "', agents: [calc]}\n")
    ring = load_keys(text='{"keys": [' + str(one).replace("'", '"') + "]}", path=str(path))
    assert [k.name for k in ring.keys] == ["a", "b"] and ring.keys[0].all_agents
    with pytest.raises(ConfigError, match="no API keys"):
        load_keys()
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(path=str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="used twice"):
        parse_keys({"keys": [one, one]}, source="x")


def _entries(*events):
    return [(f"{1000 + i}-0", e) for i, e in enumerate(events)]


def test_the_state_of_the_newest_turn():
    turn = TurnInput(turn_id="t1", agent="calc", text="2+2?", metadata={"u": "1"})
    call = ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="calculator", arguments="{}"),))
    assert conversation_state("c", _entries(turn)).state == "running"
    waiting = conversation_state("c", _entries(turn, call))
    assert waiting.state == "waiting_on_tools" and waiting.pending_tools == ["calculator"]
    result = ToolOutput(turn_id="t1", call_id="c1", name="calculator", text="4")
    assert conversation_state("c", _entries(turn, call, result)).state == "running"
    ended = conversation_state("c", _entries(turn, call, result, TurnEnded(turn_id="t1", answer="4")))
    assert ended.state == "ended" and ended.answer == "4" and ended.updated_ms == 1003 and ended.turns == 1
    failed = conversation_state("c", _entries(turn, TurnFailed(turn_id="t1", code="model_error", reason="500")))
    assert (failed.state, failed.code, failed.reason) == ("failed", "model_error", "500")
    cancelled = conversation_state("c", _entries(turn, TurnFailed(turn_id="t1", code="cancelled", reason="by user")))
    assert cancelled.state == "cancelled"
    second = TurnInput(turn_id="t2", agent="calc", text="again")
    newest = conversation_state("c", _entries(turn, TurnEnded(turn_id="t1", answer="4"), second))
    assert (newest.turn_id, newest.state, newest.turns) == ("t2", "running", 2)
    assert conversation_state("c", _entries(call)) is None
    reply = reply_of("c", [turn, TurnEnded(turn_id="t1", answer="4")], "t1")
    assert reply.status == "ended" and reply.metadata == {"u": "1"} and reply_of("c", [turn], "t1") is None


def test_agents_and_root_of_a_child_trace():
    task = TaskInput(
        turn_id="k", agent="researcher", text="look", root_trace_id="root", parent_trace_id="root", call_id="c1"
    )
    assert root_of([task], "root/c1") == "root" and trace_agents([task]) == {"researcher"}
    assert root_of([TurnInput(turn_id="t", agent="a", text="x")], "root") == "root"


def _state(agent="calc", state="ended", **metadata):
    return ConversationState(trace_id="c", agent=agent, turn_id="t", state=state, metadata=metadata)


@pytest.mark.parametrize(
    ("filters", "state", "kept"),
    [
        ({}, _state(), True),
        ({"agent": "calc"}, _state(), True),
        ({"agent": "plan"}, _state(), False),
        ({"state": "ended"}, _state(), True),
        ({"state": "running"}, _state(), False),
        ({"meta": ["team=red"]}, _state(team="red"), True),
        ({"meta": ["team=red"]}, _state(team="blue"), False),
        ({"meta": ["team=red"]}, _state(), False),
        ({"meta": ["team="]}, _state(team=""), True),  # an empty value is a value
        ({"meta": ["q=a=b"]}, _state(q="a=b"), True),  # the key ends at the first "="
        ({"meta": ["team=red", "tier=1"]}, _state(team="red"), False),  # every pair must hold
        ({"agent": "calc", "state": "ended", "meta": ["team=red"]}, _state(team="red"), True),
    ],
)
def test_a_conversation_filter_keeps_what_matches_every_condition(filters, state, kept):
    assert conversation_filter(**filters).matches(state) is kept


@pytest.mark.parametrize(
    ("filters", "says"),
    [
        ({"agent": " "}, "agent must name an agent"),
        ({"state": "done"}, "state must be one of running, waiting_on_tools, ended, failed, cancelled, got 'done'"),
        ({"meta": ["nope"]}, "meta must be key=value, got 'nope'"),
        ({"meta": ["=v"]}, "meta must be key=value"),
        ({"meta": ["k=v"] * 9}, "at most 8 times, got 9"),
        ({"meta": ["k" * 129 + "=v"]}, "a key is at most 128"),
    ],
)
def test_a_conversation_filter_refuses_bad_values(filters, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        conversation_filter(**filters)


def test_the_state_carries_the_newest_turns_metadata():
    entries = [
        ("1-0", TurnInput(turn_id="t1", agent="calc", text="a", metadata={"n": "1"})),
        ("2-0", TurnInput(turn_id="t2", agent="calc", text="b", metadata={"n": "2"})),
    ]
    state = conversation_state("c", entries)
    assert state is not None and state.metadata == {"n": "2"}
