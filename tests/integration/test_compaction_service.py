"""The compaction service's handler on a real Redis (in process), with a fake summary model:
once-only summaries, summaries in budgeted chunks (C24), and its two kinds of failure."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from agentstream.context import estimate_tokens
from agentstream.errors import ModelUnanswered
from agentstream.steps.summarising import COMPACTION_ERROR, SUMMARY_FAILED, CompactionJob, outcome_key
from agentstream.wire import codec
from agentstream.wire.events import Compaction, CompactionFailed, ModelOutput, TurnEnded, TurnInput, Usage
from agentstream.wire.keys import COMPACTION_FIELD
from agentstream_services.compaction.compactor import Compactor
from tests.support.compaction_apps import WINDOW_TOKENS, app, chatty, turn_text

pytestmark = pytest.mark.integration


class FakeModel:
    """A summary model: ``reply(request)`` gives the summary text, or an exception to raise."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []

    async def complete(self, request, *, turn_id, step, deltas=None, options=None):
        self.requests.append(request)
        value = self.reply(request)
        if isinstance(value, Exception):
            raise value
        return ModelOutput(
            turn_id=turn_id,
            step=step,
            content=value,
            provider="fake",
            model="fake-1",
            usage=Usage(prompt_tokens=100, completion_tokens=10),
        )

    async def aclose(self):
        pass


async def conversation(store, trace_id: str, turns: int, *, running_size: int = 2_000) -> CompactionJob:
    for n in range(1, turns):
        await store.append(trace_id, TurnInput(turn_id=f"t{n}", agent="chatty", text=turn_text(n)))
        await store.append(trace_id, ModelOutput(turn_id=f"t{n}", step=0, content=f"Noted turn {n}."))
        await store.append(trace_id, TurnEnded(turn_id=f"t{n}", answer=f"Noted turn {n}."))
    await store.append(trace_id, TurnInput(turn_id=f"t{turns}", agent="chatty", text=turn_text(turns, running_size)))
    return CompactionJob(trace_id=trace_id, turn_id=f"t{turns}", step=0, kept_from_turn=f"t{turns}")


async def events(store, trace_id):
    return [e for _, e in await store.read(trace_id)]


async def test_a_job_delivered_twice_writes_one_summary_and_wakes_the_trace(store, keys):
    model = FakeModel(lambda request: "SUMMARY[turn 1, turn 2, turn 3]")
    compactor = Compactor(app, store, {"default": model})
    job = await conversation(store, "c", 4)
    fields = {COMPACTION_FIELD: codec.encode(job)}
    before = REGISTRY.get_sample_value("agentstream_compactions_total", {"outcome": "compacted"}) or 0.0
    await compactor.on_job("1-0", fields)
    await compactor.on_job("1-0", fields)
    assert REGISTRY.get_sample_value("agentstream_compactions_total", {"outcome": "compacted"}) == before + 1
    (summary,) = [e for e in await events(store, "c") if isinstance(e, Compaction)]
    assert (summary.turn_id, summary.kept_from_turn, summary.replaced_turns) == ("t4", "t4", 3)
    assert (
        summary.summary == "SUMMARY[turn 1, turn 2, turn 3]"
        and summary.model == "fake-1"
        and summary.usage.prompt_tokens == 100
    )
    assert len(model.requests) == 1 and model.requests[0].tools == ()
    assert await store.has_key("c", outcome_key("t4", "t4"))
    assert len(await store.redis.xrange(keys.wake)) == 2


async def test_c24_a_long_history_is_summarised_in_chunks_that_each_fit_the_window(store):
    seen = []

    def reply(request):
        seen.append(request.system)
        return f"SUMMARY-{len(seen)}"

    model = FakeModel(reply)
    job = await conversation(store, "long", 10, running_size=1_000)  # nine 2 000-character turns before the running one
    outcome = await Compactor(app, store, {"default": model}).compact(job)
    assert isinstance(outcome, Compaction) and outcome.summary == f"SUMMARY-{len(model.requests)}"
    assert len(model.requests) >= 2
    for request in model.requests:
        assert estimate_tokens(request, chatty.model_limits) + request.max_output_tokens <= WINDOW_TOKENS
    for earlier, system in zip(range(1, len(seen)), seen[1:], strict=True):
        assert f"SUMMARY-{earlier}" in system  # each chunk folds in the summary so far


