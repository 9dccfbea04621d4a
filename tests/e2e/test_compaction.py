"""End to end: a long conversation compacted by the compaction service, with the agent loop and
the compaction service as separate OS processes, a real Redis and a scripted model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentstream.wire.events import Compaction, CompactionFailed, ModelOutput, TurnEnded
from tests.support import compaction_apps
from tests.support.compaction_apps import turn_text
from tests.support.procs import ROOT, Services, publish_turn, wait_replies
from tests.support.procs import trace_events as events_of

pytestmark = pytest.mark.e2e

APP = "tests.support.compaction_apps:app"


@pytest.fixture
def services(redis_url, namespace, scripted_model, tmp_path):
    scripted_model.rule = compaction_apps.rule
    s = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=scripted_model.base_url,
        app=APP,
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_SHUTDOWN_GRACE_S": "2", "AGENTSTREAM_MODEL_RETRIES": "0"},
    )
    services_started = s
    yield services_started
    s.stop_all()


def talk(client, keys, trace_id: str, texts: list[str]) -> list:
    replies = []
    for n, text in enumerate(texts, start=1):
        publish_turn(client, keys, trace_id=trace_id, turn_id=f"t{n}", agent="chatty", text=text)
        replies = wait_replies(client, keys, n, timeout_s=60)
    return replies


def chat_requests(scripted_model) -> list[dict]:
    bodies = [json.loads(raw) for raw in scripted_model.requests]
    return [b for b in bodies if not b["messages"][-1]["content"].startswith("Summarise the conversation")]


def labels(first: int, stop: int) -> str:
    return ", ".join(f"turn {n}" for n in range(first, stop))


def test_a_long_conversation_compacts_twice_and_still_answers(client, keys, services, scripted_model):
    services.start("loop-1", "agent-loop")
    services.start("compaction-1", "compaction")
    turns = 10
    replies = talk(client, keys, "long", [turn_text(n) for n in range(1, turns + 1)])
    assert [r.status for r in replies] == ["ended"] * turns
    assert [r.answer for r in replies] == [f"Noted turn {n}." for n in range(1, turns + 1)]

    events = events_of(client, keys, "long")
    summaries = [e for e in events if isinstance(e, Compaction)]
    assert len(summaries) >= 2
    first, second = summaries[:2]
    k, m = int(first.kept_from_turn[1:]), int(second.kept_from_turn[1:])
    assert first.turn_id == first.kept_from_turn and second.turn_id == second.kept_from_turn  # the running turn is kept
    assert first.summary == f"SUMMARY[{labels(1, k)}]" and first.replaced_turns == k - 1
    # the second summary folds the first one in
    assert second.summary == f"SUMMARY[{first.summary} + {labels(k, m)}]" and second.replaced_turns == m - 1
    assert sum(isinstance(e, TurnEnded) for e in events) == turns

    # the model answered the last turn from the newest summary alone, with the newest user message kept
    newest = summaries[-1]
    last = chat_requests(scripted_model)[-1]
    system = last["messages"][0]["content"]
    assert newest.summary in system and system.count("<conversation_summary>") == 1
    users = [msg["content"].split(":")[0] for msg in last["messages"] if msg["role"] == "user"]
    assert users == [f"turn {n}" for n in range(int(newest.kept_from_turn[1:]), turns + 1)]

    # every model call's request rebuilds, from the stored trace, to the fingerprint it was sent with
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "trace", "verify", "long", "--app", APP],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outputs = [e for e in events if isinstance(e, ModelOutput)]
    assert f"{len(outputs)}/{len(outputs)} model calls rebuilt" in proc.stderr


def test_c24_when_summarising_fails_the_turn_falls_back_to_trimming_and_says_so(client, keys, services, scripted_model):
    services.start("loop-1", "agent-loop")
    services.start("compaction-1", "compaction")
    texts = [
        turn_text(1, extra="FAIL-SUMMARIES"),
        turn_text(2),
        turn_text(3),
        turn_text(4, 10_000),
    ]  # t4 does not fit with the rest
    replies = talk(client, keys, "fails", texts)
    assert replies[-1].status == "ended" and replies[-1].answer == "Noted turn 4."
    (failed,) = [e for e in events_of(client, keys, "fails") if isinstance(e, CompactionFailed)]
    assert failed.code == "summary_failed" and "500" in failed.reason
    last = chat_requests(scripted_model)[-1]
    assert "left out" in last["messages"][0]["content"]
    users = [m["content"][:7] for m in last["messages"] if m["role"] == "user"]
    assert users[-1] == "turn 4:" and "turn 1:" not in users


def test_c04_when_the_summary_fails_and_the_running_turn_alone_cannot_fit_the_turn_fails_context_full(
    client, keys, services, scripted_model
):
    # issue 11 item 8: the fallback trim never sends the system prompt without the user's message
    services.start("loop-1", "agent-loop")
    services.start("compaction-1", "compaction")
    texts = [turn_text(1, extra="FAIL-SUMMARIES"), turn_text(2), turn_text(3), turn_text(4, 14_000)]
    replies = talk(client, keys, "too-big", texts)
    assert [r.status for r in replies[:3]] == ["ended"] * 3
    last = replies[-1]
    assert last.status == "failed" and last.code == "context_full", last
    assert (
        "the summary failed and trimming cannot help" in last.reason
        and "over the model's window of 4000 tokens" in last.reason
    )
    assert "needs about" in last.reason and "output reserve 256" in last.reason, last.reason
    for body in chat_requests(scripted_model):
        assert any(m["role"] == "user" for m in body["messages"]), body["messages"]  # never the system prompt alone
