"""The Helm chart lints, renders and validates, and the rendered manifests hold what matters:
probes, security context, drain time, KEDA triggers on the right stream and group, secrets never
inlined. Rendered for the default values, ci/full-values.yaml (everything on) and the HPA variant.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy.deploy_support import CHART, FULL_VALUES, K8S_NAMESPACE, RELEASE, Manifest, Rendered, find_tool, run

FULLNAME = f"{RELEASE}-agentstream"
AGENTSTREAM_COMPONENTS = {"agent-loop", "tool-worker", "delegation", "compaction"}
SECRET_LIKE = re.compile(r"PASSWORD|API_KEY|_KEY_|SECRET|TOKEN|CREDENTIAL", re.IGNORECASE)
MODEL_SERVICES = {"agent-loop", "compaction"}  # the services that call models
MODELS_FILE = "/etc/agentstream/models/models.yaml"


def renders(request: pytest.FixtureRequest) -> dict[str, Rendered]:
    return {name: request.getfixturevalue(f"{name}_render") for name in ("default", "full", "hpa")}


def workloads(r: Rendered) -> list[Manifest]:
    return r.of_kind("Deployment") + r.of_kind("StatefulSet")


def component(m: Manifest) -> str:
    return m["metadata"]["labels"]["app.kubernetes.io/component"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------- lint and schema validation


@pytest.mark.parametrize("values", [None, FULL_VALUES], ids=["default", "full"])
def test_helm_lint_strict(helm: str, values: Any) -> None:
    args = [helm, "lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    proc = run(args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", ["default", "full", "hpa"])
def test_rendered_manifests_pass_kubernetes_validate(request: pytest.FixtureRequest, name: str) -> None:
    rendered: Rendered = request.getfixturevalue(f"{name}_render")
    assert rendered.returncode == 0, rendered.stderr
    validator = find_tool("kubernetes-validate")
    proc = run([validator, "--strict", "-k", "1.31.0", "-"], stdin=rendered.stdout, timeout_s=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "ERROR" not in output, output
    # Only the CRDs (KEDA, Prometheus Operator) may be unknown to the bundled schemas.
    for line in output.splitlines():
        if line.startswith("WARN"):
            assert re.search(
                r"kind (ScaledObject|TriggerAuthentication|ServiceMonitor|PodMonitor|PrometheusRule) ", line
            ), line


# ---------------------------------------------------------------- every workload


@pytest.mark.parametrize("name", ["default", "full", "hpa"])
def test_every_workload_has_probes_security_context_and_grace(
    request: pytest.FixtureRequest, name: str, default_values: dict[str, Any], full_values: dict[str, Any]
) -> None:
    rendered: Rendered = request.getfixturevalue(f"{name}_render")
    values = default_values if name == "default" else full_values
    found = workloads(rendered)
    assert found, "no workloads rendered"
    for w in found:
        where = f"{w['kind']} {w['metadata']['name']}"
        pod = w["spec"]["template"]["spec"]
        pod_sc = pod["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, where
        assert pod_sc["runAsUser"] != 0, where
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", where
        assert isinstance(pod.get("terminationGracePeriodSeconds"), int), where
        if component(w) in AGENTSTREAM_COMPONENTS:
            assert pod["terminationGracePeriodSeconds"] == values["shutdownGraceSeconds"] + 5, where
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            cwhere = f"{where} container {c['name']}"
            assert "livenessProbe" in c and "readinessProbe" in c, cwhere
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, cwhere
            assert sc["allowPrivilegeEscalation"] is False, cwhere
            assert sc["capabilities"]["drop"] == ["ALL"], cwhere
            assert sc["runAsNonRoot"] is True, cwhere
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", cwhere
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{cwhere}: /tmp must be an emptyDir"


@pytest.mark.parametrize("name", ["default", "full", "hpa"])
def test_agentstream_containers_probe_the_metrics_port_and_get_their_settings(
    request: pytest.FixtureRequest, name: str, default_values: dict[str, Any], full_values: dict[str, Any]
) -> None:
    rendered: Rendered = request.getfixturevalue(f"{name}_render")
    values = default_values if name == "default" else full_values
    deployments = rendered.of_kind("Deployment")
    assert {component(d) for d in deployments} >= {"agent-loop", "tool-worker"}
    for d in deployments:
        (c,) = d["spec"]["template"]["spec"]["containers"]
        where = d["metadata"]["name"]
        assert c["ports"] == [{"name": "metrics", "containerPort": values["metricsPort"], "protocol": "TCP"}], where
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, where
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, where
        env = env_of(c)
        assert env["AGENTSTREAM_METRICS_PORT"]["value"] == str(values["metricsPort"]), where
        assert env["AGENTSTREAM_SHUTDOWN_GRACE_S"]["value"] == str(values["shutdownGraceSeconds"]), where
        assert env["AGENTSTREAM_NAMESPACE"]["value"] == values["streamNamespace"], where
        assert env["AGENTSTREAM_APP"]["value"] == values["app"], where
        assert env["REDIS_URL"]["value"].startswith(("redis://", "rediss://")), where
        assert c["command"] == ["tini", "--", "agentstream"], where
        service = component(d)
        model_env = {
            n
            for n in env
            if n.startswith(("OPENAI_", "AGENTSTREAM_KEY_", "AGENTSTREAM_MODELS_FILE", "AGENTSTREAM_DEFAULT_MODEL"))
        }
        if service in MODEL_SERVICES:
            assert env["OPENAI_BASE_URL"]["value"] == values["models"][0]["baseUrl"], where
            assert env["OPENAI_MODEL"]["value"] == values["models"][0]["model"], where
        else:  # tool workers (the user's tool code) and delegation never see a model key
            assert not model_env, f"{where}: {model_env}"
        assert c["args"][:4] == ["serve", service, "--app", values["app"]], where
        if service == "tool-worker":
            pool = d["metadata"]["labels"]["agentstream.io/tool-pool"]
            queue = next(p["queue"] for p in values["toolWorkers"]["pools"] if p["name"] == pool)
            assert c["args"][4:6] == ["--queue", queue], where


def test_default_values_run_every_service(default_render: Rendered) -> None:
    # delegation and compaction are needed whenever an agent delegates or compacts: on by default
    components = {component(m) for m in workloads(default_render)}
    assert components == {"agent-loop", "tool-worker", "delegation", "compaction", "redis"}


def test_delegation_and_compaction_can_be_turned_off(render: Any) -> None:
    r = render(values={"delegation": {"enabled": False}, "compaction": {"enabled": False}})
    assert {component(m) for m in r.manifests if m["kind"] in ("Deployment", "Service", "PodDisruptionBudget")} == {
        "agent-loop",
        "tool-worker",
        "redis",
    }


def test_full_values_render_every_service_and_pool(full_render: Rendered, full_values: dict[str, Any]) -> None:
    names = {d["metadata"]["name"] for d in full_render.of_kind("Deployment")}
    pools = [p["name"] for p in full_values["toolWorkers"]["pools"]]
    assert len(pools) == 2
    assert names == {f"{FULLNAME}-{s}" for s in ("agent-loop", "delegation", "compaction")} | {
        f"{FULLNAME}-tool-worker-{p}" for p in pools
    }
    assert not full_render.of_kind("StatefulSet"), "external Redis: no bundled StatefulSet"


def test_each_deployment_has_a_metrics_service_and_a_pdb(request: pytest.FixtureRequest) -> None:
    for name, rendered in renders(request).items():
        services = rendered.of_kind("Service")
        pdbs = rendered.of_kind("PodDisruptionBudget")
        for d in rendered.of_kind("Deployment"):
            pod_labels = d["spec"]["template"]["metadata"]["labels"]
            matching = [s for s in services if s["spec"]["selector"].items() <= pod_labels.items()]
            assert len(matching) == 1, f"{name}: {d['metadata']['name']} has {len(matching)} Services"
            (svc,) = matching
            assert svc["spec"]["ports"][0]["name"] == "metrics"
            assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
            assert svc["metadata"]["labels"]["agentstream.io/metrics"] == "true"
            covering = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()]
            assert len(covering) == 1, f"{name}: {d['metadata']['name']} has {len(covering)} PDBs"


# ---------------------------------------------------------------- Redis


def test_bundled_redis_uses_aof_on_a_volume(default_render: Rendered) -> None:
    (sts,) = default_render.of_kind("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data"] == ["/data"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    host = f"{FULLNAME}-redis.{K8S_NAMESPACE}.svc.cluster.local:6379"
    for d in default_render.of_kind("Deployment"):
        (ac,) = d["spec"]["template"]["spec"]["containers"]
        assert env_of(ac)["REDIS_URL"]["value"] == f"redis://:$(REDIS_PASSWORD)@{host}/0"
    default_render.named("Service", f"{FULLNAME}-redis")


def test_external_redis_url_has_tls_and_the_password_by_reference(full_render: Rendered) -> None:
    for d in full_render.of_kind("Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        env = c["env"]
        names = [e["name"] for e in env]
        assert names.index("REDIS_PASSWORD") < names.index("REDIS_URL"), "$(REDIS_PASSWORD) needs it defined first"
        password = env[names.index("REDIS_PASSWORD")]
        assert password["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "redis-password"}
        url = env[names.index("REDIS_URL")]["value"]
        assert (
            url
            == "rediss://agentstream:$(REDIS_PASSWORD)@redis.example.com:6380/2?ssl_ca_certs=/etc/agentstream/redis-tls/ca.crt"
        )


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("name", ["default", "full", "hpa"])
def test_no_secret_is_inlined(request: pytest.FixtureRequest, name: str) -> None:
    rendered: Rendered = request.getfixturevalue(f"{name}_render")
    # The chart never takes secret values; its one Secret is the bundled Redis' generated password.
    for secret in rendered.of_kind("Secret"):
        assert secret["metadata"]["name"] == f"{FULLNAME}-redis-auth", secret["metadata"]["name"]
    for w in workloads(rendered):
        for c in w["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                where = f"{w['metadata']['name']} env {e['name']}"
                if SECRET_LIKE.search(e["name"]) and e["name"] != "REDIS_USERNAME":
                    assert "value" not in e, f"{where} is inlined"
                    assert "secretKeyRef" in e["valueFrom"], where
                value = e.get("value", "")
                if "://" in value:
                    parts = urlsplit(value)
                    assert parts.password in (None, "$(REDIS_PASSWORD)"), f"{where} carries a password"
    for cm in rendered.of_kind("ConfigMap"):
        for content in cm.get("data", {}).values():
            assert "secretKeyRef" not in content


def container_of(rendered: Rendered, service: str) -> dict[str, Any]:
    (c,) = rendered.named("Deployment", f"{FULLNAME}-{service}")["spec"]["template"]["spec"]["containers"]
    return c


def models_file_of(rendered: Rendered) -> str:
    return rendered.named("ConfigMap", f"{FULLNAME}-models")["data"]["models.yaml"]


def load_rendered_models(rendered: Rendered, tmp_path: Path, environ: dict[str, str]) -> dict[str, Any]:
    """The rendered models file as the services load it (agentstream.models.endpoints)."""
    from agentstream.models.endpoints import load_models_file

    path = tmp_path / "models.yaml"
    path.write_text(models_file_of(rendered))
    return load_models_file(path, environ)


def test_model_keys_come_from_secrets(full_render: Rendered) -> None:
    env = env_of(container_of(full_render, "agent-loop"))
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "model-keys", "key": "openai"}
    assert env["AGENTSTREAM_KEY_LOCAL_SMALL"]["valueFrom"]["secretKeyRef"] == {"name": "model-keys", "key": "local"}
    assert env["AGENTSTREAM_KEY_CLAUDE"]["valueFrom"]["secretKeyRef"] == {"name": "model-keys", "key": "anthropic"}
    assert "AGENTSTREAM_KEY_OLLAMA" not in env, "a model without apiKey.existingSecret sends no key"
    old = [n for n in env if n.startswith("AGENTSTREAM_MODEL_") and n.endswith(("_BASE_URL", "_API_KEY", "_MODEL"))]
    assert not old, f"per-model env vars that nothing reads: {old}"
    assert "secretKeyRef" not in models_file_of(full_render) and "model-keys" not in models_file_of(full_render)


def test_models_file_is_mounted_where_agentstream_models_file_points(
    full_render: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentstream.ops.settings import Settings

    monkeypatch.setenv("AGENTSTREAM_MODELS_FILE", MODELS_FILE)
    assert Settings().models_file == MODELS_FILE, "the variable the Python side reads"
    for service in MODEL_SERVICES:
        d = full_render.named("Deployment", f"{FULLNAME}-{service}")
        pod = d["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert env_of(c)["AGENTSTREAM_MODELS_FILE"]["value"] == MODELS_FILE
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(Path(MODELS_FILE).parent))
        assert mount["readOnly"] is True
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == f"{FULLNAME}-models"
        assert "checksum/models" in d["spec"]["template"]["metadata"]["annotations"]


def test_rendered_models_file_loads_in_agentstream(full_render: Rendered, tmp_path: Path) -> None:
    env = env_of(container_of(full_render, "agent-loop"))
    keys = {n: f"key-of-{n}" for n in env if n.startswith("AGENTSTREAM_KEY_")}
    endpoints = load_rendered_models(full_render, tmp_path, keys)
    assert set(endpoints) == {"local-small", "claude", "ollama"}, "the OpenAI-compatible default goes as OPENAI_*"
    claude = endpoints["claude"]
    assert (claude.provider, claude.base_url, claude.model) == (
        "anthropic",
        "https://api.anthropic.com",
        "claude-sonnet-4-5",
    )
    assert claude.window_tokens == 200000 and claude.thinking_budget_tokens == 2048
    assert claude.api_key is not None and claude.api_key.get_secret_value() == "key-of-AGENTSTREAM_KEY_CLAUDE"
    local = endpoints["local-small"]
    assert (local.window_tokens, local.chars_per_token, local.timeout_s, local.retries) == (32768, 3.5, 60.0, 1)
    assert local.quirks.tool_call_content == "null" and local.quirks.reasoning_field == "reasoning"
    assert dict(local.extra_body) == {"top_k": 20}
    assert endpoints["ollama"].api_key is None and endpoints["ollama"].provider == "openai"


def test_default_model_options_reach_the_default_endpoint(
    full_render: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentstream.models.endpoints import default_endpoint
    from agentstream.ops.settings import Settings

    env = env_of(container_of(full_render, "compaction"))
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"):
        monkeypatch.setenv(name, env[name]["value"])
    endpoint = default_endpoint(Settings())
    assert (endpoint.provider, endpoint.base_url, endpoint.model) == (
        "openai",
        "https://api.openai.com/v1",
        "gpt-4o-mini",
    )
    assert endpoint.window_tokens == 128000
    assert endpoint.quirks.max_tokens_field == "max_completion_tokens"


def test_default_values_need_no_models_file(default_render: Rendered) -> None:
    assert not [cm for cm in default_render.of_kind("ConfigMap") if cm["metadata"]["name"].endswith("-models")]
    env = env_of(container_of(default_render, "agent-loop"))
    assert "AGENTSTREAM_MODELS_FILE" not in env and "AGENTSTREAM_DEFAULT_MODEL_OPTIONS" not in env
    assert env["OPENAI_BASE_URL"]["value"] == "https://api.openai.com/v1"


def test_an_anthropic_default_goes_into_the_models_file(render: Any, tmp_path: Path) -> None:
    models = [
        {
            "id": "default",
            "provider": "anthropic",
            "baseUrl": "https://api.anthropic.com",
            "model": "claude-sonnet-4-5",
            "apiKey": {"existingSecret": "keys", "key": "anthropic"},
        }
    ]
    r = render(values={"models": models})
    env = env_of(container_of(r, "agent-loop"))
    assert not any(n.startswith("OPENAI_") for n in env)
    assert env["AGENTSTREAM_KEY_DEFAULT"]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "anthropic"}
    endpoints = load_rendered_models(r, tmp_path, {"AGENTSTREAM_KEY_DEFAULT": "k"})
    assert endpoints["default"].provider == "anthropic"


def test_inline_tool_schemas_reaches_both_kinds_of_endpoint(
    render: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`inlineToolSchemas` is the endpoint setting `inline_tool_schemas`
    (agentstream.models.endpoints): on the default endpoint it goes in
    AGENTSTREAM_DEFAULT_MODEL_OPTIONS, on another in the models file; off when unset."""
    from agentstream.models.endpoints import default_endpoint
    from agentstream.ops.settings import Settings

    models = [
        {
            "id": "default",
            "baseUrl": "https://gemini.example/v1beta/openai",
            "model": "gemini-2.5-flash",
            "inlineToolSchemas": True,
        },
        {
            "id": "gemini",
            "baseUrl": "https://gemini.example/v1beta/openai",
            "model": "gemini-2.5-pro",
            "inlineToolSchemas": True,
        },
        {"id": "plain", "baseUrl": "https://api.example/v1", "model": "m"},
    ]
    r = render(values={"models": models})
    env = env_of(container_of(r, "agent-loop"))
    for name in ("OPENAI_BASE_URL", "OPENAI_MODEL", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"):
        monkeypatch.setenv(name, env[name]["value"])
    assert default_endpoint(Settings()).inline_tool_schemas is True
    endpoints = load_rendered_models(r, tmp_path, {})
    assert endpoints["gemini"].inline_tool_schemas is True and endpoints["plain"].inline_tool_schemas is False
    refused = render(values={"models": [{**models[0], "inlineToolSchemas": "yes"}]})  # the schema types it
    assert refused.returncode != 0 and "inlineToolSchemas" in refused.stderr


# ---------------------------------------------------------------- autoscaling


def test_keda_scaled_object_per_pool_targets_its_stream_and_group(
    full_render: Rendered, full_values: dict[str, Any]
) -> None:
    ns = full_values["streamNamespace"]
    objects = full_render.of_kind("ScaledObject")
    pools = full_values["toolWorkers"]["pools"]
    assert len(objects) == len(pools)
    (auth,) = full_render.of_kind("TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "redis-auth", "key": "redis-password"},
        {"parameter": "ca", "name": "redis-ca", "key": "ca.crt"},
    ]
    for pool in pools:
        name = f"{FULLNAME}-tool-worker-{pool['name']}"
        so = full_render.named("ScaledObject", name)
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert so["spec"]["scaleTargetRef"]["name"] == name
        deployment = full_render.named("Deployment", name)
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
        triggers = so["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"redis-streams"}
        assert {t["name"] for t in triggers} == {"lag", "pending"}
        for t in triggers:
            md = t["metadata"]
            assert md["stream"] == f"{ns}:tools:{pool['queue']}"
            assert md["consumerGroup"] == "tool-workers"
            assert md["address"] == "redis.example.com:6380"
            assert md["databaseIndex"] == "2"
            assert md["enableTLS"] == "true"
            assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
            assert all(isinstance(v, str) for v in md.values()), "KEDA metadata values are strings"
        lag = next(t for t in triggers if t["name"] == "lag")["metadata"]
        assert lag["lagCount"] == str(pool.get("lagCount", full_values["autoscaling"]["keda"]["lagCount"]))
        pending = next(t for t in triggers if t["name"] == "pending")["metadata"]
        assert "pendingEntriesCount" in pending and "lagCount" not in pending
        assert so["spec"]["minReplicaCount"] == pool.get("minReplicas", full_values["autoscaling"]["minReplicas"])
        assert so["spec"]["maxReplicaCount"] == pool.get("maxReplicas", full_values["autoscaling"]["maxReplicas"])
    assert not full_render.of_kind("HorizontalPodAutoscaler")


def test_keda_on_bundled_redis_dials_the_fully_qualified_service(render: Any) -> None:
    r = render(values={"autoscaling": {"keda": {"enabled": True}}})
    (so,) = r.of_kind("ScaledObject")
    for t in so["spec"]["triggers"]:
        assert t["metadata"]["address"] == f"{FULLNAME}-redis.{K8S_NAMESPACE}.svc.cluster.local:6379"
        assert t["metadata"]["stream"] == "agentstream:tools:default"
        assert "enableTLS" not in t["metadata"]
        assert t["authenticationRef"]["name"] == f"{FULLNAME}-redis-auth"
    (auth,) = r.of_kind("TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": f"{FULLNAME}-redis-auth", "key": "redis-password"}
    ]


def test_hpa_is_the_alternative_to_keda(hpa_render: Rendered, full_values: dict[str, Any]) -> None:
    assert not hpa_render.of_kind("ScaledObject")
    hpas = hpa_render.of_kind("HorizontalPodAutoscaler")
    assert len(hpas) == len(full_values["toolWorkers"]["pools"])
    for h in hpas:
        assert h["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert h["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        hpa_render.named("Deployment", h["spec"]["scaleTargetRef"]["name"])


def test_without_autoscaler_deployments_carry_replicas(default_render: Rendered) -> None:
    for d in default_render.of_kind("Deployment"):
        assert d["spec"]["replicas"] == 1


# ---------------------------------------------------------------- monitoring, network, prompts


def test_service_monitor_selects_the_metrics_services(full_render: Rendered) -> None:
    (sm,) = full_render.of_kind("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = sm["spec"]["selector"]["matchLabels"]
    selected = [s for s in full_render.of_kind("Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert len(selected) == len(full_render.of_kind("Deployment"))
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_grafana_dashboard_configmap(full_render: Rendered) -> None:
    import json

    cm = full_render.named("ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["agentstream.json"])
    assert dashboard["uid"] == "agentstream-overview"


def test_network_policies(full_render: Rendered, render: Any) -> None:
    (np,) = full_render.of_kind("NetworkPolicy")
    assert np["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    bundled = render(values={"networkPolicy": {"enabled": True}, "autoscaling": {"keda": {"enabled": True}}})
    redis_np = bundled.named("NetworkPolicy", f"{FULLNAME}-redis")
    peers = redis_np["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers


def test_prompts_configmap_is_mounted(full_render: Rendered) -> None:
    from agentstream.declarations.prompts import PROMPTS_DIR_ENV  # the variable the Python side reads

    cm = full_render.named("ConfigMap", f"{FULLNAME}-prompts")
    assert "demo.yaml" in cm["data"]
    for d in full_render.of_kind("Deployment"):
        pod = d["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/agentstream/prompts")
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == cm["metadata"]["name"]
        assert env_of(c)[PROMPTS_DIR_ENV]["value"] == "/etc/agentstream/prompts"
        assert "checksum/prompts" in d["spec"]["template"]["metadata"]["annotations"]
