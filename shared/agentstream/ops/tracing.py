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
``opentelemetry-instrument``) configures the SDK with an exporter. Otherwise (no SDK provider,
global or set here) a span is a shared no-op or one context variable set, its attributes are not
built (:func:`model_call_attributes` is empty; a callable ``attributes`` is not called), and the
incoming context passes through unchanged, as agentstream's jobs carry it (it is not attached to
OpenTelemetry's own context). Without the package every function
here is a no-op, and the context a job carries is its parent's, unchanged. Work streams carry
the context as hints carry everything: a re-delivered job continues the same parent.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Mapping
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
_KINDS = frozenset({"internal", "client", "consumer"})
# Whether the global provider can be read as OpenTelemetry's module attribute (one load per span)
# rather than by get_tracer_provider() (an os.environ lookup per call); an env-named provider is
# loaded by that function, so it is used then. The attribute is private to opentelemetry-api 1.x:
# pyproject.toml pins the extra below 2, and tests/unit/test_tracing.py
# (test_an_sdk_set_up_globally_after_spans_ran_without_one_records_the_next_spans) sets a provider
# by the public API and fails if a release stops this read from finding it.
_GLOBAL_ATTR = (
    _otel is not None and hasattr(_otel, "_TRACER_PROVIDER") and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
)
_last: tuple[Any, Any] = (object(), None)  # (the provider last seen, its agentstream tracer or None)
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

    @property
    def recording(self) -> bool:
        """Whether attributes set on this span are kept."""
        return self._span is not None and self._span.is_recording()

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Set attributes on the span (None values are left out)."""
        if self._span is None or not self._span.is_recording():
            return
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(name, value)


_NO_SPAN = Span()


def current() -> Span:
    """The current span (a stand-in when there is none or no tracer records)."""
    return Span(_otel.get_current_span()) if _tracer() is not None else _NO_SPAN


def inject() -> dict[str, str]:
    """The trace context to carry on (a job's ``trace_context``): the current span's, as W3C pairs.

    Empty when there is no valid current span. Without a tracer (see :func:`recording`): the
    innermost :func:`span` block's parent context, unchanged.
    """
    if _propagator is None or _tracer() is None:
        return dict(_fallback.get())
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier_of(carrier)


Attributes = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
"""A span's attributes, or a function building them (called only when the span records)."""


class _NoSpan:
    """The block of a span that records nothing and carries no context: one shared instance."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return _NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


class _Carried:
    """The block of a span that records nothing: its parent's carrier is passed on unchanged."""

    __slots__ = ("carrier", "token")

    def __init__(self, carrier: Mapping[str, str]):
        self.carrier = carrier
        self.token: contextvars.Token[Mapping[str, str]] | None = None

    def __enter__(self) -> Span:
        self.token = _fallback.set(self.carrier)
        return _NO_SPAN

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _fallback.reset(self.token)
            self.token = None


_NO_BLOCK = _NoSpan()


def span(
    name: str,
    *,
    parent: Mapping[str, str] | None = None,
    kind: str = "internal",
    attributes: Attributes | None = None,
) -> contextlib.AbstractContextManager[Span]:
    """Run the block in a span named ``name`` (``with tracing.span(...) as span:``).

    Args:
        name: the span's name (``agentstream.step``, ...).
        parent: a carrier (a turn's metadata, a job's ``trace_context``): the span is a child of
            the context it holds, or the root of a new trace when it holds none. None: a child of
            the current span (a span nested in another).
        kind: ``internal``, ``client`` (a call out, such as a model call) or ``consumer`` (a job).
        attributes: the span's attributes (None values are left out), or a function returning
            them, called only when the span records.

    Without a tracer (see :func:`recording`) nothing is built: a span without ``parent`` is a
    shared no-op block, one with ``parent`` sets the carrier :func:`inject` passes on. An
    exception that leaves a recorded block is recorded on the span, which is then marked as failed.

    Raises:
        ValueError: ``kind`` is none of the three.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    tracer = _tracer()
    if tracer is None:
        return _NO_BLOCK if parent is None else _Carried(carrier_of(parent))
    return _recorded(tracer, name, parent, kind, attributes)


@contextlib.contextmanager
def _recorded(
    tracer: Any, name: str, parent: Mapping[str, str] | None, kind: str, attributes: Attributes | None
) -> Iterator[Span]:
    context = _propagator.extract(carrier_of(parent)) if parent is not None else None
    given = attributes() if callable(attributes) else attributes
    clean = {k: v for k, v in (given or {}).items() if v is not None}
    with tracer.start_as_current_span(
        name, context=context, kind=getattr(_otel.SpanKind, kind.upper()), attributes=clean
    ) as current:
        yield Span(current)


def recording() -> bool:
    """Whether spans are recorded: OpenTelemetry is installed and an SDK provider is set
    (globally, or by :func:`set_tracer_provider`). Costs one attribute read while it stays so."""
    return _tracer() is not None


def _tracer() -> Any:
    """agentstream's tracer from the provider in use → None when no SDK is set up (no provider,
    OpenTelemetry's proxy or no-op provider, or no OpenTelemetry), where a span records nothing.
    The tracer is looked up again only when the provider in use changes."""
    if _otel is None:
        return None
    global _last
    if _provider is not None:
        provider = _provider
    elif _GLOBAL_ATTR:
        provider = _otel._TRACER_PROVIDER  # None until the app sets one
    else:
        provider = _otel.get_tracer_provider()
    last = _last
    if provider is last[0]:
        return last[1]
    if provider is None or isinstance(provider, (_otel.ProxyTracerProvider, _otel.NoOpTracerProvider)):
        tracer = None
    else:
        tracer = _otel.get_tracer("agentstream", tracer_provider=provider)
    _last = (provider, tracer)
    return tracer


@contextlib.contextmanager
def within(carrier: Mapping[str, str]) -> Iterator[None]:
    """Run the block in the context a carrier holds (from :func:`inject`), with no span of its
    own: work done later on behalf of a span (a reply published after its step) carries that
    span's context on."""
    if _tracer() is None:
        token = _fallback.set(carrier_of(carrier))
        try:
            yield
        finally:
            _fallback.reset(token)
        return
    from opentelemetry import context as _context

    attached = _context.attach(_propagator.extract(carrier_of(carrier)))
    try:
        yield
    finally:
        _context.detach(attached)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span when one is recording, for the logs."""
    if _tracer() is None:
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

    Empty (nothing read) when no tracer records (see :func:`recording`).
    """
    if _tracer() is None:
        return {}
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
    if output is None or not span.recording:
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
