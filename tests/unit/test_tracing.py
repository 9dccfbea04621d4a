"""agentstream.ops.tracing: W3C trace context through spans, a no-op without OpenTelemetry, a pass-through
with the API alone, and the OTel trace id in the JSON logs while a span records."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

from agentstream.delegation import ChildEnded, decode_child_ended
from agentstream.ops import logs, tracing
from agentstream.steps.summarising import CompactionJob, decode_job
from agentstream.wire import codec
from agentstream.wire.events import ToolJob
from tests.support import otel
from tests.support.otel import Parent, hex_span_id, hex_trace_id, parent_id

exporter = otel.exporter  # the fixture, by name


def test_carrier_of_keeps_only_the_w3c_pairs():
    assert tracing.carrier_of(None) == {}
    assert tracing.carrier_of({"traceparent": "tp", "tracestate": "a=b", "user": "u1", "baggage": "x"}) == {
        "traceparent": "tp",
        "tracestate": "a=b",
    }
    assert tracing.carrier_of({"traceparent": ""}) == {}


def test_without_opentelemetry_the_context_passes_through_unchanged(tmp_path):
    # opentelemetry made unimportable, as when the `otel` extra is not installed
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None
        from agentstream.ops import tracing
        assert not tracing.enabled()
        tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
        assert tracing.inject() == {}
        with tracing.span("agentstream.step", parent={"traceparent": tp, "user": "u"}) as span:
            span.set({"x": 1})
            with tracing.span("agentstream.model_call", kind="client"):
                assert tracing.inject() == {"traceparent": tp}
            assert tracing.current_ids() is None
        assert tracing.inject() == {}
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_with_the_api_alone_the_incoming_context_is_carried_on():
    # no SDK configured: spans do not record, and a job carries the turn's own context
    parent = Parent.new()
    with tracing.span("agentstream.step", parent={"traceparent": parent.traceparent, "tracestate": "v=1"}):
        assert tracing.inject() == {"traceparent": parent.traceparent, "tracestate": "v=1"}
        assert tracing.current_ids() is None
    with tracing.span("agentstream.step", parent={}):
        assert tracing.inject() == {}


def test_an_sdk_set_up_globally_after_spans_ran_without_one_records_the_next_spans():
    # spans skip the tracer while no SDK is set up; the global provider set later is used at once
    script = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from agentstream.ops import tracing
        tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
        with tracing.span("agentstream.step", parent={"traceparent": tp}):
            assert tracing.inject() == {"traceparent": tp}
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        with tracing.span("agentstream.step", parent={"traceparent": tp}):
            assert tracing.inject()["traceparent"].split("-")[1] == "a" * 32
            assert tracing.current_ids() is not None
        spans = exporter.get_finished_spans()
        assert [s.name for s in spans] == ["agentstream.step"] and spans[0].parent.span_id == int("b" * 16, 16)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_spans_are_children_of_the_carried_context(exporter):
    parent = Parent.new()
    with tracing.span("agentstream.step", parent={"traceparent": parent.traceparent}, attributes={"a": 1, "b": None}):
        with tracing.span("agentstream.model_call", kind="client") as call:
            call.set({"gen_ai.usage.input_tokens": 12, "none": None})
            carried = tracing.inject()
    call_span, step_span = exporter.get_finished_spans()
    assert hex_trace_id(step_span) == hex_trace_id(call_span) == parent.trace_id
    assert parent_id(step_span) == parent.span_id and parent_id(call_span) == hex_span_id(step_span)
    assert dict(step_span.attributes) == {"a": 1}
    assert dict(call_span.attributes) == {"gen_ai.usage.input_tokens": 12}
    assert carried["traceparent"] == f"00-{parent.trace_id}-{hex_span_id(call_span)}-01"


def test_a_span_without_carried_context_starts_a_new_trace(exporter):
    with tracing.span("agentstream.tool_call", parent={}, kind="consumer"):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.parent is None


def test_an_exception_marks_the_span_failed(exporter):
    from opentelemetry.trace import StatusCode

    with pytest.raises(RuntimeError), tracing.span("agentstream.tool_call", parent={}):
        raise RuntimeError("boom")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_json_logs_carry_the_otel_trace_id_while_a_span_records(exporter, capsys):
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        logs.setup("INFO", fmt="json")
        log = logging.getLogger("agentstream.test")
        parent = Parent.new()
        with (
            logs.bind(trace_id="c1", turn_id="t1"),
            tracing.span("agentstream.step", parent={"traceparent": parent.traceparent}),
        ):
            log.info("inside")
        log.info("outside")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    inside, outside = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    (span,) = exporter.get_finished_spans()
    assert inside["trace_id"] == "c1" and inside["turn_id"] == "t1"
    assert inside["otel_trace_id"] == parent.trace_id and inside["otel_span_id"] == hex_span_id(span)
    assert "otel_trace_id" not in outside and "otel_span_id" not in outside


def test_job_structs_carry_the_context_and_omit_it_when_empty():
    job = ToolJob(trace_id="c", turn_id="t", call_id="k", name="n", arguments="{}")
    assert b"trace_context" not in codec.encode(job)
    carried = ToolJob(
        trace_id="c", turn_id="t", call_id="k", name="n", arguments="{}", trace_context={"traceparent": "tp"}
    )
    assert codec.decode_job(codec.encode(carried)) == carried
    assert codec.decode_job(codec.encode(job)).trace_context == {}
    compaction = CompactionJob(
        trace_id="c", turn_id="t", step=1, kept_from_turn="t0", trace_context={"traceparent": "tp"}
    )
    assert decode_job(codec.encode(compaction)) == compaction
    assert b"trace_context" not in codec.encode(CompactionJob(trace_id="c", turn_id="t", step=1, kept_from_turn="t0"))
    ending = ChildEnded(trace_id="c/k", turn_id="t", trace_context={"traceparent": "tp"})
    assert decode_child_ended(codec.encode(ending)) == ending
    assert decode_child_ended(b'{"trace_id":"c/k","turn_id":"t"}').trace_context == {}  # from an older agent loop


def test_without_a_tracer_a_span_builds_nothing_and_is_one_shared_block():
    # no SDK configured (the services' usual case): no attributes built, no per-span object
    built = []

    def attributes():
        built.append(1)
        return {"agentstream.step": 1}

    assert not tracing.recording()
    first = tracing.span("agentstream.model_call", kind="client", attributes=attributes)
    assert first is tracing.span("agentstream.step", attributes=attributes)
    with first as span:
        assert span is tracing.current() and not span.recording
    assert tracing.model_call_attributes(object(), turn_id="u", step=1) == {}
    parent = Parent.new()
    with tracing.span("agentstream.step", parent={"traceparent": parent.traceparent}, attributes=attributes):
        with tracing.span("agentstream.model_call", kind="client", attributes=attributes):
            assert tracing.inject() == {"traceparent": parent.traceparent}
    assert built == []
    with pytest.raises(ValueError):
        tracing.span("agentstream.step", kind="server")


def test_with_a_tracer_attributes_given_as_a_function_are_recorded(exporter):
    assert tracing.recording()
    with tracing.span("agentstream.step", attributes=lambda: {"agentstream.step": 3, "x": None}):
        pass
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes) == {"agentstream.step": 3}
