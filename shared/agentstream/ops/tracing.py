"""OpenTelemetry trace context across the services (optional: ``pip install agentstream[otel]``).

A turn's metadata may carry a W3C ``traceparent`` (and ``tracestate``): the publisher's span.
The services continue that trace, so a user's tracing spans them:

- agent loop: ``agentstream.step`` for each step it takes on a turn (a child of the turn's
  context), and inside a model-calling step ``agentstream.model_call`` (its child);
- tool worker: ``agentstream.tool_call`` for each tool job, a child of the step that published it
  (the job carries that step's context in ``trace_context``); the tool's own code runs inside it;
- delegation: ``agentstream.delegation`` for each delegation job (a child of its step); the child
  trace's TaskInput carries its context in ``metadata``, so the child's steps are its children;
  ``agentstream.hand_back`` for each child ending (a child of the child's last step);
- compaction: ``agentstream.compaction`` for each job (a child of the step that asked for the
  summary), with an ``agentstream.model_call`` per summary call.

Only ``opentelemetry-api`` is used: spans are recorded when the app (or
``opentelemetry-instrument``) configures the SDK with an exporter; otherwise they cost next to
nothing and the incoming context passes through unchanged. Without the package every function
here is a no-op, and the context a job carries is its parent's, unchanged. Work streams carry
the context as hints carry everything: a re-delivered job continues the same parent.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentstream.wire.events import ModelOutput

try:
    from opentelemetry import trace as _otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    _otel = None  # type: ignore[assignment]  # the optional module's absence, tested as None below

CARRIER_KEYS = ("traceparent", "tracestate")
"""The W3C trace-context keys carried in a turn's metadata and a job's ``trace_context``."""

_propagator = TraceContextTextMapPropagator() if _otel is not None else None
_provider: Any = None  # set_tracer_provider(); None: OpenTelemetry's global provider
_KINDS = {"internal", "client", "consumer"}
# Without OpenTelemetry: the carrier of the innermost span() block, passed on unchanged.
_fallback: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "agentstream_trace_carrier", default=MappingProxyType({})
)


def set_tracer_provider(provider: Any) -> None:
    """Record agentstream's spans with this TracerProvider rather than OpenTelemetry's global
    one (None: the global one again). Tests use it; an app usually sets the global provider."""
    global _provider
    _provider = provider


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is installed (spans are recorded only when an SDK is set up)."""
    return _otel is not None


def carrier_of(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The W3C trace-context pairs of a metadata map (``traceparent``, ``tracestate``)."""
    if not metadata:
        return {}
    return {k: metadata[k] for k in CARRIER_KEYS if isinstance(metadata.get(k), str) and metadata[k]}


class Span:
    """One span (or a stand-in when OpenTelemetry is absent): what the hooks may do with it."""

    def __init__(self, span: Any = None):
        self._span = span

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Set attributes on the span (None values are left out)."""
        if self._span is None or not self._span.is_recording():
            return
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(name, value)


def current() -> Span:
    """The current span (a stand-in when there is none or OpenTelemetry is absent)."""
    return Span(_otel.get_current_span()) if _otel is not None else Span()


def inject() -> dict[str, str]:
    """The trace context to carry on (a job's ``trace_context``): the current span's, as W3C pairs.

    Empty when there is no valid current span. Without OpenTelemetry: the innermost
    :func:`span` block's parent context, unchanged.
    """
    if _propagator is None:
        return dict(_fallback.get())
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier_of(carrier)


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: Mapping[str, str] | None = None,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """Run the block in a span named ``name``.

    Args:
        name: the span's name (``agentstream.step``, ...).
        parent: a carrier (a turn's metadata, a job's ``trace_context``): the span is a child of
            the context it holds, or the root of a new trace when it holds none. None: a child of
            the current span (a span nested in another).
        kind: ``internal``, ``client`` (a call out, such as a model call) or ``consumer`` (a job).
        attributes: the span's attributes (None values are left out).

    An exception that leaves the block is recorded on the span, which is then marked as failed.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if _otel is None:
        token = _fallback.set(carrier_of(parent)) if parent is not None else None
        try:
            yield Span()
        finally:
            if token is not None:
                _fallback.reset(token)
        return
    context = _propagator.extract(carrier_of(parent)) if parent is not None else None
    tracer = _tracer()
    if tracer is None:  # no SDK: OpenTelemetry's no-op tracer would only pass the parent on
        if context is None:
            yield Span(_otel.get_current_span())
            return
        from opentelemetry import context as _context

        token = _context.attach(_otel.set_span_in_context(_otel.get_current_span(context)))
        try:
            yield Span(_otel.get_current_span())
        finally:
            _context.detach(token)
        return
    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(
        name, context=context, kind=getattr(_otel.SpanKind, kind.upper()), attributes=clean
    ) as current:
        yield Span(current)


_tracers: dict[int, tuple[Any, Any]] = {}  # id(provider) → (provider, its agentstream tracer)


def _tracer() -> Any:
    """agentstream's tracer from the provider in use → None when no SDK is set up (OpenTelemetry's
    proxy or no-op provider), where a span records nothing (a span block then costs a context
    switch, not a tracer call per step)."""
    provider = _provider if _provider is not None else _otel.get_tracer_provider()
    if isinstance(provider, (_otel.ProxyTracerProvider, _otel.NoOpTracerProvider)):
        return None
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = _tracers[id(provider)] = (provider, _otel.get_tracer("agentstream", tracer_provider=provider))
    return cached[1]


@contextlib.contextmanager
def within(carrier: Mapping[str, str]) -> Iterator[None]:
    """Run the block in the context a carrier holds (from :func:`inject`), with no span of its
    own: work done later on behalf of a span (a reply published after its step) carries that
    span's context on."""
    if _otel is None:
        token = _fallback.set(carrier_of(carrier))
        try:
            yield
        finally:
            _fallback.reset(token)
        return
    from opentelemetry import context as _context

    token = _context.attach(_propagator.extract(carrier_of(carrier)))
    try:
        yield
    finally:
        _context.detach(token)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span when one is recording, for the logs."""
    if _otel is None:
        return None
    current = _otel.get_current_span()
    if not current.is_recording():
        return None
    ctx = current.get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def model_call_attributes(model: Any, *, turn_id: str | None = None, step: int | None = None) -> dict[str, Any]:
    """The attributes of an ``agentstream.model_call`` span before the call (GenAI conventions).

    Args:
        model: the model client (a :class:`~agentstream.models.ChatModel`; its ``endpoint`` says
            which provider, model and endpoint id).
    """
    config = getattr(model, "endpoint", None)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": getattr(config, "provider", None),
        "gen_ai.request.model": getattr(config, "model", None),
        "agentstream.model.endpoint": getattr(config, "id", None),
        "agentstream.turn_id": turn_id,
        "agentstream.step": step,
    }


def record_model_output(span: Span, output: ModelOutput | None) -> None:
    """Add a model call's outcome to its span: response model, stop reason and token usage."""
    if output is None:
        return
    usage = output.usage
    span.set(
        {
            "gen_ai.response.model": output.model or None,
            "gen_ai.response.finish_reasons": (output.stop_reason,) if output.stop_reason else None,
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "agentstream.tool_calls": len(output.tool_calls),
        }
    )
