"""The chart's HTTP gateway (off by default): its Deployment, Service, PDB, Ingress with TLS and
network policy; its keys file from a Secret; the models' settings without any model key."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.deploy_support import FULL_VALUES, Rendered, find_tool, run

FULLNAME = "t-agentstream-gateway"
ON = {"gateway": {"enabled": True, "keys": {"existingSecret": "gateway-keys"}}}
TLS = {
    "gateway": {
        **ON["gateway"],
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-buffering": "off"},
            "hosts": [{"host": "agents.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
            "tls": [{"secretName": "agents-tls", "hosts": ["agents.example.com"]}],
        },
    },
    "networkPolicy": {"enabled": True},
}


@pytest.fixture(scope="module")
def gateway_render(render: Any) -> Rendered:
    return render(FULL_VALUES, values=TLS)


def _container(rendered: Rendered) -> dict[str, Any]:
    (c,) = rendered.named("Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"]
    return c


def test_off_by_default(default_render: Rendered, full_render: Rendered) -> None:
    for rendered in (default_render, full_render):
        assert not [
            m for m in rendered.manifests if m["metadata"]["labels"].get("app.kubernetes.io/component") == "gateway"
        ]


def test_on_without_a_keys_secret_fails_to_render(render: Any) -> None:
    r = render(values={"gateway": {"enabled": True}})
    assert r.returncode != 0 and "gateway.keys.existingSecret" in r.stderr


def test_the_gateway_deployment(gateway_render: Rendered, full_values: dict[str, Any]) -> None:
    deployment = gateway_render.named("Deployment", FULLNAME)
    pod = deployment["spec"]["template"]["spec"]
    c = _container(gateway_render)
    assert deployment["spec"]["replicas"] == 2
    assert c["args"] == ["serve", "gateway", "--app", full_values["app"]]
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": full_values["metricsPort"], "protocol": "TCP"},
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] == full_values["shutdownGraceSeconds"] + 5
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert env["AGENTSTREAM_GATEWAY_KEYS_FILE"]["value"] == mounts["keys"]["mountPath"] + "/keys.yaml"
    assert volumes["keys"]["secret"] == {
        "secretName": "gateway-keys",
        "items": [{"key": "keys.yaml", "path": "keys.yaml"}],
    }
    assert env["AGENTSTREAM_GATEWAY_RATE_LIMIT_PER_MIN"]["value"] == "600"
    assert env["AGENTSTREAM_GATEWAY_CORS_ORIGINS"]["value"] == ""
    assert env["AGENTSTREAM_METRICS_PORT"]["value"] == str(full_values["metricsPort"])
    # the endpoints' settings for explain, never a key
    assert env["OPENAI_BASE_URL"]["value"] == full_values["models"][0]["baseUrl"]
    assert env["AGENTSTREAM_MODELS_FILE"]["value"] == mounts["models"]["mountPath"] + "/models.yaml"
    assert not [
        n
        for n in env
        if n.endswith("API_KEY")
        or n.startswith("AGENTSTREAM_KEY_")
        or "valueFrom" in env[n]
        and "secretKeyRef" in env[n]["valueFrom"]
        and n != "REDIS_PASSWORD"
    ]


def test_service_pdb_ingress_with_tls_and_network_policy(gateway_render: Rendered) -> None:
    service = gateway_render.named("Service", FULLNAME)
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("metrics", 9464, "metrics"),
        ("http", 80, "http"),
    ]
    assert service["metadata"]["labels"]["agentstream.io/metrics"] == "true"
    assert gateway_render.named("PodDisruptionBudget", FULLNAME)["spec"]["maxUnavailable"] == 1
    ingress = gateway_render.named("Ingress", FULLNAME)
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "agents-tls", "hosts": ["agents.example.com"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "agents.example.com"
    assert rule["http"]["paths"][0]["backend"] == {"service": {"name": FULLNAME, "port": {"name": "http"}}}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    # the Ingress caps bodies as the gateway does (issue 33: a 400 MB body reached the gateway)
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == "1048576"
    (gateway_container,) = gateway_render.named("Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"]
    assert {"name": "AGENTSTREAM_GATEWAY_MAX_BODY_BYTES", "value": "1048576"} in gateway_container["env"]
    policy = gateway_render.named("NetworkPolicy", FULLNAME)
    assert [p["ports"][0]["port"] for p in policy["spec"]["ingress"]] == ["http", "metrics"]


def test_gateway_manifests_pass_kubernetes_validate(gateway_render: Rendered) -> None:
    proc = run(
        [find_tool("kubernetes-validate"), "--strict", "-k", "1.31.0", "-"], stdin=gateway_render.stdout, timeout_s=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_lint_strict_with_the_gateway(helm: str, tmp_path) -> None:
    import yaml

    values = tmp_path / "gateway.yaml"
    values.write_text(yaml.safe_dump(TLS))
    proc = run([helm, "lint", "--strict", str(FULL_VALUES.parent.parent), "-f", str(FULL_VALUES), "-f", str(values)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- docker-compose


def test_compose_runs_the_gateway_with_its_keys_file_and_no_model_key() -> None:
    import yaml

    from tests.deploy.deploy_support import REPO

    proc = run([find_tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config"])
    assert proc.returncode == 0, proc.stderr
    gateway = yaml.safe_load(proc.stdout)["services"]["gateway"]
    assert "profiles" not in gateway, "enabled in compose"
    assert gateway["command"][:2] == ["serve", "gateway"]
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(gateway["healthcheck"]["test"])
    env = gateway["environment"]
    assert env["AGENTSTREAM_GATEWAY_KEYS_FILE"] == "/etc/agentstream/gateway/keys.yaml"
    assert f"{REPO / 'deploy' / 'gateway'}:/etc/agentstream/gateway:ro" in gateway["volumes"]
    assert not [v for v in env if v.endswith("_API_KEY")], "the gateway calls no model"
    assert {"OPENAI_BASE_URL", "OPENAI_MODEL", "AGENTSTREAM_MODELS_FILE"} <= set(env)
    (port,) = gateway["ports"]
    assert (
        port["host_ip"] == "127.0.0.1" and port["target"] == 8080
        if isinstance(port, dict)
        else port.startswith("127.0.0.1:")
    )


def test_notes_tell_where_the_gateway_is(helm: str, tmp_path) -> None:
    import yaml

    from tests.deploy.test_deploy_values import render_notes

    values = tmp_path / "gateway.yaml"
    values.write_text(yaml.safe_dump(TLS))
    notes = render_notes(helm, tmp_path, values)
    assert "https://agents.example.com/" in notes
    assert f"port-forward svc/{FULLNAME} 8080:80" in notes and "/v1/conversations" in notes
    assert "gateway" not in render_notes(helm, tmp_path / "off")


LIMIT_VALUES = {  # chart value → (its GatewaySettings field, a value unlike the default)
    "maxBodyBytes": ("max_body_bytes", 2_097_152),
    "maxWaitSeconds": ("max_wait_s", 30),
    "ssePingSeconds": ("sse_ping_s", 7.5),
    "headerTimeoutSeconds": ("header_timeout_s", 4),
    "idleTimeoutSeconds": ("idle_timeout_s", 2.5),
    "maxConnections": ("max_connections", 300),
    "maxHeaderBytes": ("max_header_bytes", 8192),
    "maxStreams": ("max_streams", 64),
    "maxStreamsPerKey": ("max_streams_per_key", 4),
}


def test_every_gateway_limit_is_a_chart_value_that_reaches_its_setting(render: Any, monkeypatch) -> None:
    """Issue 33: the gateway's limits (body size, streams per key and replica, timeouts,
    connections) are chart values, their defaults the gateway's own, and each reaches the setting."""
    import yaml

    from agentstream_services.gateway.settings import GatewaySettings
    from tests.deploy.deploy_support import CHART

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]
    for value, (setting, _) in LIMIT_VALUES.items():
        assert defaults[value] == GatewaySettings.model_fields[setting].default, value
    rendered = render(values={"gateway": {**ON["gateway"], **{k: v for k, (_, v) in LIMIT_VALUES.items()}}})
    env = {e["name"]: e["value"] for e in _container(rendered)["env"] if "value" in e}
    for name in [n for n in env if n.startswith("AGENTSTREAM_GATEWAY_") and n != "AGENTSTREAM_GATEWAY_KEYS_FILE"]:
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("AGENTSTREAM_GATEWAY_KEYS", "keys: []")
    settings = GatewaySettings()
    for value, (setting, wanted) in LIMIT_VALUES.items():
        assert getattr(settings, setting) == wanted, value
    assert ingress_cap(render, 2_097_152) == "2097152"


def ingress_cap(render: Any, body_bytes: int) -> str:
    """The Ingress's body cap when gateway.maxBodyBytes is ``body_bytes``."""
    rendered = render(
        values={"gateway": {**TLS["gateway"], "maxBodyBytes": body_bytes}, "networkPolicy": {"enabled": True}}
    )
    return rendered.named("Ingress", FULLNAME)["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
