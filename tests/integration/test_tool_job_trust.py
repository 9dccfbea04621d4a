"""A tool job is a hint, a tool's result is the tool's: what the tool worker does with a job
whose arguments are not the ones its call recorded, and with a result that cannot be stored.

The trial of 2026-12-02: a job published by hand for a real call, with other arguments, ran
those arguments (the trace said the call had its own); a tool that returned a lone UTF-16
surrogate, or data JSON has no form for, failed its handler on every delivery, ran again each
time and then dead-lettered (a tool with side effects got a false "outcome unknown"); a model
output that cannot be stored did the same to the agent loop. Real Redis; the services' own
handlers."""

from __future__ import annotations

import json

import msgspec
import pytest

from agentstream import Agent, App, ToolResult, tool
from agentstream.agent_loop.loop import AgentLoop
from agentstream.runtime.store import TraceStore
from agentstream.testing import ScriptedModel, call
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolCall, ToolJob, ToolOutput, ToolStarted, TurnFailed, TurnInput
from agentstream.wire.keys import JOB_FIELD, TURN_FIELD
from agentstream_services.tool_worker.worker import ToolWorker
from tests.support.inprocess import errors_of, events_of, replies_on

pytestmark = pytest.mark.integration

RUNS: dict[str, int] = {}


def _ran(name: str) -> None:
    RUNS[name] = RUNS.get(name, 0) + 1


@tool
def lone_surrogate(key: str) -> str:
    """Answers with text that is not Unicode (half of a surrogate pair)."""
    _ran("lone_surrogate")
    return "a\ud83db"


@tool(side_effects=True)
def odd_data(key: str) -> ToolResult:
    """A tool with side effects whose data holds a value JSON has no form for."""
    _ran("odd_data")
    return ToolResult(text="done", data={"z": object()})


@tool(side_effects=True)
def record(key: str) -> str:
    """A side effect: records its key."""
    _ran(f"record:{key}")
    return f"recorded {key}"


class Score(msgspec.Struct, frozen=True, kw_only=True, tag="score"):
    """An app's own event with a typed float."""

    turn_id: str
    value: float


def _deep(levels: int) -> dict:
    data: dict = {}
    for _ in range(levels):
        data = {"d": data}
    return data


@tool(side_effects=True)
def odd(kind: str) -> object:
    """Returns, by ``kind``, a value that does not store as it is."""
    _ran(f"odd:{kind}")
    if kind == "dict":  # a plain value holding a lone surrogate: stored with U+FFFD in its place
        return {"echo": "\ud83d"}
    if kind == "event":
        return ToolResult(text="ok", events=[Score(turn_id="t1", value=0.5), Score(turn_id="t1", value=float("nan"))])
    if kind == "error":
        return ToolResult(text="failed", error="bad \ud83d")
    return ToolResult(text="deep", data=_deep(5000))


@tool
def binary(kind: str) -> ToolResult:
    """Returns bytes where text belongs, by ``kind``."""
    _ran(f"binary:{kind}")
    if kind == "utf8":
        return ToolResult(text="résumé\n".encode())  # type: ignore[arg-type]
    return ToolResult(text=b"%PDF-1.7\n\xe2\xe3\xcf\xd3 binary")  # type: ignore[arg-type]


APP = App(
    agents=[Agent(name="a", system_prompt="x", tools=[lone_surrogate, odd_data, record, odd, binary])],
    event_types=[Score],
)


async def _call(store, trace_id: str, name: str, arguments: str) -> ToolJob:
    """A running turn whose model output made one call → the job the agent loop would publish."""
    await store.append(trace_id, TurnInput(turn_id="t1", agent="a", text="go"))
    call = ToolCall(id="c1", name=name, arguments=arguments)
    await store.append(trace_id, ModelOutput(turn_id="t1", step=0, tool_calls=(call,)))
    return ToolJob(trace_id=trace_id, turn_id="t1", call_id="c1", name=name, arguments=arguments)


