"""The hand-back of an ended child trace as its parent's tool result (pure)."""

from __future__ import annotations

import json

import pydantic

from agentstream.context import ToolResultMessage, build_messages
from agentstream.delegation import TIMED_OUT, Delegation, ending_of, hand_back, timed_out
from agentstream.wire.codec import TraceCodec
from agentstream.wire.events import (
    Document,
    ModelOutput,
    Passage,
    Source,
    TaskInput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)


class Question(pydantic.BaseModel):
    question: str


SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}}, "required": ["verdict"]}
plain = Delegation(name="ask", description="Ask.", input=Question, agent="worker")
typed = Delegation(name="judge", description="Judge.", input=Question, agent="worker", result_schema=SCHEMA)


def task(name: str = "ask", expects=None, call_id: str = "call_9", deadline_s: float = 300.0) -> TaskInput:
    return TaskInput(
        turn_id=call_id,
        agent="worker",
        text="research X",
        call_id=call_id,
        parent_trace_id="P",
        parent_turn_id="t1",
        root_trace_id="P",
        depth=1,
        delegation=name,
        expects=expects,
        deadline_s=deadline_s,
    )


def ended(*middle, answer: str, start: TaskInput | None = None) -> list:
    start = start or task()
    return [
        start,
        *middle,
        ModelOutput(turn_id=start.turn_id, step=len(middle), content=answer),
        TurnEnded(turn_id=start.turn_id, answer=answer),
    ]


def test_an_answer_becomes_the_result_of_the_parents_call():
    result = hand_back(plain, ended(answer="X is a thing."))
    assert (result.turn_id, result.call_id, result.name) == ("t1", "call_9", "ask")
    assert result.text == "X is a thing." and result.error is None


def test_every_source_the_child_was_shown_comes_back_with_its_whole_and_the_text_without_its_numbers():
    doc = Document(id="https://d", title="D", text="whole")
    cited = Passage(id="https://d#2", ref="https://d", text="the fact")
    uncited = Source(id="https://e", text="other")
    part = Passage(id="https://f#1", ref="https://f", text="a part shown before its whole")
    whole = Document(id="https://f", title="F", url="https://f")
    lookup = ModelOutput(
        turn_id="call_9",
        step=0,
        tool_calls=(ToolCall(id="c1", name="lookup", arguments="{}"), ToolCall(id="c2", name="lookup", arguments="{}")),
        stop_reason="tool_calls",
    )
    found = ToolOutput(turn_id="call_9", call_id="c1", name="lookup", text="found", elements=(cited, doc, uncited))
    more = ToolOutput(turn_id="call_9", call_id="c2", name="lookup", text="more", elements=(part, whole))
    late = ToolOutput(
        turn_id="call_9", call_id="c1", name="lookup", text="late", elements=(Source(id="never", text="x"),), late=True
    )
    result = hand_back(plain, ended(lookup, found, more, late, answer="X is true [1]. See also [9] and [x]."))
    assert result.text == "X is true. See also [9] and [x]."  # only marks that resolve are taken out
    assert result.elements == (doc, cited, uncited, whole, part)  # each whole before its parts; nothing late
    (citation,) = result.data["citations"]
    assert citation["id"] == "https://d#2" and citation["title"] == "D" and citation["whole"] == "https://d"
    assert result.text[slice(*citation["spans"][0])] == "X is true"


def test_c28_an_empty_answer_is_an_incomplete_result_never_a_silent_success():
    events = [task(), TurnEnded(turn_id="call_9", answer="   ")]
    result = hand_back(plain, events)
    assert result.error == "incomplete" and "without a result" in result.text
    nothing = Delegation(name="ask", description="Ask.", input=Question, agent="worker", result=lambda events: None)
    assert hand_back(nothing, ended(answer="fine")).error == "incomplete"


def test_a_result_that_fits_the_schema_comes_back_as_data():
    result = hand_back(typed, ended(answer='```json\n{"verdict": "yes"}\n```', start=task("judge", SCHEMA)))
    assert result.error is None and result.data == {"verdict": "yes"} and json.loads(result.text) == {"verdict": "yes"}


def test_a_result_that_does_not_fit_the_schema_is_an_error_the_model_sees():
    wrong = hand_back(typed, ended(answer='{"verdict": "maybe"}', start=task("judge", SCHEMA)))
    assert wrong.error == "schema_mismatch" and "verdict" in wrong.text and "maybe" in wrong.text
    prose = hand_back(typed, ended(answer="I think yes.", start=task("judge", SCHEMA)))
    assert prose.error == "schema_mismatch" and "not the JSON" in prose.text and "I think yes." in prose.text
    # a lone surrogate escape: json.loads made a string the parent's trace could not store
    lone = hand_back(typed, ended(answer='{"verdict": "y\\ud800"}', start=task("judge", SCHEMA)))
    assert lone.error == "schema_mismatch" and "not Unicode" in lone.text and lone.data is None, lone
    assert TraceCodec().unstorable(lone) is None  # the parent's trace stores it


