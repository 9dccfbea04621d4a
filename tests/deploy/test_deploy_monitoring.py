"""Every agentstream pod is scraped exactly once, whatever monitors the values turn on: the
PodMonitor and the ServiceMonitor are rendered, their selectors evaluated against the rendered pods
(directly, or through the Services that select them) as the Prometheus Operator does, and each pod
with a metrics port is counted. The gateway's pods are among them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import K8S_NAMESPACE, Manifest, Render, Rendered

GATEWAY = {"gateway": {"enabled": True, "keys": {"existingSecret": "gateway-keys"}}}
POOLS = {"toolWorkers": {"pools": [{"name": "default", "queue": "default"}, {"name": "browser", "queue": "browser"}]}}


def label_selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against a set of labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pods(r: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every Deployment and StatefulSet."""
    return [(w["metadata"]["name"], w["spec"]["template"]) for w in r.of_kind("Deployment") + r.of_kind("StatefulSet")]


def has_port(template: dict[str, Any], port: str) -> bool:
    return any(p.get("name") == port for c in template["spec"]["containers"] for p in c.get("ports", []))


def scrapes(r: Rendered) -> dict[str, int]:
    """How many scrape targets each workload's pod gets from the rendered monitors."""
    counts = {name: 0 for name, _ in pods(r)}
    for pm in r.of_kind("PodMonitor"):
        assert pm["spec"]["namespaceSelector"]["matchNames"] == [K8S_NAMESPACE]
        for endpoint in pm["spec"]["podMetricsEndpoints"]:
            for name, template in pods(r):
                if label_selector_matches(pm["spec"]["selector"], template["metadata"]["labels"]):
                    assert has_port(template, endpoint["port"]), f"{name} has no port {endpoint['port']}"
                    counts[name] += 1
    for sm in r.of_kind("ServiceMonitor"):
        assert sm["spec"]["namespaceSelector"]["matchNames"] == [K8S_NAMESPACE]
        services = [
            s for s in r.of_kind("Service") if label_selector_matches(sm["spec"]["selector"], s["metadata"]["labels"])
        ]
        for endpoint in sm["spec"]["endpoints"]:
            for service in services:
                if not any(p["name"] == endpoint["port"] for p in service["spec"]["ports"]):
                    continue
                for name, template in pods(r):
                    if service["spec"]["selector"].items() <= template["metadata"]["labels"].items():
                        assert has_port(template, "metrics"), name
                        counts[name] += 1
    return counts


def component(r: Rendered, name: str) -> str:
    workload: Manifest = next(
        w for w in r.of_kind("Deployment") + r.of_kind("StatefulSet") if w["metadata"]["name"] == name
    )
    return workload["metadata"]["labels"]["app.kubernetes.io/component"]


@pytest.mark.parametrize(
    ("service_monitor", "pod_monitor"), [(True, True), (True, False), (False, True)], ids=["both", "service", "pod"]
)
def test_every_agentstream_pod_is_scraped_once(render: Render, service_monitor: bool, pod_monitor: bool) -> None:
    monitoring = {"serviceMonitor": {"enabled": service_monitor}, "podMonitor": {"enabled": pod_monitor}}
    r = render(values={**GATEWAY, **POOLS, "monitoring": monitoring})
    assert r.returncode == 0, r.stderr
    assert len(r.of_kind("PodMonitor")) == int(pod_monitor) and len(r.of_kind("ServiceMonitor")) == int(service_monitor)
    counts = scrapes(r)
    components = {component(r, name) for name in counts}
    assert {"agent-loop", "tool-worker", "delegation", "compaction", "gateway", "redis"} <= components
    for name, n in counts.items():
        want = 0 if component(r, name) == "redis" else 1  # the bundled Redis serves no /metrics
        assert n == want, f"{name} is scraped {n} times with {monitoring}"


def test_nothing_is_scraped_without_a_monitor(default_render: Rendered) -> None:
    assert not default_render.of_kind("PodMonitor") and not default_render.of_kind("ServiceMonitor")
    assert set(scrapes(default_render).values()) == {0}


def test_the_selector_evaluation_sees_a_double_scrape() -> None:
    """The helper above counts a pod selected by both monitors twice (the fault this guards against)."""
    labels = {"app.kubernetes.io/instance": "t", "app.kubernetes.io/component": "gateway"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"ports": [{"name": "metrics"}]}]}}
    docs = [
        {"kind": "Deployment", "metadata": {"name": "g", "labels": labels}, "spec": {"template": template}},
        {
            "kind": "Service",
            "metadata": {"name": "g", "labels": {"m": "1"}},
            "spec": {"selector": labels, "ports": [{"name": "metrics"}]},
        },
        {
            "kind": "PodMonitor",
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/instance": "t"}},
                "namespaceSelector": {"matchNames": [K8S_NAMESPACE]},
                "podMetricsEndpoints": [{"port": "metrics"}],
            },
        },
        {
            "kind": "ServiceMonitor",
            "spec": {
                "selector": {"matchLabels": {"m": "1"}},
                "namespaceSelector": {"matchNames": [K8S_NAMESPACE]},
                "endpoints": [{"port": "metrics"}],
            },
        },
    ]
    assert scrapes(Rendered(0, yaml.safe_dump_all(docs), "")) == {"g": 2}


def test_each_consumer_groups_service_label_is_a_chart_component(default_render: Rendered) -> None:
    """agentstream_handlers_in_flight's `service` is the service's name, the one the chart labels
    its pods with (app.kubernetes.io/component) and build_info carries, not its consumer group's
    (the tool workers' group is tool-workers)."""
    from agentstream.ops.metrics import service_of_group
    from agentstream.wire import keys

    groups = [keys.AGENT_LOOP_GROUP, keys.TOOL_WORKER_GROUP, keys.DELEGATION_GROUP, keys.COMPACTION_GROUP]
    components = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in default_render.of_kind("Deployment")}
    assert {service_of_group(g) for g in groups} == components