@pytest.mark.parametrize("name", ["odd_data"])
async def test_a_result_that_cannot_be_stored_is_one_error_result_and_the_tool_runs_once(store, redis, keys, name):
    RUNS.clear()
    worker = ToolWorker(APP, store)
    job = await _call(store, f"u-{name}", name, '{"key": "k"}')
    fields = {JOB_FIELD: codec.encode(job)}
    await worker.on_job("1-1", fields, stream=keys.tools("default"))  # no exception: the handler is done
    await worker.on_job("1-1", fields, stream=keys.tools("default"))  # delivered again: answered already
    results = [e for e in await events_of(store, f"u-{name}") if isinstance(e, ToolOutput)]
    (result,) = results
    assert result.error == "invalid_result" and not result.late
    assert "cannot be stored" in result.text and name in result.text
    assert RUNS == {name: 1}
    assert worker.outcomes_unknown == 0
    if name == "odd_data":  # a tool with side effects: started once, no false "outcome unknown"
        assert sum(isinstance(e, ToolStarted) for e in await events_of(store, f"u-{name}")) == 1


@pytest.mark.parametrize("marker", ["with digest", "none (read the turn)", "without digest (older version)"])
async def test_a_job_whose_arguments_are_not_its_calls_runs_nothing_and_is_reported(store, redis, keys, marker):
    RUNS.clear()
    worker = ToolWorker(APP, store)
    trace_id = f"forge-{marker.split()[0]}"
    job = await _call(store, trace_id, "record", '{"key": "orig"}')
    if marker.startswith("none"):  # a call appended without markers: the worker reads the turn instead
        await redis.hdel(keys.trace_keys(trace_id), "call:c1")
    elif marker.startswith("without"):  # `<turn>\n<tool>`, as before markers carried the digest: the turn is read
        await redis.hset(keys.trace_keys(trace_id), "call:c1", "t1\nrecord")
    forged = ToolJob(trace_id=trace_id, turn_id="t1", call_id="c1", name="record", arguments='{"key": "forged"}')
    await worker.on_job("1-1", {JOB_FIELD: codec.encode(forged)}, stream=keys.tools("default"))
    assert RUNS == {} and worker.strays == 1
    assert not [e for e in await events_of(store, trace_id) if isinstance(e, (ToolOutput, ToolStarted))]
    (error,) = await errors_of(redis, keys)
    assert "was made with other arguments than the job's" in error["error"] and error["entry"] == "1-1"
    await worker.on_job("1-2", {JOB_FIELD: codec.encode(job)}, stream=keys.tools("default"))  # the real job still runs
    assert RUNS == {"record:orig": 1}
    (result,) = [e for e in await events_of(store, trace_id) if isinstance(e, ToolOutput)]
    assert result.text == "recorded orig" and result.error is None


@pytest.mark.parametrize("output", ["text", "tool call arguments"])
async def test_a_model_output_that_cannot_be_stored_fails_its_turn_once(store, redis, keys, output):
    """The same kind on the agent loop's side: a model (an app's own adapter, a double) that
    returns a lone surrogate. Before, the append failed the handler, and every delivery called
    the model again until the turn's entry was dead-lettered."""
    reply = "a\ud83db" if output == "text" else call("record", '{"key": "\ud83d"}')
    model = ScriptedModel([reply])
    loop = AgentLoop(APP, store, {"default": model})
    trace_id = f"m-{output.split()[0]}"
    turn = json.dumps({"trace_id": trace_id, "turn_id": "t1", "agent": "a", "text": "go"})
    await loop.on_turn("1-1", {TURN_FIELD: turn.encode()})  # no exception: the handler is done
    events = await events_of(store, trace_id)
    (failed,) = [e for e in events if isinstance(e, TurnFailed)]
    assert (
        failed.code == "model_error" and "cannot be stored" in failed.reason and "UnicodeEncodeError" in failed.reason
    )
    assert not [e for e in events if isinstance(e, ModelOutput)]
    (sent,) = [r for r in await replies_on(redis, keys.replies) if r.turn_id == "t1"]
    assert sent.status == "failed" and sent.code == "model_error"
    assert len(model.requests) == 1 and not model.errors


async def test_a_lone_surrogate_is_replaced_and_the_rest_of_the_result_is_recorded(store, redis, keys):
    # issue 34 kind 3: one lone surrogate used to turn the whole result into an error
    RUNS.clear()
    worker = ToolWorker(APP, store)
    job = await _call(store, "u-lone", "lone_surrogate", '{"key": "k"}')
    await worker.on_job("1-1", {JOB_FIELD: codec.encode(job)}, stream=keys.tools("default"))
    (result,) = [e for e in await events_of(store, "u-lone") if isinstance(e, ToolOutput)]
    assert result.text == "a\ufffdb" and result.error is None
    assert RUNS == {"lone_surrogate": 1}


