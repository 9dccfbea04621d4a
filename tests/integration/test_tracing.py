"""OpenTelemetry trace context across the services (issue 7 item 5), in process on real Redis:
a turn published with a W3C traceparent gets its steps, model calls, tool calls, delegations,
hand-backs and compactions recorded as spans of the publisher's trace, each below its parent."""

from __future__ import annotations

import pytest

from agentstream.steps.summarising import decode_job as decode_compaction_job
from agentstream.wire import codec
from agentstream.wire.events import Compaction, TaskInput
from agentstream.wire.keys import COMPACTION_FIELD, JOB_FIELD
from tests.support import apps, compaction_apps, delegation_apps, otel
from tests.support.inprocess import InProcess, events_of, publish, wait_for, wait_reply
from tests.support.otel import Parent, ancestors, hex_span_id, hex_trace_id, named, parent_id
from tests.support.scripted_model import ScriptedModelServer, calculator_rule

pytestmark = pytest.mark.integration

exporter = otel.exporter  # the fixture, by name


@pytest.fixture
def model():
    with ScriptedModelServer(calculator_rule) as server:
        yield server


@pytest.fixture
async def services(redis_url, namespace, model):
    running: list[InProcess] = []

    def make(app, rule=None) -> InProcess:
        if rule is not None:
            model.rule = rule
        s = InProcess(app, redis_url, namespace, model.base_url)
        running.append(s)
        return s

    yield make
    for s in running:
        await s.stop_all()


async def finished(exporter, *names: str, count: int = 1):
    """Wait until at least ``count`` spans of each name have ended → every ended span."""

    async def ready():
        spans = exporter.get_finished_spans()
        return spans if all(len(named(spans, n)) >= count for n in names) else None

    return await wait_for(ready, what=f"finished spans {names}")


async def test_tool_and_model_call_spans_continue_the_turns_trace(redis, keys, services, exporter):
    s = services(apps.app)
    await s.start("p1", "agent-loop", "tool-worker")
    parent = Parent.new()
    await publish(
        redis,
        keys,
        trace_id="c1",
        turn_id="t1",
        agent="calc",
        text="What is 6*7?",
        metadata={"traceparent": parent.traceparent, "tracestate": "vendor=x"},
    )
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended" and "42" in reply.answer
    spans = await finished(exporter, "agentstream.model_call", "agentstream.tool_call", count=1)
    model_calls = named(spans, "agentstream.model_call")
    (tool_call,) = named(spans, "agentstream.tool_call")
    assert len(model_calls) == 2  # one asks for the tool, one answers with its result
    steps = {hex_span_id(st): st for st in named(spans, "agentstream.step")}
    for span in [*model_calls, tool_call, *steps.values()]:
        assert hex_trace_id(span) == parent.trace_id, span.name
        assert parent.span_id in ancestors(span, spans), f"{span.name} is not below the publisher's span"
    for step in steps.values():  # every step is a child of the publisher's span itself
        assert parent_id(step) == parent.span_id
        assert step.attributes["agentstream.turn_id"] == "t1"
    for call in model_calls:
        step = steps[parent_id(call)]
        assert step.attributes["agentstream.decision"] == "CallModel"
        assert call.attributes["gen_ai.request.model"] == "scripted-model"
        assert call.attributes["agentstream.model.endpoint"] == "default"
    # the tool call is a child of the step that published its job; the job carried its context
    assert steps[parent_id(tool_call)].attributes["agentstream.decision"] == "RunTools"
    assert tool_call.attributes["gen_ai.tool.name"] == "calculator"
    ((_, fields),) = await redis.xrange(keys.tools_for("default", "c1"))
    job = codec.decode_job(fields[JOB_FIELD])
    assert job.trace_context["traceparent"] == f"00-{parent.trace_id}-{parent_id(tool_call)}-01"
    assert job.trace_context["tracestate"] == "vendor=x"


async def test_a_turn_without_traceparent_publishes_jobs_as_before(redis, keys, services):
    # no SDK set up (no exporter fixture): the jobs carry no trace context
    s = services(apps.app)
    await s.start("p1", "agent-loop", "tool-worker")
    await publish(redis, keys, trace_id="c2", turn_id="t1", agent="calc", text="What is 1+2?")
    assert (await wait_reply(redis, keys, "t1")).status == "ended"
    ((_, fields),) = await redis.xrange(keys.tools_for("default", "c2"))
    assert b"trace_context" not in fields[JOB_FIELD]


