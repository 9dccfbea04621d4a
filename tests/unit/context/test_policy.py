"""The context policy: thresholds, shrinks over selections, floors, min gain, reopen, images."""

from __future__ import annotations

import pytest

from agentstream.context import (
    BRACKETS,
    COMPRESSED,
    FULL,
    STUBBED,
    Compress,
    ContextConfig,
    ContextPolicy,
    ContextView,
    Share,
    Stub,
    Tokens,
    build_context,
    results,
    rounds,
    turns,
)
from agentstream.context.policy import Selection
from agentstream.wire.events import Document, Image, ModelOutput, ToolCall
from tests.unit.context.factory import Trace, make_agent

BIG = "lorem ipsum " * 150  # about 600 tokens


def long_trace(count: int, **result_kwargs) -> tuple[Trace, str]:
    trace = Trace()
    for index in range(count):
        trace.tool_turn(f"question {index}", [BIG], f"answer {index}", **result_kwargs)
    return trace, trace.user("last question")


def forms(built) -> dict[str, str]:
    return {s.handle: s.form.name for s in built.shrunk}


def test_selections_count_from_the_oldest_and_out_of_range_selects_nothing():
    view = ContextView(
        turns=[["r1"], ["r2", "r3"], [], ["r4"]],
        rounds=[["r1"], ["r2", "r3"], ["r4"]],
        results=["r1", "r2", "r3", "r4"],
        tools={},
        cited=frozenset(),
    )
    assert turns[:-2].handles(view) == ["r1", "r2", "r3"]
    assert rounds[-1].handles(view) == ["r4"]
    assert results[:-3].handles(view) == ["r1"]
    assert turns[7].handles(view) == [] and turns[-9].handles(view) == []
    assert Selection("turns", slice(None, -2)).picked(5) == [0, 1, 2]
    assert repr(turns[:-2]) == "turns[:-2]" and repr(rounds[3]) == "rounds[3]"


def test_policy_defaults_and_checks():
    policy = ContextPolicy()
    assert (policy.start_at, policy.target, policy.min_gain) == (Share(0.6), Share(0.4), Share(0.1))
    assert policy.shrink == (Compress(turns[:-2]), Stub(turns[:-4]), Stub(turns[-3:], when=Share(0.85)))
    assert policy.result_cap == Tokens(8000) and policy.output_reserve == Tokens(8192)
    assert policy.reopen is not None and policy.compact is None and policy.max_images is None
    with pytest.raises(ValueError):
        ContextPolicy(start_at=Share(0.4), target=Share(0.5))
    with pytest.raises(ValueError):
        ContextPolicy(max_images=-1)
    with pytest.raises(ValueError):
        Share(1.5)


def test_under_start_at_nothing_shrinks_and_the_reopen_tool_is_not_offered():
    trace, last = long_trace(3)
    built = build_context(trace.events, make_agent(window=100_000), turn_id=last, step=0)
    assert built.shrunk == () and [t.name for t in built.request.tools] == ["search", "calc"]


def test_over_start_at_old_results_are_compressed_then_stubbed_down_to_target():
    trace, last = long_trace(10)
    agent = make_agent(window=8_000, policy=ContextPolicy(output_reserve=Tokens(500)))
    built = build_context(trace.events, agent, turn_id=last, step=0)
    assert built.size_tokens <= 8_000 * 0.6
    shown = forms(built)
    assert shown, "something shrank"
    # The newest two turns before the running one are never touched by the default shrinks under 85 %.
    assert "r10" not in shown and "r9" not in shown
    assert set(shown.values()) <= {"COMPRESSED", "STUBBED"}
    assert [t.name for t in built.request.tools] == ["search", "calc", "reopen"]
    stub = next(m for m in built.request.messages if getattr(m, "call_id", "") == "call_1")
    assert stub.text.startswith("[result r1 of search")


def test_a_shrunk_result_keeps_its_form_and_the_prefix_is_stable_afterwards():
    trace, last = long_trace(10)
    agent = make_agent(window=8_000, policy=ContextPolicy(output_reserve=Tokens(500)))
    before = build_context(trace.events, agent, turn_id=last, step=0)
    trace.answer(last, "short answer")
    trace.end(last)
    nxt = trace.user("one more")
    after = build_context(trace.events, agent, turn_id=nxt, step=0)
    assert after.request.messages[: len(before.request.messages)] == before.request.messages


def test_min_gain_skips_a_pass_that_frees_too_little():
    trace = Trace()
    for index in range(6):
        trace.tool_turn(f"q{index}", ["small result " * 25], "a" * 400)
    last = trace.user("next")
    policy = ContextPolicy(start_at=Tokens(600), target=Tokens(300), min_gain=Tokens(5000), output_reserve=Tokens(100))
    assert build_context(trace.events, make_agent(window=10_000, policy=policy), turn_id=last, step=0).shrunk == ()
    eager = ContextPolicy(start_at=Tokens(600), target=Tokens(300), min_gain=None, output_reserve=Tokens(100))
    assert build_context(trace.events, make_agent(window=10_000, policy=eager), turn_id=last, step=0).shrunk != ()


