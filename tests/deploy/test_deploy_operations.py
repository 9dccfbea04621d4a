"""What an operator expects of the chart beyond the basics (issue 15), each checked on the
rendered manifests: the root-user guard, unique names under long release and pool names, KEDA's
pending-entries target from the pool's concurrency, fallback/behavior/TLS CA, the `helm test`
hook, startupProbe, the PrometheusRule and PodMonitor, the bundled Redis secure by default, pod
placement settings, the typed podSecurityContext; and the compose file, image and lock file.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import CHART, K8S_NAMESPACE, REPO, Render, Rendered, find_tool, run

FULLNAME = "t-agentstream"
AGENTSTREAM_COMPONENTS = {"agent-loop", "tool-worker", "delegation", "compaction"}


def containers(r: Rendered) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(d, c) for d in r.of_kind("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]


# ---------------------------------------------------------------- the root-user guard


@pytest.mark.parametrize(
    "values, message",
    [
        ({"podSecurityContext": {"runAsUser": 0}}, "podSecurityContext.runAsUser is 0 (root)"),
        ({"containerSecurityContext": {"runAsUser": 0}}, "containerSecurityContext.runAsUser is 0 (root)"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "podSecurityContext.runAsNonRoot is false"),
    ],
    ids=["pod uid 0", "container uid 0", "runAsNonRoot false"],
)
def test_root_user_is_refused_with_uid_zero(render: Render, values: dict[str, Any], message: str) -> None:
    r = render(values=values)
    assert r.returncode != 0, "rendered a pod that runs as root"
    assert message in r.stderr, r.stderr


def test_a_non_root_uid_renders(render: Render) -> None:
    r = render(values={"podSecurityContext": {"runAsUser": 20000, "runAsGroup": 20000}})
    for d, _ in containers(r):
        assert d["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 20000


@pytest.mark.parametrize(
    "values",
    [
        {"podSecurityContext": {"runAsUser": "0"}},
        {"podSecurityContext": {"runAsUsr": 10001}},
        {"podSecurityContext": {"seccompProfile": {"type": "Sometimes"}}},
        {"podSecurityContext": {"fsGroupChangePolicy": "Never"}},
    ],
    ids=["uid as a string", "misspelt key", "unknown seccomp type", "bad fsGroupChangePolicy"],
)
def test_pod_security_context_is_typed(render: Render, values: dict[str, Any]) -> None:
    r = render(values=values)
    assert r.returncode != 0 and "podSecurityContext" in r.stderr, r.stderr


# ---------------------------------------------------------------- names


LONG_RELEASE = "a-very-long-release-name-for-the-agents-abc"  # 43 characters
SIMILAR_POOLS = [{"name": "browser-heavy-one", "queue": "one"}, {"name": "browser-heavy-two", "queue": "two"}]


@pytest.fixture(scope="module")
def long_render(helm: str) -> Rendered:
    assert len(LONG_RELEASE) == 43
    values = {
        "toolWorkers": {"pools": SIMILAR_POOLS},
        "autoscaling": {"keda": {"enabled": True}},
        "monitoring": {"prometheusRule": {"enabled": True}, "podMonitor": {"enabled": True}},
    }
    path = Path(run(["mktemp", "--suffix=.yaml"]).stdout.strip())
    path.write_text(yaml.safe_dump(values))
    proc = run([helm, "template", LONG_RELEASE, str(CHART), "--namespace", K8S_NAMESPACE, "-f", str(path)])
    path.unlink()
    return Rendered(proc.returncode, proc.stdout, proc.stderr)


def test_names_stay_unique_and_short_with_a_long_release_and_similar_pools(long_render: Rendered) -> None:
    manifests = long_render.manifests
    names = Counter((m["kind"], m["metadata"]["name"]) for m in manifests)
    duplicates = [n for n, count in names.items() if count > 1]
    assert not duplicates, f"two resources share a name: {duplicates}"
    for kind, name in names:
        assert len(name) <= 63, f"{kind} {name} has {len(name)} characters"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), f"{kind} {name} is not a DNS label"
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "ScaledObject"):
        pools = [m for m in long_render.of_kind(kind) if m["metadata"]["labels"].get("agentstream.io/tool-pool")]
        assert len({m["metadata"]["name"] for m in pools}) == 2, f"the two pools' {kind}s must differ"


def test_long_names_keep_their_references(long_render: Rendered) -> None:
    (sts,) = long_render.of_kind("StatefulSet")
    # the controller labels pods controller-revision-hash=<name>-<10 characters>: at most 63
    assert len(sts["metadata"]["name"]) <= 52
    services = {s["metadata"]["name"]: s for s in long_render.of_kind("Service")}
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and len(headless["metadata"]["name"]) <= 63
    assert sts["metadata"]["name"] in services, "the client Service and the StatefulSet share the name"
    deployments = {d["metadata"]["name"] for d in long_render.of_kind("Deployment")}
    for so in long_render.of_kind("ScaledObject"):
        assert so["spec"]["scaleTargetRef"]["name"] == so["metadata"]["name"] in deployments
    url = next(e["value"] for _, c in containers(long_render) for e in c["env"] if e["name"] == "REDIS_URL")
    assert f"@{sts['metadata']['name']}.{K8S_NAMESPACE}.svc.cluster.local:6379/" in url


def test_short_names_are_kept_whole(default_render: Rendered) -> None:
    names = {d["metadata"]["name"] for d in default_render.of_kind("Deployment")}
    assert f"{FULLNAME}-tool-worker-default" in names
    default_render.named("Service", f"{FULLNAME}-redis-headless")


# ---------------------------------------------------------------- autoscaling


def pending_target(so: dict[str, Any]) -> str:
    (t,) = [t for t in so["spec"]["triggers"] if t["name"] == "pending"]
    return t["metadata"]["pendingEntriesCount"]


def test_keda_pending_target_is_the_pools_concurrency(full_render: Rendered) -> None:
    default_pool = full_render.named("ScaledObject", f"{FULLNAME}-tool-worker-default")
    browser = full_render.named("ScaledObject", f"{FULLNAME}-tool-worker-browser")
    assert pending_target(default_pool) == "64", "toolWorkers.concurrency's default: 64 jobs per pod"
    assert pending_target(browser) == "4", "the pool's own concurrency"
    for name, want in (("default", "64"), ("browser", "4")):
        (c,) = full_render.named("Deployment", f"{FULLNAME}-tool-worker-{name}")["spec"]["template"]["spec"][
            "containers"
        ]
        env = {e["name"]: e for e in c["env"]}
        assert env["AGENTSTREAM_CONCURRENCY"]["value"] == want, "the pods run as many jobs as the target assumes"


def test_keda_pending_trigger_can_be_turned_off(render: Render) -> None:
    r = render(values={"autoscaling": {"keda": {"enabled": True, "pendingTrigger": False}}})
    (so,) = r.of_kind("ScaledObject")
    assert [t["name"] for t in so["spec"]["triggers"]] == ["lag"]


def test_keda_fallback_and_behavior(full_render: Rendered, full_values: dict[str, Any]) -> None:
    for so in full_render.of_kind("ScaledObject"):
        assert so["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 2}
        behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior == full_values["autoscaling"]["behavior"]


def test_hpa_behavior(render: Render) -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 300}}
    r = render(values={"autoscaling": {"hpa": {"enabled": True}, "behavior": behavior}})
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["behavior"] == behavior
    (so_default,) = render(values={"autoscaling": {"keda": {"enabled": True}}}).of_kind("ScaledObject")
    assert "fallback" not in so_default["spec"] and "advanced" not in so_default["spec"]


def test_redis_tls_ca_reaches_the_scaler_and_the_pods(full_render: Rendered) -> None:
    (auth,) = full_render.of_kind("TriggerAuthentication")
    assert {"parameter": "ca", "name": "redis-ca", "key": "ca.crt"} in auth["spec"]["secretTargetRef"]
    for so in full_render.of_kind("ScaledObject"):
        for t in so["spec"]["triggers"]:
            assert t["metadata"]["enableTLS"] == "true" and t["authenticationRef"]["name"] == auth["metadata"]["name"]
    for d, c in containers(full_render):
        url = next(e["value"] for e in c["env"] if e["name"] == "REDIS_URL")
        assert url.endswith("?ssl_ca_certs=/etc/agentstream/redis-tls/ca.crt"), url
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["redis-tls"]["mountPath"] == "/etc/agentstream/redis-tls"
        volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert volumes["redis-tls"]["secret"] == {
            "secretName": "redis-ca",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }


def test_redis_py_reads_the_ca_from_the_rendered_url(full_render: Rendered) -> None:
    from redis.connection import parse_url

    (_, c), *_ = containers(full_render)
    url = next(e["value"] for e in c["env"] if e["name"] == "REDIS_URL").replace("$(REDIS_PASSWORD)", "pw")
    kwargs = parse_url(url)
    assert kwargs["ssl_ca_certs"] == "/etc/agentstream/redis-tls/ca.crt"
    assert kwargs["password"] == "pw" and kwargs["db"] == 2


@pytest.mark.parametrize(
    "values, message",
    [
        ({"redis": {"bundled": {"maxmemoryPolicy": "allkeys-lru"}}}, "would let Redis delete keys"),
        (
            {"redis": {"external": {"tlsCA": {"existingSecret": "ca"}}}},
            "tlsCA.existingSecret needs redis.external.tls=true",
        ),
        (
            {"redis": {"bundled": {"extraArgs": ["--maxmemory-policy", "allkeys-lru"]}}},
            'extraArgs[0] "--maxmemory-policy" sets --maxmemory-policy, which the chart sets itself',
        ),
        (
            {"redis": {"bundled": {"extraArgs": ["--maxclients", "100", "--MAXMEMORY-POLICY volatile-lru"]}}},
            'extraArgs[2] "--MAXMEMORY-POLICY volatile-lru" sets --maxmemory-policy',
        ),
        ({"redis": {"bundled": {"extraArgs": ["--maxmemory", "4gb"]}}}, "use redis.bundled.maxmemory instead"),
        ({"redis": {"bundled": {"extraArgs": ["--appendonly", "no"]}}}, "sets --appendonly"),
        ({"redis": {"bundled": {"extraArgs": ["--save", "60 1"]}}}, "sets --save"),
        ({"redis": {"bundled": {"extraArgs": ["--requirepass", "x"]}}}, "use redis.auth.existingSecret instead"),
        ({"redis": {"bundled": {"maxmemory": "600mb"}}}, "maxmemory 600mb is not below the Redis container's memory"),
        ({"redis": {"bundled": {"maxmemory": "512mb"}}}, "maxmemory 512mb is not below"),  # 512 MiB = the limit
        (
            {"redis": {"bundled": {"maxmemory": "1gb", "resources": {"limits": {"memory": "1G"}}}}},
            "maxmemory 1gb is not below the Redis container's memory limit 1G",  # 1 GiB > 10^9 bytes
        ),
        ({"redis": {"bundled": {"maxmemory": ""}}}, "redis.bundled.maxmemory is empty (no limit)"),
        (
            {"redis": {"bundled": {"resources": {"limits": {"memory": "half a gig"}}}}},
            'limits.memory "half a gig": cannot read it as a memory size',
        ),
    ],
    ids=[
        "evicting policy",
        "ca without tls",
        "evicting policy in extraArgs",
        "one-argument form in any case",
        "maxmemory in extraArgs",
        "appendonly off",
        "rdb snapshots",
        "password",
        "maxmemory above the limit",
        "maxmemory at the limit",
        "binary and decimal units",
        "no maxmemory under a limit",
        "unreadable limit",
    ],
)
def test_unsafe_redis_settings_are_refused(render: Render, values: dict[str, Any], message: str) -> None:
    r = render(values=values)
    assert r.returncode != 0 and message in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("bundled", "maxmemory"),
    [
        ({"maxmemory": "500mb"}, "500mb"),  # below 512Mi
        ({"maxmemory": "1gb", "resources": {"limits": {"memory": "1.5Gi"}}}, "1gb"),
        ({"maxmemory": "900mb", "resources": {"limits": {"memory": "1G"}}}, "900mb"),  # 943718400 < 10^9
        ({"maxmemory": "", "resources": {"limits": {"memory": None}}}, None),  # no limit at all (null removes it)
        ({"extraArgs": ["--maxclients", "2000", "--hz", "20"]}, "400mb"),  # others pass through
    ],
)
def test_safe_redis_memory_settings_render(render: Render, bundled: dict[str, Any], maxmemory: str | None) -> None:
    r = render(values={"redis": {"bundled": bundled}})
    assert r.returncode == 0, r.stderr
    (sts,) = r.of_kind("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert (args[args.index("--maxmemory") + 1] if "--maxmemory" in args else None) == maxmemory
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    for extra in bundled.get("extraArgs", []):
        assert extra in args


# ---------------------------------------------------------------- probes, tests, monitoring


@pytest.mark.parametrize("name", ["default", "full"])
def test_every_agentstream_container_has_a_startup_probe(request: pytest.FixtureRequest, name: str) -> None:
    rendered: Rendered = request.getfixturevalue(f"{name}_render")
    for d, c in containers(rendered):
        probe = c["startupProbe"]
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}, d["metadata"]["name"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 60, "a slow import is given a minute or more"


def test_helm_test_hook_publishes_a_turn_and_waits_for_its_reply(default_render: Rendered) -> None:
    pod = default_render.named("Pod", f"{FULLNAME}-test-turn")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python", "/etc/agentstream/test/turn_test.py"]
    env = {e["name"]: e for e in c["env"]}
    names = [e["name"] for e in c["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("REDIS_URL")
    assert env["TEST_AGENT"]["value"] == "demo" and env["AGENTSTREAM_NAMESPACE"]["value"] == "agentstream"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    cm = default_render.named("ConfigMap", f"{FULLNAME}-test-turn")
    assert cm["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert cm["data"]["turn_test.py"] == (CHART / "files" / "turn_test.py").read_text()
    # the bundled Redis' NetworkPolicy admits it (the release's agentstream labels)
    policy = default_render.named("NetworkPolicy", f"{FULLNAME}-redis")
    admitted = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in admitted.items())


def test_helm_test_hook_can_be_turned_off(render: Render) -> None:
    r = render(values={"tests": {"enabled": False}})
    assert not r.of_kind("Pod")


def _metric_names() -> set[str]:
    from agentstream.ops import metrics

    names = set()
    for value in vars(metrics).values():
        for attr in ("_name",):
            name = getattr(value, attr, None)
            if isinstance(name, str) and name.startswith("agentstream_"):
                kind = getattr(value, "_type", "")
                names.add(name + ("_total" if kind == "counter" and not name.endswith("_total") else ""))
    return names


def test_prometheus_rule_alerts_on_what_operators_watch(full_render: Rendered) -> None:
    (rule,) = full_render.of_kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert {
        "AgentstreamDeadLetters",
        "AgentstreamConsumerLag",
        "AgentstreamTurnsFailing",
        "AgentstreamNoConsumer",
    } <= set(alerts)
    known = _metric_names()
    for name, r in alerts.items():
        used = set(re.findall(r"\bagentstream_[a-z_]+", r["expr"]))
        assert used and used <= known, f"{name} queries metrics the services do not export: {used - known}"
        assert r["annotations"]["summary"] and r["labels"]["severity"]
        assert r["expr"].count("(") == r["expr"].count(")"), name
    assert "> 100" in alerts["AgentstreamConsumerLag"]["expr"]
    assert 'code!="cancelled"' in alerts["AgentstreamTurnsFailing"]["expr"]
    assert "agentstream_stream_consumers" in alerts["AgentstreamNoConsumer"]["expr"]


def test_pod_monitor_scrapes_the_agentstream_pods(full_render: Rendered) -> None:
    (pm,) = full_render.of_kind("PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    selected = pm["spec"]["selector"]["matchExpressions"][0]["values"]
    assert set(selected) == AGENTSTREAM_COMPONENTS | {"gateway"}


# ---------------------------------------------------------------- the bundled Redis, secure by default


def test_bundled_redis_is_secure_by_default(default_render: Rendered) -> None:
    (secret,) = default_render.of_kind("Secret")
    assert secret["metadata"]["name"] == f"{FULLNAME}-redis-auth"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    import base64

    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password), "random and URL-safe"
    (sts,) = default_render.of_kind("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--protected-mode") + 1] == "yes"
    assert args[args.index("--maxmemory") + 1] == "400mb"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    env = {e["name"]: e for e in c["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    for _d, ac in containers(default_render):
        aenv = {e["name"]: e for e in ac["env"]}
        assert aenv["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": "redis-password",
        }
    assert default_render.named("NetworkPolicy", f"{FULLNAME}-redis"), "network policies are on by default"


def test_an_existing_secret_replaces_the_generated_password(render: Render) -> None:
    r = render(values={"redis": {"auth": {"existingSecret": "mine", "existingSecretPasswordKey": "pw"}}})
    assert not r.of_kind("Secret")
    (sts,) = r.of_kind("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e for e in c["env"]}["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "mine",
        "key": "pw",
    }


def test_redis_memory_limit_is_above_maxmemory(default_values: dict[str, Any]) -> None:
    bundled = default_values["redis"]["bundled"]
    limit_mi = int(bundled["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert int(bundled["maxmemory"].removesuffix("mb")) < limit_mi * 0.9, "room for the AOF rewrite's copy-on-write"


# ---------------------------------------------------------------- pod placement and environment


def test_priority_class_spread_and_env_from(full_render: Rendered) -> None:
    for d, c in containers(full_render):
        pod = d["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "agents-high"
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["labelSelector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"], "spreads its own pods"
        assert c["envFrom"] == [{"secretRef": {"name": "tool-credentials"}}]


def test_placement_settings_are_absent_by_default(default_render: Rendered) -> None:
    for d, c in containers(default_render):
        pod = d["spec"]["template"]["spec"]
        assert "priorityClassName" not in pod and "topologySpreadConstraints" not in pod and "envFrom" not in c


# ---------------------------------------------------------------- compose, image, lock file


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    proc = run([find_tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config"])
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_pins_redis_limits_memory_and_builds_one_image(compose: dict[str, Any]) -> None:
    services = compose["services"]
    image = services["redis"]["image"]
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+(-[a-z0-9]+)?", image), f"{image} is not a pinned version"
    for name, svc in services.items():
        assert svc.get("mem_limit"), f"{name} has no memory limit"
    command = services["redis"]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    built = [name for name, svc in services.items() if "build" in svc]
    assert built == ["agent-loop"], f"one image built once, not per service: {built}"
    images = {svc["image"] for name, svc in services.items() if name != "redis"}
    assert images == {"agentstream:local"}
    for name, svc in services.items():
        if name not in ("redis", "agent-loop"):
            assert "agent-loop" in svc["depends_on"], f"{name} must start after the image is built"


def test_image_has_tini_oci_labels_and_installs_from_the_lock_file() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for label in ("source", "version", "revision"):
        assert f"org.opencontainers.image.{label}=" in dockerfile
    assert re.search(r"apt-get install -y --no-install-recommends tini=\S+", dockerfile)
    assert "pip install --require-hashes --no-deps -r requirements.lock" in dockerfile
    assert 'pip install --no-deps ".[otel,mcp]"' in dockerfile


def test_lock_file_pins_every_dependency_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = (
        project["dependencies"] + project["optional-dependencies"]["otel"] + project["optional-dependencies"]["mcp"]
    )
    lock = (REPO / "requirements.lock").read_text()
    pinned = {
        m.group(1).lower().replace("_", "-"): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.M)
    }
    for requirement in wanted:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
        assert name in pinned, f"{name} (pyproject.toml) is not in requirements.lock: run scripts/lock"
    entries = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", lock.split("\n", 7)[-1])
    for entry in entries:
        if "==" in entry.split("\n")[0]:
            assert "--hash=sha256:" in entry, f"no hash for {entry.splitlines()[0]}"
