"""The context library's invariants, as properties over generated traces (hypothesis)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstream.context import (
    AssistantMessage,
    ContextCache,
    ToolResultMessage,
    UserMessage,
    build_context,
    build_messages,
)
from agentstream.context.render import MISSING_RESULT_TEXT
from agentstream.models.openai_format import request_body
from agentstream.wire import codec
from agentstream.wire.events import (
    Compaction,
    ModelOutput,
    ToolOutput,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from tests.property.traces import AGENTS, traces
from tests.support.examples import examples

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def calls_of(events: list[Any]) -> list[tuple[int, str, int]]:
    """Every model call of a trace: (index of its output, or len(events) for the next call; turn; step)."""
    out = [(i, e.turn_id, e.step) for i, e in enumerate(events) if isinstance(e, ModelOutput)]
    inputs = [e.turn_id for e in events if isinstance(e, TurnInput)]
    ended = {e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))}
    running = next((t for t in inputs if t not in ended), None)
    if running is not None:
        steps = [s for _, t, s in out if t == running]
        out.append((len(events), running, (max(steps) + 1) if steps else 0))
    return out


def agent_of(events: list[Any]):
    return AGENTS[next(e.agent for e in events if isinstance(e, TurnInput))]


def check_pairing(messages) -> None:
    index = 0
    while index < len(messages):
        message = messages[index]
        assert not isinstance(message, ToolResultMessage), f"a result without its call at {index}"
        index += 1
        if isinstance(message, AssistantMessage):
            assert message.tool_calls or message.content.strip(), "an empty assistant message"
            ids = [c.id for c in message.tool_calls]
            results = messages[index : index + len(ids)]
            assert [getattr(r, "call_id", None) for r in results] == ids, (
                "results not in call order right after their call"
            )
            index += len(ids)


@SETTINGS
@given(traces())
def test_every_call_is_followed_by_exactly_its_results_and_history_starts_on_a_user_message(events):
    agent = agent_of(events)
    for index, turn_id, step in calls_of(events):
        built = build_context(events[:index], agent, turn_id=turn_id, step=step)
        messages = built.request.messages
        check_pairing(messages)
        assert built.request.system.startswith(agent.system_prompt)
        assert messages and isinstance(messages[0], UserMessage)
        assert messages[-1] != AssistantMessage() and not (
            isinstance(messages[-1], AssistantMessage) and messages[-1].tool_calls
        )


@SETTINGS
@given(traces(agent="roomy"))
def test_the_first_result_before_the_turn_ended_wins_and_a_missing_one_is_synthetic(events):
    ended: set[str] = set()
    first: dict[str, str] = {}
    for event in events:
        if isinstance(event, (TurnEnded, TurnFailed)):
            ended.add(event.turn_id)
        elif isinstance(event, ToolOutput) and event.turn_id not in ended:
            first.setdefault(event.call_id, event.text)
    messages = build_messages(events)
    for message in messages:
        if isinstance(message, ToolResultMessage):
            if message.call_id in first:  # its text, after the layout of its elements
                assert message.text.endswith(first[message.call_id]) and message.text != MISSING_RESULT_TEXT
            else:
                assert message.text == MISSING_RESULT_TEXT and message.is_error
            assert message.text not in ("LATE", "DUPLICATE")


@SETTINGS
@given(traces(agent="roomy"))
def test_under_budget_the_context_is_the_whole_history_unchanged(events):
    agent = AGENTS["roomy"]
    for index, turn_id, step in calls_of(events):
        if any(isinstance(e, Compaction) for e in events[:index]):
            continue
        built = build_context(events[:index], agent, turn_id=turn_id, step=step)
        plain = build_context(events[:index], agent, turn_id=turn_id, step=step, limits=None)
        assert built.shrunk == () and built.fits
        assert request_body(built.request, model="m") == request_body(plain.request, model="m")


@SETTINGS
@given(traces())
def test_the_prefix_stays_byte_identical_unless_a_shrink_or_a_compaction_changed_it(events):
    agent = agent_of(events)
    previous = None
    for index, turn_id, step in calls_of(events):
        built = build_context(events[:index], agent, turn_id=turn_id, step=step)
        current = [msgspec.json.encode(m) for m in built.request.messages]
        if previous is not None:
            prev_built, prev_index, prev_messages = previous
            compacted = any(isinstance(e, Compaction) for e in events[prev_index:index])
            shrunk_since = any(s.at >= prev_built.call for s in built.shrunk)
            if not compacted and not shrunk_since:
                assert current[: len(prev_messages)] == prev_messages
                assert built.request.system == prev_built.request.system
        previous = (built, index, current)


@SETTINGS
@given(traces())
def test_the_cache_builds_what_a_cold_rebuild_builds(events):
    agent = agent_of(events)
    cache = ContextCache()
    entries = [(f"{i}-0", e) for i, e in enumerate(events)]
    for index, turn_id, step in calls_of(events):
        warm = cache.build("trace", entries[:index], agent, turn_id=turn_id, step=step)
        cold = build_context(events[:index], agent, turn_id=turn_id, step=step)
        assert msgspec.json.encode(warm.request) == msgspec.json.encode(cold.request)


REBUILD = """
import hashlib, json, sys
import msgspec
from agentstream.context import build_context
from agentstream.wire.events import Event
from agentstream.models.openai_format import request_body
from tests.property.traces import AGENTS
for line in sys.stdin:
    if not line.strip():
        continue
    case = json.loads(line)
    events = [msgspec.json.decode(e, type=Event) for e in case["events"]]
    agent = AGENTS[case["agent"]]
    built = build_context(events[: case["index"]], agent, turn_id=case["turn"], step=case["step"])
    print(hashlib.sha256(request_body(built.request, model="m")).hexdigest())
"""


@settings(
    max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(traces(), min_size=1, max_size=3))
def test_two_processes_build_identical_bytes(cases):
    lines, expected = [], []
    for events in cases:
        agent = agent_of(events)
        for index, turn_id, step in calls_of(events):
            built = build_context(events[:index], agent, turn_id=turn_id, step=step)
            expected.append(hashlib.sha256(request_body(built.request, model="m")).hexdigest())
            lines.append(
                json.dumps(
                    {
                        "events": [codec.encode(e).decode() for e in events],
                        "agent": agent.name,
                        "index": index,
                        "turn": turn_id,
                        "step": step,
                    }
                )
            )
    env = {**os.environ, "PYTHONHASHSEED": "random", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", REBUILD],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected
