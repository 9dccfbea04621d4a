"""Call ids that name one call of one trace (agentstream.steps.call_ids): pure, no Redis."""

from agentstream.steps.call_ids import scope_call_ids
from agentstream.wire.events import ModelOutput, ToolCall, TurnInput


def output(turn_id, step, *ids):
    return ModelOutput(turn_id=turn_id, step=step, tool_calls=tuple(ToolCall(id=i, name="work") for i in ids))


def test_fresh_ids_are_kept_as_they_are():
    out = output("t1", 0, "a", "b")
    assert scope_call_ids(out, [TurnInput(turn_id="t1", agent="x", text="y")]) is out


def test_an_id_repeated_in_one_output_and_in_a_later_turn_gets_a_fresh_id():
    first = scope_call_ids(output("t1", 0, "call_0", "call_0", "call_0"), [])
    assert [c.id for c in first.tool_calls] == ["call_0", "call_0_r2", "call_0_r3"]
    later = scope_call_ids(output("t2", 0, "call_0", "call_0_r2"), [first])
    assert [c.id for c in later.tool_calls] == ["call_0_r4", "call_0_r2_r2"]
    assert all(c.name == "work" for c in later.tool_calls)


def test_renaming_is_deterministic():
    history = [scope_call_ids(output("t1", 0, "x", "x"), [])]
    again = output("t2", 1, "x", "y", "x")
    assert scope_call_ids(again, history) == scope_call_ids(again, history)


def test_the_callers_set_of_ids_is_read_not_changed():
    used = {"call_0", "call_0_r2"}
    scoped = scope_call_ids(output("t3", 0, "call_0", "call_0", "fresh"), used=used)
    assert [c.id for c in scoped.tool_calls] == ["call_0_r3", "call_0_r4", "fresh"]
    assert used == {"call_0", "call_0_r2"}  # the fold adds the ids itself, when the output is folded
