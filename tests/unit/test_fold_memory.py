"""The fold cache counts what its folds really cost in memory (issue 35, item 1).

A fold's stored event bytes were counted, while the decoded events, the turn records and the
context folds cost 4-11 times those bytes: a 256 MiB bound reached at 1-3 GB of memory. Here
real folds (events encoded and decoded as the store does, fed in the agent loop's order:
feed, keep, build) fill a cache, and the bytes it counts are compared with the memory the folds
hold, measured by tracemalloc: the count must be within 1.5 times of it, both ways.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest

from agentstream import Agent
from agentstream.steps.sizing import deep_size_bytes
from agentstream.steps.trace_fold import FoldCache, TraceFold
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, TurnEnded, TurnInput, Usage

AGENT = Agent(name="helper", system_prompt="You answer questions about the documents you are given.")
TOLERANCE = 1.5


def _words(seed: int, nbytes: int) -> str:
    """Text of about ``nbytes`` bytes, different for each seed (no interning, no sharing)."""
    words = [f"w{seed}x{i % 97}y{i}" for i in range(nbytes // 12 + 1)]
    return " ".join(words)[:nbytes]


def _stored(events: list[Any], start: int) -> tuple[list[tuple[str, Any]], list[int]]:
    """Events as the store reads them back: encoded, decoded, with their stored sizes."""
    entries, sizes = [], []
    for i, event in enumerate(events):
        fields = codec.encode_entry(event)
        entries.append((f"{1_700_000_000_000 + start + i}-0", codec.decode_entry(fields)))
        sizes.append(len(fields[codec.EVENT_FIELD]))
    return entries, sizes


def _turn(seed: int, turn: int, question_bytes: int, answer_bytes: int) -> list[Any]:
    turn_id = f"t{seed}-{turn}"
    answer = _words(seed * 1000 + turn, answer_bytes)
    return [
        TurnInput(turn_id=turn_id, agent=AGENT.name, text=_words(seed * 7 + turn, question_bytes)),
        ModelOutput(
            turn_id=turn_id,
            step=0,
            content=answer,
            provider="openai",
            model="m",
            usage=Usage(prompt_tokens=100 + turn, completion_tokens=200),
            request_sha256=f"{seed:064x}",
            latency_ms=12.5,
        ),
        TurnEnded(turn_id=turn_id, answer=answer),
    ]


def _serve(cache: FoldCache, trace_id: str, turns: int, question_bytes: int, answer_bytes: int) -> None:
    """One conversation as the agent loop folds it: per turn, the input is fed and kept, the
    context built, then the output and the ending fed and kept."""
    fold = TraceFold(trace_id)
    seed = hash(trace_id) & 0xFFFFFF
    for turn in range(turns):
        events = _turn(seed, turn, question_bytes, answer_bytes)
        entries, sizes = _stored(events, turn * 3)
        fold.feed(entries[:1], sizes[:1])
        cache.put(fold)
        fold.build(AGENT, turn_id=events[0].turn_id, step=0)
        fold.feed(entries[1:], sizes[1:])
        cache.put(fold)


def _measured(fill: Any) -> tuple[FoldCache, int, int]:
    """Fill a cache → (the cache, tracemalloc's growth in bytes, the folds' stored bytes)."""
    cache = FoldCache(max_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill(cache)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stored = sum(fold.nbytes for fold in cache._folds.values())
    return cache, growth, stored


@pytest.mark.parametrize(
    ("conversations", "turns", "question_bytes", "answer_bytes"),
    [
        (150, 1, 5_000, 10_000),  # the one-turn conversations of about 15 KB
        (300, 1, 200, 400),  # short ones: overheads outweigh the text
        (4, 100, 1_000, 3_000),  # long conversations: the context fold grows turn by turn
    ],
)
def test_the_cache_counts_what_its_folds_hold(conversations: int, turns: int, question_bytes: int, answer_bytes: int):
    def fill(cache: FoldCache) -> None:
        for n in range(conversations):
            _serve(cache, f"trace-{turns}-{question_bytes}-{n}", turns, question_bytes, answer_bytes)

    cache, growth, stored = _measured(fill)
    assert len(cache) == conversations
    ratio = cache.nbytes / growth
    assert 1 / TOLERANCE <= ratio <= TOLERANCE, (
        f"the cache counts {cache.nbytes} bytes for folds that hold {growth} (×{ratio:.2f}); "
        f"their stored bytes are {stored} (×{stored / growth:.2f})"
    )


def test_stored_bytes_alone_would_be_off():
    """The count the cache used before (stored event bytes) is off by more than the tolerance on
    the same folds: the comparison above can fail."""

    def fill(cache: FoldCache) -> None:
        for n in range(300):
            _serve(cache, f"old-{n}", 1, 200, 400)

    _, growth, stored = _measured(fill)
    assert growth / stored > TOLERANCE


def test_an_evicted_fold_frees_what_was_counted():
    """With a bound, the cache stays within it by the measured count, and drops the oldest."""
    probe = FoldCache(max_bytes=1 << 40)
    _serve(probe, "probe", 1, 5_000, 10_000)
    one = probe.nbytes
    cache = FoldCache(max_bytes=10 * one)
    for n in range(50):
        _serve(cache, f"bounded-{n}", 1, 5_000, 10_000)
        assert cache.nbytes <= cache.max_bytes
    assert 8 <= len(cache) <= 11
    assert "bounded-49" in cache and "bounded-0" not in cache


def test_shared_objects_are_not_counted():
    """An agent (shared by every fold) is neither counted nor walked into."""
    holder = [AGENT, "x" * 10_000]
    assert deep_size_bytes(holder, (Agent,)) < deep_size_bytes(holder) - deep_size_bytes(AGENT) // 2 + 1
    assert deep_size_bytes(holder, (Agent,)) >= 10_000


def test_a_large_fold_is_counted_by_scaling_not_walked_again(monkeypatch):
    """A walk holds the event loop: a fold measured large is only scaled by its stored bytes from
    then on, and its count stays within the tolerance."""
    from agentstream.steps import trace_fold

    monkeypatch.setattr(FoldCache, "MEASURED_UP_TO_BYTES", 50_000)
    walked_at: list[int] = []  # the fold's stored bytes at each walk
    real = trace_fold.deep_size_bytes

    def counting(root: Any, shared: tuple[type, ...] = ()) -> int:
        walked_at.append(root.nbytes)
        return real(root, shared)

    monkeypatch.setattr(trace_fold, "deep_size_bytes", counting)
    cache, growth, stored = _measured(lambda cache: _serve(cache, "long", 300, 200, 400))
    assert stored > 4 * 50_000  # grew past the cap more than fourfold
    assert sum(1 for nbytes in walked_at if nbytes >= 50_000) == 1  # walked once past it, then scaled
    ratio = cache.nbytes / growth
    assert 1 / TOLERANCE <= ratio <= TOLERANCE, f"counted {cache.nbytes} bytes for {growth} held (×{ratio:.2f})"
