"""OpenTelemetry helpers for tests: an in-memory span exporter, and questions about the spans."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentstream.ops import tracing


@dataclass(frozen=True)
class Parent:
    """A publisher's span, as a W3C traceparent."""

    trace_id: str
    span_id: str

    @classmethod
    def new(cls) -> Parent:
        return cls(secrets.token_hex(16), secrets.token_hex(8))

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"


@pytest.fixture
def exporter() -> Iterator:
    """agentstream's spans, recorded by an SDK TracerProvider into memory for this test only."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def hex_trace_id(span) -> str:
    return f"{span.context.trace_id:032x}"


def hex_span_id(span) -> str:
    return f"{span.context.span_id:016x}"


def parent_id(span) -> str | None:
    return f"{span.parent.span_id:016x}" if span.parent is not None else None


def named(spans, name: str) -> list:
    return [s for s in spans if s.name == name]


def ancestors(span, spans) -> list[str]:
    """The span ids above ``span``, nearest first (the last may be a span not recorded here)."""
    by_id = {hex_span_id(s): s for s in spans}
    chain = []
    current = parent_id(span)
    while current is not None:
        chain.append(current)
        above = by_id.get(current)
        current = parent_id(above) if above is not None else None
    return chain