def test_a_result_function_that_raises_is_an_error_result():
    def broken(events):
        raise KeyError("nope")

    result = hand_back(
        Delegation(name="ask", description="Ask.", input=Question, agent="worker", result=broken), ended(answer="x")
    )
    assert result.error == "result_error" and "KeyError" in result.text


def test_a_failed_child_is_an_error_result_with_its_partial_output():
    start = task()
    events = [
        start,
        ModelOutput(turn_id="call_9", step=0, content="Half done: A is 1."),
        TurnFailed(turn_id="call_9", code="passes_cap", reason="reached its passes cap"),
    ]
    result = hand_back(plain, events)
    assert result.error == "passes_cap" and "passes cap" in result.text and "Half done: A is 1." in result.text


def test_c28_a_child_killed_at_its_deadline_has_one_ending_and_the_parent_gets_a_timed_out_result():
    # P delegated "research X" as call_9; child C1 called web_search and was never heard of again.
    start = task(deadline_s=300)
    search = ModelOutput(
        turn_id="call_9",
        step=0,
        tool_calls=(ToolCall(id="c1", name="web_search", arguments="{}"),),
        stop_reason="tool_calls",
    )
    partial = ToolOutput(turn_id="call_9", call_id="c1", name="web_search", text="two pages")
    ending = timed_out(start)
    events = [start, search, partial, ending]
    assert ending_of(events, "call_9") == ending and ending.code == TIMED_OUT and "300 s" in ending.reason
    result = hand_back(plain, events)
    assert result.call_id == "call_9" and result.error == TIMED_OUT
    assert "deadline" in result.text and "1. web_search({}) -> ok: two pages" in result.text  # what it did (the digest)


def test_parallel_delegations_come_back_in_call_order_whatever_order_they_end_in():
    turn = TurnInput(turn_id="t1", agent="lead", text="Compare A and B")
    calls = (
        ToolCall(id="call_A", name="ask", arguments='{"question":"A"}'),
        ToolCall(id="call_B", name="ask", arguments='{"question":"B"}'),
    )
    out = ModelOutput(turn_id="t1", step=0, tool_calls=calls, stop_reason="tool_calls")
    child_a = ended(answer="A-result", start=task(call_id="call_A"))
    child_b = ended(answer="B-result", start=task(call_id="call_B"))
    results = [hand_back(plain, child_b), hand_back(plain, child_a)]  # B ended first
    messages = build_messages([turn, out, *results])
    shown = [(m.call_id, m.text) for m in messages if isinstance(m, ToolResultMessage)]
    assert shown == [("call_A", "A-result"), ("call_B", "B-result")]


def test_a_child_that_ends_without_text_hands_back_a_digest_of_its_calls():
    # issue 11 item 9: not "(no text; N tool result(s) gathered)", but what it did
    write = ModelOutput(
        turn_id="call_9",
        step=0,
        stop_reason="tool_calls",
        tool_calls=(
            ToolCall(id="c1", name="write_file", arguments=json.dumps({"path": "out.txt", "content": "x" * 1000})),
            ToolCall(id="c2", name="delete_file", arguments='{"path": "old.txt"}'),
            ToolCall(id="c3", name="slow", arguments="{}"),
        ),
    )
    wrote = ToolOutput(turn_id="call_9", call_id="c1", name="write_file", text="wrote 1000 bytes to out.txt")
    refused = ToolOutput(
        turn_id="call_9", call_id="c2", name="delete_file", text="Error: permission denied", error="tool_error"
    )
    silent = ModelOutput(turn_id="call_9", step=1, content="", stop_reason="stop")
    events = [
        task(),
        write,
        wrote,
        refused,
        silent,
        TurnFailed(turn_id="call_9", code="empty_reply", reason="the model gave an empty reply"),
    ]
    result = hand_back(plain, events)
    assert result.error == "empty_reply"
    lines = result.text.splitlines()
    assert "it failed (empty_reply) after 2 model call(s), last stop reason stop; tool calls: 3." in lines[1]
    assert (
        lines[2].startswith('1. write_file({"path": "out.txt", "content": "xxx')
        and "characters in all]) -> ok: wrote 1000 bytes to out.txt" in lines[2]
    )
    assert lines[3] == '2. delete_file({"path": "old.txt"}) -> error tool_error: Error: permission denied'
    assert lines[4] == "3. slow({}) -> error no_result: (no result)"
    digest = result.data["digest"]
    assert digest["ended"] == "failed" and digest["code"] == "empty_reply" and digest["stop_reason"] == "stop"
    assert [c["name"] for c in digest["tool_calls"]] == ["write_file", "delete_file", "slow"]
    assert len(digest["tool_calls"][0]["arguments"]) < 400
    # an answer that is empty: incomplete, with the same digest
    empty = hand_back(
        plain,
        [
            task(),
            write,
            wrote,
            ModelOutput(turn_id="call_9", step=1, content=" "),
            TurnEnded(turn_id="call_9", answer=" "),
        ],
    )
    assert empty.error == "incomplete" and "write_file(" in empty.text and empty.data["digest"]["ended"] == "ended"
