"""Smaller operator needs of the chart: the gateway's startup probe, the `helm test` pod's
resources, a Redis password that GitOps tools cannot regenerate, a global image registry,
extraObjects, sidecars, init containers and lifecycle hooks (global, per service, per pool), names
under long release names that stay unique and say what they are, and Chart.yaml's metadata."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import CHART, Render, Rendered, find_tool, run

GATEWAY = {"gateway": {"enabled": True, "keys": {"existingSecret": "gateway-keys"}}}


def container(r: Rendered, name: str) -> dict[str, Any]:
    pod = r.named("Deployment", name)["spec"]["template"]["spec"]
    return pod["containers"][0]


def kubernetes_valid(r: Rendered) -> None:
    proc = run([find_tool("kubernetes-validate"), "--strict", "-k", "1.31.0", "-"], stdin=r.stdout, timeout_s=120)
    assert proc.returncode == 0 and "ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_gateway_has_a_startup_probe_on_its_http_port(render: Render, default_values: dict[str, Any]) -> None:
    c = container(render(values=GATEWAY), "t-agentstream-gateway")
    probe = c["startupProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {k: probe[k] for k in default_values["probes"]["startup"]} == default_values["probes"]["startup"]


def test_the_helm_test_pod_has_resources(default_render: Rendered, render: Render) -> None:
    (pod,) = [p for p in default_render.of_kind("Pod") if p["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    mine = render(values={"tests": {"resources": {"limits": {"memory": "1Gi"}}}})
    (pod,) = mine.of_kind("Pod")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "1Gi"


def test_gitops_can_require_an_existing_password_secret(render: Render) -> None:
    refused = render(values={"redis": {"auth": {"requireExistingSecret": True}}})
    assert refused.returncode != 0 and "redis.auth.requireExistingSecret is true" in refused.stderr
    given = render(values={"redis": {"auth": {"requireExistingSecret": True, "existingSecret": "redis-auth"}}})
    assert given.returncode == 0, given.stderr
    assert not given.of_kind("Secret"), "nothing generated: every render is the same"
    assert (
        render(values={"redis": {"auth": {"existingSecret": "redis-auth"}}}).stdout
        == render(values={"redis": {"auth": {"existingSecret": "redis-auth"}}}).stdout
    )


def test_a_global_image_registry_prefixes_every_image_unless_an_image_has_its_own(render: Render) -> None:
    r = render(values={**GATEWAY, "global": {"imageRegistry": "mirror.example.com:5000/hub"}})
    images = {
        c["image"]
        for w in r.of_kind("Deployment") + r.of_kind("StatefulSet")
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    images |= {c["image"] for p in r.of_kind("Pod") for c in p["spec"]["containers"]}
    assert images == {"mirror.example.com:5000/hub/agentstream:0.3.0", "mirror.example.com:5000/hub/redis:7.4.2"}
    own = render(
        values={
            "global": {"imageRegistry": "mirror.example.com"},
            "image": {"registry": "registry.example.com", "digest": "sha256:" + "a" * 64},
            "redis": {"bundled": {"image": {"registry": "docker.io/library"}}},
        }
    )
    images = {
        c["image"]
        for w in own.of_kind("Deployment") + own.of_kind("StatefulSet")
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"registry.example.com/agentstream@sha256:{'a' * 64}", "docker.io/library/redis:7.4.2"}
    bad = render(values={"global": {"imageRegistry": "https://mirror"}})
    assert bad.returncode != 0 and "imageRegistry" in bad.stderr


def test_extra_objects_are_rendered_with_the_values(render: Render) -> None:
    objects = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "{{ .Release.Name }}-extra"},
            "data": {"ns": "{{ .Values.streamNamespace }}"},
        },
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ include "agentstream.fullname" . }}-text\n',
    ]
    r = render(values={"extraObjects": objects})
    assert r.named("ConfigMap", "t-extra")["data"] == {"ns": "agentstream"}
    r.named("ConfigMap", "t-agentstream-text")
    kubernetes_valid(r)


def test_sidecars_init_containers_and_lifecycle_reach_every_service_and_pool(render: Render) -> None:
    sidecar = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"}
    init = {"name": "wait", "image": "busybox:1.36", "command": ["true"]}
    pre_stop = {"preStop": {"exec": {"command": ["sleep", "2"]}}}
    values = {
        **GATEWAY,
        "sidecars": [sidecar],
        "initContainers": [init],
        "lifecycle": pre_stop,
        "agentLoop": {
            "sidecars": [{"name": "loop-extra", "image": "busybox:1.36"}],
            "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
        },
        "toolWorkers": {
            "initContainers": [{"name": "tools-init", "image": "busybox:1.36"}],
            "pools": [
                {"name": "default", "queue": "default"},
                {"name": "heavy", "queue": "heavy", "sidecars": [{"name": "heavy-extra", "image": "busybox:1.36"}]},
            ],
        },
    }
    r = render(values=values)
    assert r.returncode == 0, r.stderr
    pods = {
        d["metadata"]["name"].removeprefix("t-agentstream-"): d["spec"]["template"]["spec"]
        for d in r.of_kind("Deployment")
    }
    names = {k: [c["name"] for c in p["containers"]] for k, p in pods.items()}
    inits = {k: [c["name"] for c in p.get("initContainers", [])] for k, p in pods.items()}
    assert names == {
        "agent-loop": ["agent-loop", "proxy", "loop-extra"],
        "tool-worker-default": ["tool-worker", "proxy"],
        "tool-worker-heavy": ["tool-worker", "proxy", "heavy-extra"],
        "delegation": ["delegation", "proxy"],
        "compaction": ["compaction", "proxy"],
        "gateway": ["gateway", "proxy"],
    }
    assert inits["tool-worker-heavy"] == ["wait", "tools-init"] and inits["gateway"] == ["wait"]
    lifecycles = {k: p["containers"][0]["lifecycle"] for k, p in pods.items()}
    assert lifecycles.pop("agent-loop") == {"preStop": {"sleep": {"seconds": 1}}}  # its own replaces the global
    assert all(v == pre_stop for v in lifecycles.values())
    (sts,) = r.of_kind("StatefulSet")
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["redis"], "not the bundled Redis"
    kubernetes_valid(r)


def test_nothing_extra_by_default(default_render: Rendered) -> None:
    for d in default_render.of_kind("Deployment"):
        pod = d["spec"]["template"]["spec"]
        assert len(pod["containers"]) == 1 and "initContainers" not in pod and "lifecycle" not in pod["containers"][0]


LONG = "a-very-long-release-name-for-the-agents-abc"  # 43 characters: every component name is cut


@pytest.fixture(scope="module")
def long_names(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    values = {
        "toolWorkers": {
            "pools": [{"name": "browser-heavy-one", "queue": "one"}, {"name": "browser-heavy-two", "queue": "two"}]
        },
        **GATEWAY,
    }
    path = tmp_path_factory.mktemp("long") / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run([helm, "template", LONG, str(CHART), "--namespace", "agents", "-f", str(path)])
    return Rendered(proc.returncode, proc.stdout, proc.stderr)


def test_long_names_say_which_component_they_are(long_names: Rendered) -> None:
    fullname = f"{LONG}-agentstream"
    deployments = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]
        + "/"
        + d["metadata"]["labels"].get("agentstream.io/tool-pool", ""): d["metadata"]["name"]
        for d in long_names.of_kind("Deployment")
    }
    for key, name in deployments.items():
        component, pool = key.split("/")
        suffix = f"tool-worker-{pool}" if pool else component
        assert len(name) <= 63 and name.endswith(f"-{suffix}"), name
        whole = f"{fullname}-{suffix}"
        if len(whole) <= 63:
            assert name == whole  # kept whole when it fits
            continue
        digest = hashlib.sha256(whole.encode()).hexdigest()[:8]
        assert re.fullmatch(rf"a-very-long-release-name[-a-z]*-{digest}-{suffix}", name), name
    assert deployments["tool-worker/browser-heavy-one"] != deployments["tool-worker/browser-heavy-two"]


def test_the_bundled_redis_keeps_its_0_1_0_names(long_names: Rendered) -> None:
    """A StatefulSet's name and serviceName cannot change without losing its volume: they stay
    as 0.1.0 made them under a long release name."""

    def old(name: str, limit: int) -> str:
        if len(name) <= limit:
            return name
        return name[: limit - 9].rstrip("-") + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]

    (sts,) = long_names.of_kind("StatefulSet")
    assert sts["metadata"]["name"] == old(f"{LONG}-agentstream-redis", 52)
    assert sts["spec"]["serviceName"] == old(f"{LONG}-agentstream-redis-headless", 63)


def test_chart_yaml_has_the_metadata_of_a_published_chart() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["maintainers"] and all(m.get("name") for m in chart["maintainers"])
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert chart["keywords"] and chart["kubeVersion"] and chart["description"]