@pytest.mark.parametrize("kind", ["utf8", "pdf"])
async def test_bytes_given_as_a_results_text_are_recorded_readable(store, redis, keys, kind):
    RUNS.clear()
    worker = ToolWorker(APP, store)
    job = await _call(store, f"b-{kind}", "binary", json.dumps({"kind": kind}))
    await worker.on_job("1-1", {JOB_FIELD: codec.encode(job)}, stream=keys.tools("default"))
    (result,) = [e for e in await events_of(store, f"b-{kind}") if isinstance(e, ToolOutput)]
    assert result.error is None and RUNS == {f"binary:{kind}": 1}
    if kind == "utf8":
        assert result.text == "résumé\n"
    else:
        assert result.text.startswith("[binary content: 20 bytes, application/pdf;")
        assert result.data["media_type"] == "application/pdf" and result.data["bytes"] == 20


@pytest.mark.parametrize("kind", ["dict", "event", "error", "deep"])
async def test_every_other_unstorable_result_is_recorded_once_and_the_tool_runs_once(redis, keys, kind):
    """The second trial: a plain value with a lone surrogate, an app event whose float is NaN (it
    encodes as null, which no read takes back), an error code with a lone surrogate, data nested
    past the stack: each had escaped the first check and failed the handler on every delivery."""
    RUNS.clear()
    store = TraceStore(redis, keys, codec=APP.codec)
    worker = ToolWorker(APP, store)
    trace_id = f"o-{kind}"
    job = await _call(store, trace_id, "odd", json.dumps({"kind": kind}))
    fields = {JOB_FIELD: codec.encode(job)}
    await worker.on_job("1-1", fields, stream=keys.tools("default"))
    await worker.on_job("1-1", fields, stream=keys.tools("default"))
    events = await events_of(store, trace_id)  # every entry reads back
    (result,) = [e for e in events if isinstance(e, ToolOutput)]
    assert RUNS == {f"odd:{kind}": 1} and worker.outcomes_unknown == 0 and not result.late
    assert not [e for e in events if isinstance(e, Score)]
    if kind == "dict":  # the readable part is kept; the lone surrogate is U+FFFD
        assert result.error is None and result.text == '{"echo":"\ufffd"}' and result.data == {"echo": "\ufffd"}
    elif kind == "error":
        assert result.error == "bad \ufffd" and result.text == "failed"
    else:
        assert result.error == "invalid_result" and "cannot be stored" in result.text, result


async def test_a_job_with_an_empty_tool_name_is_no_job_of_a_real_call(store, redis, keys):
    RUNS.clear()
    worker = ToolWorker(APP, store)
    job = await _call(store, "empty-name", "record", '{"key": "orig"}')
    forged = ToolJob(trace_id="empty-name", turn_id="t1", call_id="c1", name="", arguments='{"key": "orig"}')
    await worker.on_job("1-1", {JOB_FIELD: codec.encode(forged)}, stream=keys.tools("default"))
    assert worker.strays == 1 and not [e for e in await events_of(store, "empty-name") if isinstance(e, ToolOutput)]
    await worker.on_job("1-2", {JOB_FIELD: codec.encode(job)}, stream=keys.tools("default"))
    assert RUNS == {"record:orig": 1}


async def test_a_model_output_that_would_not_read_back_fails_its_turn(store, redis, keys):
    def nan_latency(request, info):
        from agentstream.wire.events import ModelOutput as Output

        return Output(turn_id="t1", step=0, content="hi", latency_ms=float("nan"))

    from agentstream.testing import FunctionModel

    loop = AgentLoop(APP, store, {"default": FunctionModel(nan_latency)})
    turn = json.dumps({"trace_id": "nan", "turn_id": "t1", "agent": "a", "text": "go"})
    await loop.on_turn("1-1", {TURN_FIELD: turn.encode()})
    events = await events_of(store, "nan")  # every entry reads back
    (failed,) = [e for e in events if isinstance(e, TurnFailed)]
    assert failed.code == "model_error" and "read back" in failed.reason