def test_a_pass_not_made_for_freeing_too_little_is_made_once_the_context_is_over_the_window():
    # The same results as at the call before, where stubbing r1 freed less than min_gain; a long
    # reply since then puts the context over the window, so now the pass must be made.
    policy = ContextPolicy(
        shrink=(Stub(results[-3:-1]),), min_gain=Tokens(300), output_reserve=Tokens(100), reopen=None, result_cap=None
    )
    agent = make_agent(window=1000, policy=policy)
    trace = Trace()
    trace.tool_turn("first", ["a" * 450])
    trace.tool_turn("second", ["b" * 450])
    turn = trace.user("third " + "q" * 600)
    before = build_context(trace.events, agent, turn_id=turn, step=0)
    assert before.shrunk == () and before.size_tokens is not None and 600 < before.size_tokens <= 1000
    trace.answer(turn, "z" * 550)
    after = build_context(trace.events, agent, turn_id=turn, step=1)
    assert forms(after) == {"r1": "STUBBED"} and after.fits


def test_a_result_shown_under_two_calls_counts_twice_in_what_a_pass_could_free():
    # The second turn calls c2 twice (some models reuse call ids): r2 shows under both calls. When
    # r2 joins results[:-1], stubbing it frees both copies, which with r1 is enough for min_gain.
    policy = ContextPolicy(
        shrink=(Stub(results[:-1]),), min_gain=Tokens(500), output_reserve=Tokens(100), reopen=None, result_cap=None
    )
    agent = make_agent(window=1500, policy=policy)
    trace = Trace()
    trace.tool_turn("first", ["a" * 400])
    second = trace.user("second")
    (call,) = trace.calls(second, ("search", "{}"))
    trace.result(second, call, "b" * 1000)
    trace.events.append(
        ModelOutput(turn_id=second, step=1, tool_calls=(ToolCall(id=call, name="search", arguments="{}"),))
    )
    trace.answer(second, "done")
    trace.end(second)
    third = trace.user("third " + "q" * 500)
    (last,) = trace.calls(third, ("search", "{}"))
    trace.result(third, last, "c" * 50)
    built = build_context(trace.events, agent, turn_id=third, step=1)
    assert forms(built) == {"r1": "STUBBED", "r2": "STUBBED"}


def test_a_cited_source_stays_full_when_its_result_is_stubbed():
    trace = Trace()
    for index in range(8):
        turn = trace.user(f"q{index}")
        (call,) = trace.calls(turn, ("search", "{}"))
        trace.result(
            turn, call, "rows " * 50, elements=(Document(id=f"doc{index}", title=f"D{index}", text="body " * 200),)
        )
        trace.answer(turn, "see [1]" if index == 0 else "ok")
        trace.end(turn)
    last = trace.user("last")
    config = ContextConfig(policy=ContextPolicy(output_reserve=Tokens(200), min_gain=None), citations=BRACKETS)
    built = build_context(trace.events, make_agent(window=6_000, config=config), turn_id=last, step=0)
    shown = forms(built)
    assert shown.get("r1") == "STUBBED" and shown.get("r2") == "STUBBED"
    first = built.request.messages[2].text
    assert first.startswith("[result r1 of search left out") and "body body" in first and 'cite="[1]"' in first
    second = built.request.messages[6].text
    assert "body" not in second


def test_a_shrink_with_its_own_threshold_runs_only_above_it():
    trace, last = long_trace(4)
    policy = ContextPolicy(shrink=(Stub(results[:], when=Tokens(100_000)),), output_reserve=Tokens(100), min_gain=None)
    assert build_context(trace.events, make_agent(window=200_000, policy=policy), turn_id=last, step=0).shrunk == ()
    policy = ContextPolicy(shrink=(Stub(results[:], when=Tokens(1500)),), output_reserve=Tokens(100), min_gain=None)
    built = build_context(trace.events, make_agent(window=200_000, policy=policy), turn_id=last, step=0)
    assert built.shrunk and built.size_tokens <= 1500


def test_a_plain_function_is_a_shrink_and_explain_names_it():
    def stub_oldest(view, forms):
        return [(view.results[0], STUBBED)] if view.results else []

    trace, last = long_trace(4)
    policy = ContextPolicy(
        shrink=(stub_oldest,), start_at=Tokens(1000), target=Tokens(500), min_gain=None, output_reserve=Tokens(10)
    )
    built = build_context(trace.events, make_agent(window=100_000, policy=policy), turn_id=last, step=0)
    assert built.shrunk[0].handle == "r1" and built.shrunk[0].by is stub_oldest and built.shrunk[0].form == STUBBED


def test_the_newest_images_are_kept_and_older_ones_become_a_note():
    trace = Trace()
    for index in range(3):
        trace.user(f"look {index}", elements=(Image(id=f"img{index}", media_type="image/png", url=f"u{index}"),))
        trace.answer(f"t{index + 1}", "seen")
        trace.end(f"t{index + 1}")
    last = trace.user("last", elements=(Image(id="img3", url="u3"),))
    built = build_context(
        trace.events, make_agent(window=100_000, policy=ContextPolicy(max_images=2)), turn_id=last, step=0
    )
    users = [m for m in built.request.messages if type(m).__name__ == "UserMessage"]
    assert [len(m.images) for m in users] == [0, 0, 1, 1]
    assert "older image left out" in users[0].text and users[2].images[0].id == "img2"


def test_forms_follow_the_defaults_over_85_percent():
    trace, last = long_trace(6)
    policy = ContextPolicy(output_reserve=Tokens(100), min_gain=None)
    built = build_context(trace.events, make_agent(window=3_600, policy=policy), turn_id=last, step=0)
    assert Stub(turns[-3:], when=Share(0.85)) in [s.by for s in built.shrunk], (
        "over 85 % the last turns' results are stubbed too"
    )
    assert FULL > COMPRESSED