async def test_delegation_spans_reach_into_child_traces(redis, keys, services, store, exporter):
    s = services(delegation_apps.app, delegation_apps.rule)
    await s.start("p1", "agent-loop", "tool-worker", "delegation")
    parent = Parent.new()
    await publish(
        redis,
        keys,
        trace_id="d1",
        turn_id="t1",
        agent="lead",
        text="Compare A and B",
        metadata={"traceparent": parent.traceparent},
    )
    reply = await wait_reply(redis, keys, "t1")
    assert reply.status == "ended", reply.reason
    spans = await finished(
        exporter, "agentstream.delegation", "agentstream.hand_back", "agentstream.tool_call", count=2
    )
    for span in spans:
        assert hex_trace_id(span) == parent.trace_id, span.name
        assert parent.span_id in ancestors(span, spans), f"{span.name} is not below the publisher's span"
    by_id = {hex_span_id(x): x for x in spans}
    delegations = named(spans, "agentstream.delegation")
    assert len(delegations) == 2
    for delegation in delegations:  # a child of the parent's step that published the call
        assert by_id[parent_id(delegation)].attributes["agentstream.trace_id"] == "d1"
    # each child trace's steps are children of the delegation that opened it
    children = {}
    for delegation in delegations:
        child_steps = [x for x in named(spans, "agentstream.step") if parent_id(x) == hex_span_id(delegation)]
        assert child_steps, "the child's steps continue the delegation's span"
        (child_trace,) = {x.attributes["agentstream.trace_id"] for x in child_steps}
        children[child_trace] = delegation
    for child_trace, delegation in children.items():
        (task,) = [e for e in await events_of(store, child_trace) if isinstance(e, TaskInput)]
        assert task.metadata["traceparent"] == f"00-{parent.trace_id}-{hex_span_id(delegation)}-01"
        lookups = [
            x for x in named(spans, "agentstream.tool_call") if x.attributes["agentstream.trace_id"] == child_trace
        ]
        assert lookups and all(hex_span_id(delegation) in ancestors(x, spans) for x in lookups)
    for hand_back in named(spans, "agentstream.hand_back"):  # a child of the child's last step
        step = by_id[parent_id(hand_back)]
        assert step.attributes["agentstream.trace_id"] == hand_back.attributes["agentstream.trace_id"] in children


async def test_compaction_span_is_a_child_of_the_step_that_asked(redis, keys, services, store, exporter):
    s = services(compaction_apps.app, compaction_apps.rule)
    await s.start("p1", "agent-loop", "compaction")
    parents = {}
    for n in range(1, 7):
        parents[f"t{n}"] = Parent.new()
        await publish(
            redis,
            keys,
            trace_id="k1",
            turn_id=f"t{n}",
            agent="chatty",
            text=compaction_apps.turn_text(n),
            metadata={"traceparent": parents[f"t{n}"].traceparent},
        )
        assert (await wait_reply(redis, keys, f"t{n}")).status == "ended"
    compactions = [e for e in await events_of(store, "k1") if isinstance(e, Compaction)]
    assert compactions, "the conversation compacted"
    spans = await finished(exporter, "agentstream.compaction", count=len(compactions))
    by_id = {hex_span_id(x): x for x in spans}
    for span in named(spans, "agentstream.compaction"):
        turn_id = span.attributes["agentstream.turn_id"]
        parent = parents[turn_id]
        assert hex_trace_id(span) == parent.trace_id
        asking = by_id[parent_id(span)]
        assert asking.name == "agentstream.step" and asking.attributes["agentstream.turn_id"] == turn_id
        assert parent_id(asking) == parent.span_id
        summary_calls = [x for x in named(spans, "agentstream.model_call") if parent_id(x) == hex_span_id(span)]
        assert summary_calls, "the summary calls are children of the compaction"
    jobs = [
        decode_compaction_job(f[COMPACTION_FIELD])
        for _, f in await redis.xrange(keys.for_trace(keys.compactions, "k1"))
    ]
    assert jobs and all(parents[j.turn_id].trace_id in j.trace_context["traceparent"] for j in jobs)
