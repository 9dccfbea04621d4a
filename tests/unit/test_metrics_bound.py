"""agentstream.ops.metrics: children bound once per label values still count as prometheus_client's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from agentstream.ops import metrics


def test_bound_children_are_the_registered_ones_and_count():
    registry = CollectorRegistry()
    calls = metrics.Counter("t_calls_total", "test", ["agent", "code"], registry=registry)
    child = calls.labels(agent="a", code="busy")
    assert calls.labels(agent="a", code="busy") is child  # one lookup per step, the same child
    assert calls.labels("a", "busy") is child  # by position: prometheus_client's child too
    child.inc()
    calls.labels(agent="a", code="busy").inc(2)
    assert registry.get_sample_value("t_calls_total", {"agent": "a", "code": "busy"}) == 3
    seconds = metrics.Histogram("t_seconds", "test", ["model"], registry=registry, buckets=(1, 2))
    seconds.labels(model="m").observe(0.5)
    seconds.labels(model="m").observe(1.5)
    assert registry.get_sample_value("t_seconds_count", {"model": "m"}) == 2
    assert b't_seconds_bucket{le="1.0",model="m"} 1.0' in generate_latest(registry)


def test_removed_children_are_not_served_from_the_cache():
    registry = CollectorRegistry()
    depth = metrics.Gauge("t_depth", "test", ["stream"], registry=registry)
    depth.labels(stream="s").set(5)
    depth.remove("s")
    depth.labels(stream="s").inc()
    assert registry.get_sample_value("t_depth", {"stream": "s"}) == 1
    depth.clear()
    assert registry.get_sample_value("t_depth", {"stream": "s"}) is None
    depth.labels(stream="s").inc()
    assert registry.get_sample_value("t_depth", {"stream": "s"}) == 1


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(metrics, "BOUND_CHILDREN_CAP", 4)
    calls = metrics.Counter("t_tools_total", "test", ["tool"], registry=CollectorRegistry())
    for n in range(10):
        calls.labels(tool=f"t{n}").inc()
    assert len(calls._by_name) <= 4
    assert calls.labels(tool="t0")._value.get() == 1
