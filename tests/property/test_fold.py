"""A trace folded piece by piece decides and builds exactly what the whole trace gives.

The agent loop keeps one :class:`agentstream.steps.trace_fold.TraceFold` per trace and feeds it only the
entries appended since its last step. For random traces cut at random points, the decision
(:meth:`TraceFold.decide`) and every model call's request (:meth:`TraceFold.build`) must equal,
byte for byte, what :func:`agentstream.steps.decision.decide` and
:func:`agentstream.context.build_context` make from the whole trace up to that point; and a
model output's follow-up decided ahead (``view().with_output``, what lets the loop append an
answer and the turn's ending together) must be the decision the trace gives once it is in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstream.context import build_context
from agentstream.runtime.call_runs import job_problem
from agentstream.steps.decision import CallModel, active_turn, decide, decide_view, final_stop_reason
from agentstream.steps.timeline import reply_from_fold, reply_of, root_of, trace_agents
from agentstream.steps.trace_fold import FoldCache, TraceFold, entry_key
from agentstream.wire.events import CancelRequested, Event, ModelOutput, ToolCall, ToolJob, TurnInput
from tests.property.traces import AGENTS, traces
from tests.support.examples import examples

SETTINGS = settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@st.composite
def hostile_traces(draw: st.DrawFn) -> list[Any]:
    """Generated traces with what a real trace also holds: cancels (of the running turn, of an
    ended one, twice), calls of unknown tools, outputs cut off or stopped abnormally."""
    events = list(draw(traces()))
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(events)))
        turns = [e.turn_id for e in events[:position] if isinstance(e, TurnInput)]
        if not turns:
            continue
        turn_id = draw(st.sampled_from(turns))
        kind = draw(st.sampled_from(["cancel", "unknown_tool", "length", "refusal", "interrupted"]))
        if kind == "cancel":
            event: Any = CancelRequested(turn_id=turn_id, by=draw(st.sampled_from(["", "user"])), reason="stop")
        elif kind == "unknown_tool":
            event = ModelOutput(
                turn_id=turn_id,
                step=90,
                stop_reason="tool_calls",
                tool_calls=(ToolCall(id=f"x{position}", name="nope", arguments="{}"),),
            )
        elif kind == "length":
            event = ModelOutput(
                turn_id=turn_id,
                step=91,
                stop_reason="length",
                tool_calls=(ToolCall(id=f"y{position}", name="search", arguments='{"query": "a'),),
            )
        else:
            event = ModelOutput(turn_id=turn_id, step=92, stop_reason=kind, content="partial")
        events.insert(position, event)
    return events


def _entries(events: list[Any]) -> list[tuple[str, Any]]:
    return [(f"{1000 + i}-{i % 3}", e) for i, e in enumerate(events)]


def _encoded(decision: Any) -> bytes:
    """A decision as bytes: its type and every field (events encoded as stored)."""
    fields = {}
    for name in getattr(decision, "__dataclass_fields__", {}):
        value = getattr(decision, name)
        fields[name] = value.name if name == "agent" else value
    return type(decision).__name__.encode() + msgspec.json.encode(fields)


def _check(fold: TraceFold, prefix: list[Any]) -> None:
    cold = decide(prefix, AGENTS.get)
    warm = fold.decide(AGENTS.get)
    assert _encoded(warm) == _encoded(cold)
    assert warm == cold
    assert fold.active_turn() == active_turn(prefix)
    assert fold.agents == trace_agents(prefix)
    assert (fold.root_trace_id or fold.trace_id) == root_of(prefix, fold.trace_id)
    for turn_id in {e.turn_id for e in prefix if isinstance(e, TurnInput)}:
        assert fold.final_stop_reason(turn_id) == final_stop_reason(prefix, turn_id)
        assert reply_from_fold(fold, turn_id) == reply_of(fold.trace_id, prefix, turn_id)
    # a job for each call the trace holds, and for calls it does not (another turn, tool, arguments, id)
    calls = [(e.turn_id, c) for e in prefix if isinstance(e, ModelOutput) for c in e.tool_calls]
    turns = sorted({e.turn_id for e in prefix if isinstance(e, TurnInput)} | {"t-none"})
    for turn_id, call in calls[:6]:
        for job in (
            ToolJob(trace_id="tr", turn_id=turn_id, call_id=call.id, name=call.name, arguments=call.arguments),
            ToolJob(trace_id="tr", turn_id=turn_id, call_id=call.id, name="other", arguments=call.arguments),
            ToolJob(trace_id="tr", turn_id=turn_id, call_id=call.id, name=call.name, arguments=call.arguments + " "),
            ToolJob(trace_id="tr", turn_id=turns[-1], call_id=call.id, name=call.name, arguments=call.arguments),
            ToolJob(trace_id="tr", turn_id=turn_id, call_id=call.id + "-x", name=call.name, arguments=call.arguments),
        ):
            assert fold.job_problem(job.trace_id, job.turn_id, job.call_id, job.name, job.arguments) == job_problem(
                prefix, job
            )
    for turn_id in turns:
        job = ToolJob(trace_id="tr", turn_id=turn_id, call_id="c-none", name="search", arguments="{}")
        assert fold.job_problem(job.trace_id, job.turn_id, job.call_id, job.name, job.arguments) == job_problem(
            prefix, job
        )
    if isinstance(cold, CallModel):
        built_warm = fold.build(cold.agent, turn_id=cold.turn.turn_id, step=cold.step)
        built_cold = build_context(prefix, cold.agent, turn_id=cold.turn.turn_id, step=cold.step)
        assert msgspec.json.encode(built_warm.request) == msgspec.json.encode(built_cold.request)
        assert (built_warm.size_tokens, built_warm.fits, built_warm.compaction) == (
            built_cold.size_tokens,
            built_cold.fits,
            built_cold.compaction,
        )


@SETTINGS
@given(hostile_traces(), st.data())
def test_a_fold_fed_in_pieces_decides_and_builds_what_the_whole_trace_gives(events, data):
    entries = _entries(events)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(entries)), max_size=8))) | {len(entries)})
    fold = TraceFold("tr")
    done = 0
    for cut in cuts:
        # a reader may be handed entries it folded already (two readers of one trace): no harm
        overlap = data.draw(st.integers(0, min(done, 2)))
        fold.feed(entries[done - overlap : cut])
        done = cut
        _check(fold, events[:cut])


@SETTINGS
@given(hostile_traces())
def test_every_step_folded_one_entry_at_a_time_matches_and_outputs_are_decided_ahead(events):
    entries = _entries(events)
    fold = TraceFold("tr")
    for index, (entry_id, event) in enumerate(entries):
        view = fold.view()
        if isinstance(event, ModelOutput) and view.turn is not None and event.turn_id == view.turn.turn_id:
            ahead = decide_view(view.with_output(event), AGENTS.get)
            assert ahead == decide(events[: index + 1], AGENTS.get)
        fold.feed([(entry_id, event)])
        _check(fold, events[: index + 1])


def test_a_trace_deleted_and_started_again_is_seen_by_its_first_entry():
    fold = TraceFold("tr")
    fold.feed([("5-0", TurnInput(turn_id="t1", agent="roomy", text="hi"))])
    assert fold.same_trace("5-0")
    assert not fold.same_trace("9-0") and not fold.same_trace(None)
    assert TraceFold("tr").same_trace("9-0")  # a fold that holds nothing is any trace's


def test_entry_ids_order_as_redis_orders_them():
    assert entry_key("10-0") > entry_key("9-5") and entry_key("9-10") > entry_key("9-9")
    with pytest.raises(ValueError):
        entry_key("x-1")


def test_the_cache_is_bounded_by_bytes_and_drops_the_least_recently_used():
    def fold_of(trace_id: str, entry_id: str, text: str) -> TraceFold:
        fold = TraceFold(trace_id)
        fold.feed([(entry_id, TurnInput(turn_id="t", agent="roomy", text=text))], [100])
        return fold

    one = FoldCache().cost_of(fold_of("tr9", "1-0", "x"))  # what a fold of this shape costs, measured
    cache = FoldCache(max_bytes=one * 5 // 2)
    folds = []
    for n in range(3):
        fold = fold_of(f"tr{n}", f"{n + 1}-0", "x")
        cache.put(fold)
        folds.append(fold)
        if n == 1:
            assert cache.get("tr0") is folds[0]  # tr0 is now the most recently used
    assert "tr0" in cache and "tr2" in cache and "tr1" not in cache
    assert cache.nbytes == 2 * one and cache.evictions == 1
    big = fold_of("big", "9-0", "x" * (one * 3))
    cache.put(big)  # the fold just used is kept however large
    assert len(cache) == 1 and "big" in cache and cache.nbytes > one * 3
    cache.forget("big")
    assert len(cache) == 0 and cache.nbytes == 0


@SETTINGS
@given(st.lists(hostile_traces(), min_size=2, max_size=4), st.data())
def test_folds_evicted_under_the_byte_bound_fold_again_to_the_same_decisions(traces_, data):
    # several traces served in a random order by one process whose cache holds only some of
    # them: a trace whose fold was dropped is folded again from its first entry (as the agent
    # loop does) and decides and builds what its whole trace gives
    cache = FoldCache(max_bytes=data.draw(st.integers(0, 3000)))
    entries = [_entries(events) for events in traces_]
    done = [0] * len(traces_)
    refolded = 0
    while any(d < len(e) for d, e in zip(done, entries, strict=True)):
        n = data.draw(st.sampled_from([i for i, e in enumerate(entries) if done[i] < len(e)]))
        cut = data.draw(st.integers(done[n] + 1, len(entries[n])))
        fold = cache.get(f"tr{n}")
        if fold is None:
            refolded += done[n] > 0
            fold = TraceFold(f"tr{n}")
            new = entries[n][:cut]
        else:
            new = entries[n][done[n] : cut]
        fold.feed(new, [len(msgspec.json.encode(e)) for _, e in new])
        cache.put(fold)
        done[n] = cut
        _check(fold, traces_[n][:cut])
        assert cache.nbytes <= max(cache.max_bytes, cache.cost_of(fold))  # over the bound only by the fold just used
    assert cache.evictions >= refolded


def test_an_output_recorded_for_an_ended_turn_after_a_newer_turns_build_folds_as_from_scratch():
    """Found by the property above: a model output recorded for a turn that had ended (a late
    writer) arrives after the fold built the call of a newer turn. That build read the prefix
    shrinks' candidates up to the newer turn; judging the late output's call for the older turn
    must not reuse them (a selection such as ``turns[:-2]`` holds fewer turns there), or the
    warm fold shortens other results than a fold from scratch does."""
    path = Path(__file__).parent / "cases" / "stray_output_after_a_newer_build.jsonl"
    events = [msgspec.json.decode(line, type=Event) for line in path.read_bytes().splitlines()]
    assert isinstance(events[-1], ModelOutput) and events[-1].turn_id == "t2"
    entries = _entries(events)
    before = len(events) - 1
    fold = TraceFold("tr")
    fold.feed(entries[:before])
    newer = decide(events[:before], AGENTS.get)
    assert isinstance(newer, CallModel) and newer.turn.turn_id == "t4"
    fold.build(newer.agent, turn_id=newer.turn.turn_id, step=newer.step)
    fold.feed(entries[before:])
    _check(fold, events)


@settings(SETTINGS, max_examples=examples(150))  # a queued turn behind an answer is rare among the traces drawn
@given(hostile_traces())
def test_after_an_answer_decided_ahead_the_trace_waits_unless_another_turn_is_queued(events):
    """What the agent loop relies on to publish a reply and release the lease with the answer's
    append: once the ending decided ahead is in, the next decision is Idle exactly when no other
    turn lacks an ending (:meth:`TraceFold.others_unended`)."""
    from agentstream.steps.decision import EndTurn, Idle
    from agentstream.wire.events import TurnEnded

    entries = _entries(events)
    fold = TraceFold("tr")
    for index, (entry_id, event) in enumerate(entries):
        view = fold.view()
        if isinstance(event, ModelOutput) and view.turn is not None and event.turn_id == view.turn.turn_id:
            ahead = decide_view(view.with_output(event), AGENTS.get)
            if isinstance(ahead, EndTurn):
                ending = TurnEnded(
                    turn_id=event.turn_id, answer=ahead.answer, citations=ahead.citations, answer_call=ahead.answer_call
                )
                after = decide([*events[: index + 1], ending], AGENTS.get)
                if fold.others_unended(event.turn_id):
                    assert not isinstance(after, Idle) and after.turn.turn_id != event.turn_id
                else:
                    assert isinstance(after, Idle), after
        fold.feed([(entry_id, event)])