async def test_a_failed_summary_call_is_recorded_and_the_turn_can_go_on(store):
    model = FakeModel(lambda request: ModelUnanswered("HTTP 500 after 0 retries", status_code=500))
    outcome = await Compactor(app, store, {"default": model}).compact(await conversation(store, "f", 4))
    assert isinstance(outcome, CompactionFailed) and outcome.code == SUMMARY_FAILED and "HTTP 500" in outcome.reason
    assert [e for e in await events(store, "f") if isinstance(e, CompactionFailed)] == [outcome]


async def test_an_empty_summary_is_a_compaction_error(store):
    outcome = await Compactor(app, store, {"default": FakeModel(lambda request: " ")}).compact(
        await conversation(store, "e", 4)
    )
    assert (
        isinstance(outcome, CompactionFailed) and outcome.code == COMPACTION_ERROR and "empty summary" in outcome.reason
    )


async def test_a_summary_that_cannot_be_stored_is_a_compaction_error_not_a_handler_failure(store):
    # a lone surrogate (an app's own model adapter let it through): before, the append failed the
    # handler, and every delivery of the job called the summary model again
    outcome = await Compactor(app, store, {"default": FakeModel(lambda request: "a\ud83db")}).compact(
        await conversation(store, "s", 4)
    )
    assert isinstance(outcome, CompactionFailed) and outcome.code == COMPACTION_ERROR
    assert "cannot be stored" in outcome.reason and "UnicodeEncodeError" in outcome.reason
    assert [e for e in await events(store, "s") if isinstance(e, CompactionFailed)] == [outcome]


async def test_an_unconfigured_summary_model_is_a_failed_summary(store):
    compactor = Compactor(app, store, {"default": FakeModel(lambda r: "x")}, summary_model="cheap")
    outcome = await compactor.compact(await conversation(store, "u", 4))
    assert isinstance(outcome, CompactionFailed) and outcome.code == SUMMARY_FAILED and "'cheap'" in outcome.reason


async def test_a_stale_job_does_nothing(store):
    model = FakeModel(lambda request: "S")
    job = await conversation(store, "s", 4)
    await store.append("s", TurnEnded(turn_id="t4", answer="done"))
    assert await Compactor(app, store, {"default": model}).compact(job) is None
    under = await conversation(store, "small", 2)  # under the threshold: no summary is due
    assert await Compactor(app, store, {"default": model}).compact(under) is None
    assert model.requests == []


async def test_compaction_jobs_read_only_what_their_trace_gained_since_the_last_one(store, keys):
    from tests.integration.test_step_cost import _Recorder, _text

    model = FakeModel(lambda request: "SUMMARY")
    compactor = Compactor(app, store, {"default": model})
    recorder = _Recorder(store.redis)
    try:
        job = await conversation(store, "g", 4)
        assert isinstance(await compactor.compact(job), Compaction)
        await store.append("g", TurnEnded(turn_id="t4", answer="ok"))
        for n in range(5, 9):  # the conversation goes on; it needs a summary again
            await store.append("g", TurnInput(turn_id=f"t{n}", agent="chatty", text=turn_text(n)))
            await store.append("g", TurnEnded(turn_id=f"t{n}", answer=f"Noted turn {n}."))
        await store.append("g", TurnInput(turn_id="t9", agent="chatty", text=turn_text(9, 2_000)))
        again = await compactor.compact(CompactionJob(trace_id="g", turn_id="t9", step=0, kept_from_turn="t9"))
        assert isinstance(again, Compaction)
    finally:
        recorder.close()
    starts = [
        _text(c[2])
        for c in recorder.commands
        if _text(c[0]).upper() == "XRANGE" and _text(c[1]) == keys.trace("g") and "COUNT" not in map(_text, c[3:])
    ]
    assert len(starts) == 2 and starts.count("-") == 1, starts  # the second job read what came since the first
