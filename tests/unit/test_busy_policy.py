"""A turn on a busy conversation (issue 36, item 2), without Redis: the busy-policy decision
(:func:`agentstream.steps.machine.on_busy`) as a table, the wire's check of the field, and the
rollback rule of the context library (a rolled-back turn's events left out of later contexts)."""

from __future__ import annotations

import msgspec
import pytest

from agentstream.context import ContextCache, build_context
from agentstream.context.builder import build_messages
from agentstream.declarations.agents import Agent
from agentstream.errors import TurnRejected
from agentstream.steps.machine import EnterTurn, RejectTurn, on_busy
from agentstream.steps.trace_fold import TraceFold
from agentstream.wire import checks as wire
from agentstream.wire.events import (
    CancelRequested,
    Compaction,
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import Keys

# --- the decision ------------------------------------------------------------------------------

CASES = [
    # asked, default, running → kind, cancel by, rolls back
    (None, "queue", None, "enter", None, None),
    (None, "queue", "t1", "enter", None, None),
    ("queue", "interrupt", "t1", "enter", None, None),  # the turn's own policy wins over the process's
    ("reject", "queue", None, "enter", None, None),  # an idle conversation: every policy enters
    ("interrupt", "queue", None, "enter", None, None),
    ("rollback", "queue", None, "enter", None, None),
    ("reject", "queue", "t1", "reject", None, None),
    (None, "reject", "t1", "reject", None, None),
    ("interrupt", "queue", "t1", "enter", "interrupt", None),
    (None, "interrupt", "t1", "enter", "interrupt", None),
    ("rollback", "queue", "t1", "enter", "rollback", "t1"),
    (None, "rollback", "t1", "enter", "rollback", "t1"),
    ("rollback", "reject", "t1", "enter", "rollback", "t1"),
]


@pytest.mark.parametrize(("asked", "default", "running", "kind", "cancel_by", "rolls_back"), CASES)
def test_a_turn_on_a_busy_conversation_follows_its_policy(asked, default, running, kind, cancel_by, rolls_back):
    decided = on_busy("c1", "t2", asked, default, running)
    if kind == "reject":
        assert isinstance(decided, RejectTurn)
        failed = decided.failed
        assert failed.turn_id == "t2" and failed.code == FailureCode.BUSY
        assert "'c1'" in failed.reason and "'t1'" in failed.reason and "'reject'" in failed.reason
        assert ("the turn's" in failed.reason) == (asked is not None)
        return
    assert isinstance(decided, EnterTurn)
    assert decided.rolls_back == rolls_back
    if cancel_by is None:
        assert decided.cancel is None
        return
    assert decided.cancel == CancelRequested(turn_id="t1", by=cancel_by, reason=decided.cancel.reason)
    assert "t2" in decided.cancel.reason


def test_an_unknown_policy_given_to_the_decision_raises_naming_it():
    with pytest.raises(ValueError, match="busy policy must be one of .* got 'later' \\(turn 't2'\\)"):
        on_busy("c1", "t2", "later", "queue", "t1")


def test_a_turn_message_naming_an_unknown_policy_is_refused_as_bad_turn():
    keys = Keys("agentstream")
    raw = b'{"trace_id":"c1","turn_id":"t1","agent":"a","text":"hi","busy_policy":"roll-back"}'
    with pytest.raises(TurnRejected) as caught:
        wire.validate_turn(raw, keys=keys, limits=wire.WireLimits(), agents=["a"])
    assert caught.value.code == FailureCode.BAD_TURN
    assert "busy_policy" in caught.value.reason and "rollback" in caught.value.reason
    assert caught.value.trace_id == "c1" and caught.value.turn_id == "t1"  # so it fails in its trace, replied


def test_a_turn_message_naming_a_known_policy_is_read():
    raw = b'{"trace_id":"c1","turn_id":"t1","agent":"a","text":"hi","busy_policy":"rollback"}'
    turn = wire.validate_turn(raw, keys=Keys("agentstream"), limits=wire.WireLimits(), agents=["a"])
    assert turn.busy_policy == "rollback"


# --- the context: a rolled-back turn is left out --------------------------------------------------

AGENT = Agent(name="a", system_prompt="You help.")


def _rolled_back_trace() -> list:
    """t1 answered; t2 ran a tool and was rolled back by t3 while it ran; t3 answered; t4 asks."""
    call = ToolCall(id="c2", name="look", arguments='{"q": "secret"}')
    return [
        TurnInput(turn_id="t1", agent="a", text="first question"),
        ModelOutput(turn_id="t1", step=0, content="first answer"),
        TurnEnded(turn_id="t1", answer="first answer"),
        TurnInput(turn_id="t2", agent="a", text="WRONG question"),
        ModelOutput(turn_id="t2", step=0, tool_calls=(call,), stop_reason="tool_calls"),
        CancelRequested(turn_id="t2", by="rollback", reason="rolled back by turn t3"),
        TurnInput(turn_id="t3", agent="a", text="right question", rolls_back="t2"),
        ToolOutput(turn_id="t2", call_id="c2", name="look", text="cancelled", error="cancelled"),
        TurnFailed(turn_id="t2", code="cancelled", reason="rolled back"),
        ToolOutput(turn_id="t2", call_id="c2", name="look", text="LATE result", late=True),
        ModelOutput(turn_id="t3", step=0, content="right answer"),
        TurnEnded(turn_id="t3", answer="right answer"),
        TurnInput(turn_id="t4", agent="a", text="and then?"),
    ]


def _texts(built) -> list[str]:
    return [msgspec.json.encode(m).decode() for m in built.request.messages]


def test_later_turns_are_built_without_the_rolled_back_turn():
    events = _rolled_back_trace()
    built = build_context(events, AGENT, turn_id="t4", step=0, limits=None)
    shown = "\n".join(_texts(built))
    assert "WRONG" not in shown and "secret" not in shown and "LATE" not in shown and "cancelled" not in shown
    roles = [type(m).__name__ for m in built.request.messages]
    assert roles == ["UserMessage", "AssistantMessage", "UserMessage", "AssistantMessage", "UserMessage"]
    assert "first question" in shown and "right question" in shown and "and then?" in shown


def test_the_rolling_back_turn_is_built_without_it_and_calls_before_the_rollback_with_it():
    events = _rolled_back_trace()
    first_t3 = events.index(next(e for e in events if isinstance(e, ModelOutput) and e.turn_id == "t3"))
    t3 = "\n".join(_texts(build_context(events[:first_t3], AGENT, turn_id="t3", step=0, limits=None)))
    assert "WRONG" not in t3 and "right question" in t3
    before = events.index(next(e for e in events if isinstance(e, TurnInput) and e.turn_id == "t3"))
    t2 = "\n".join(_texts(build_context(events[:before], AGENT, turn_id="t2", step=1, limits=None)))
    assert "WRONG question" in t2  # a request recorded before the rollback showed it


def test_a_late_call_of_the_rolled_back_turn_itself_is_built_as_it_was_sent():
    events = _rolled_back_trace()
    upto = events.index(next(e for e in events if isinstance(e, TurnInput) and e.turn_id == "t3")) + 1
    own = "\n".join(_texts(build_context(events[:upto], AGENT, turn_id="t2", step=1, limits=None)))
    assert "WRONG question" in own  # its own context keeps it, whatever came after


@pytest.mark.parametrize("split", range(1, 14))
def test_an_incremental_fold_builds_what_a_fold_from_the_start_builds(split):
    """The agent loop's folds (per-worker cache, trace fold) fed in two parts, a rollback in
    either, give the requests a fold of the whole prefix gives (what ``trace verify`` rebuilds)."""
    events = _rolled_back_trace()
    cache = ContextCache()
    entries = [(f"{i + 1}-0", e) for i, e in enumerate(events)]
    fold = TraceFold("c1")
    for turn_id, upto in (("t2", split), ("t4", len(events))):
        whole = build_context(events[:upto], AGENT, turn_id=turn_id, step=0)
        assert cache.build("c1", entries[:upto], AGENT, turn_id=turn_id, step=0).request == whole.request
        fold.feed(entries[len(fold.events) : upto])
        assert fold.build(AGENT, turn_id=turn_id, step=0).request == whole.request


def test_a_compaction_that_kept_from_the_rolled_back_turn_keeps_from_the_turn_after_it():
    events = _rolled_back_trace()
    at = events.index(next(e for e in events if isinstance(e, CancelRequested)))
    summary = Compaction(turn_id="t2", summary="SUMMARY of t1", kept_from_turn="t2", replaced_turns=1)
    events.insert(at, summary)
    built = build_context(events, AGENT, turn_id="t4", step=0, limits=None)
    shown = "\n".join(_texts(built))
    assert "SUMMARY of t1" in built.request.system and "first question" not in shown  # it still replaces t1
    assert "WRONG" not in shown and "right question" in shown


def test_build_messages_leaves_out_a_rolled_back_turn():
    shown = msgspec.json.encode(build_messages(_rolled_back_trace())).decode()
    assert "WRONG" not in shown and "right question" in shown
