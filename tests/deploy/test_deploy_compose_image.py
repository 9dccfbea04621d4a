"""docker-compose.yml validates and has what a laptop needs; the Dockerfile lints and runs any
service as a non-root user with a health check; the Grafana dashboard queries every agentstream
metric. Nothing runs in containers here (no Docker engine): the files are validated, not started.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import CHART, REPO, find_tool, run

COMPOSE = REPO / "docker-compose.yml"
AGENTSTREAM_SERVICES = ("agent-loop", "tool-worker", "delegation", "compaction")

METRICS = (
    "agentstream_turns_started_total",
    "agentstream_turns_ended_total",
    "agentstream_turns_failed_total",
    "agentstream_turns_cancelled_total",
    "agentstream_turns_rejected_total",
    "agentstream_step_seconds",
    "agentstream_model_call_seconds",
    "agentstream_model_tokens_total",
    "agentstream_tool_call_seconds",
    "agentstream_tool_errors_total",
    "agentstream_stream_length",
    "agentstream_pending_entries",
    "agentstream_consumer_lag",
    "agentstream_reclaims_total",
    "agentstream_dead_letters_total",
    "agentstream_compactions_total",
    "agentstream_delegations_total",
    "agentstream_late_results_total",
    "agentstream_lost_entries_total",
    "agentstream_tool_outcomes_unknown_total",
    "agentstream_trimmed_entries_total",
    "agentstream_model_errors_total",
    "agentstream_model_retries_total",
    "agentstream_model_text_tool_calls_total",
    "agentstream_handlers_in_flight",
    "agentstream_stream_consumers",
    "agentstream_build_info",
    "agentstream_stream_observed_timestamp_seconds",
    "agentstream_mcp_sessions_total",
    "agentstream_mcp_server_up",
    "agentstream_mcp_tools_refused",
    "agentstream_gateway_requests_total",
    "agentstream_gateway_request_seconds",
    "agentstream_gateway_turns_total",
    "agentstream_gateway_unauthorized_total",
    "agentstream_gateway_rate_limited_total",
    "agentstream_gateway_streams_open",
)


# ---------------------------------------------------------------- docker-compose.yml


MODEL_SERVICES = ("agent-loop", "compaction")  # the services that call models
MODEL_VARS = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "AGENTSTREAM_MODELS_FILE",
    "AGENTSTREAM_DEFAULT_MODEL_OPTIONS",
)


def test_docker_compose_config_is_valid() -> None:
    proc = run([find_tool("docker-compose"), "-f", str(COMPOSE), "config", "-q"])
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors merged, ${VAR:-default}s filled in)."""
    proc = run([find_tool("docker-compose"), "-f", str(COMPOSE), "config"])
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_redis_persists_with_aof(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    # A named volume (declared at the top level) at /data, where the AOF lives.
    (volume,) = [v.split(":")[0] for v in redis["volumes"] if v.endswith(":/data") or v.endswith(":/data:rw")]
    assert volume in compose["volumes"]
    assert "test" in redis["healthcheck"]


def test_compose_services_wait_for_redis_and_check_health(compose: dict[str, Any]) -> None:
    for name in AGENTSTREAM_SERVICES:
        svc = compose["services"][name]
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert "/healthz" in " ".join(svc["healthcheck"]["test"]), name
        env = svc["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
        assert "AGENTSTREAM_METRICS_PORT" in env, name
        if name in MODEL_SERVICES:
            for var in MODEL_VARS:
                assert var in env, f"{name}: {var}"
        else:  # tool workers (the user's tool code) and delegation never see a model key
            assert not [v for v in env if v in MODEL_VARS or v.endswith("_API_KEY")], name
        assert svc["command"][:2] == ["serve", name], name
        assert svc["command"][2] == "--app", name


def test_compose_tool_worker_is_scalable(compose: dict[str, Any]) -> None:
    worker = compose["services"]["tool-worker"]
    assert "container_name" not in worker
    assert "ports" not in worker, "a fixed host port would stop --scale tool-worker=3"
    assert worker["command"][-2:] == ["--queue", "default"]


def test_compose_model_settings_come_from_the_environment() -> None:
    text = COMPOSE.read_text()
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        assert re.search(rf"\$\{{{var}:-[^}}]*\}}", text), f"{var} must come from the environment with a default"


def test_compose_up_starts_every_service(compose: dict[str, Any]) -> None:
    # delegation and compaction are needed whenever an agent delegates or compacts: no profile
    raw = yaml.safe_load(COMPOSE.read_text())
    for name in ("redis", *AGENTSTREAM_SERVICES):
        assert "profiles" not in raw["services"][name], name
    assert set(compose["services"]) == {"redis", *AGENTSTREAM_SERVICES, "gateway"}  # the gateway: test_deploy_gateway


def test_compose_mounts_an_optional_models_file(compose: dict[str, Any]) -> None:
    for name in MODEL_SERVICES:
        svc = compose["services"][name]
        assert svc["environment"]["AGENTSTREAM_MODELS_FILE"] == "", f"{name}: no models file unless asked for"
        mounts = [v for v in svc["volumes"] if ":/etc/agentstream/models" in v]
        assert mounts == [f"{REPO / 'deploy' / 'models'}:/etc/agentstream/models:ro"], name
    assert re.search(r"\$\{AGENTSTREAM_MODELS_FILE:-\}", COMPOSE.read_text())
    assert re.search(r"\$\{AGENTSTREAM_MODELS_DIR:-\./deploy/models\}", COMPOSE.read_text())


def test_compose_models_example_loads_in_agentstream() -> None:
    from agentstream.models.endpoints import load_models_file

    endpoints = load_models_file(REPO / "deploy" / "models" / "models.example.yaml", require_keys=False)
    assert {e.provider for e in endpoints.values()} == {"openai", "anthropic"}
    text = COMPOSE.read_text()
    for e in endpoints.values():  # each key variable the example names reaches the model services
        if e.api_key_env:
            assert f"{e.api_key_env}: ${{{e.api_key_env}:-}}" in text, e.api_key_env


# ---------------------------------------------------------------- Dockerfile


def test_hadolint_passes_on_the_dockerfile() -> None:
    proc = run([find_tool("hadolint"), str(REPO / "Dockerfile")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    pairs = []
    for line in logical.splitlines():
        if line.strip():
            instruction, _, rest = line.strip().partition(" ")
            pairs.append((instruction.upper(), rest.strip()))
    return pairs


def test_dockerfile_runs_any_service_as_non_root_with_a_health_check() -> None:
    pairs = dockerfile_instructions()
    final_stage = pairs[max(i for i, (ins, _) in enumerate(pairs) if ins == "FROM") :]
    assert final_stage[0][1].split()[0] in ("${PYTHON_IMAGE}", "python:3.11-slim-bookworm")
    args = dict(a.split("=", 1) for ins, a in pairs if ins == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm", "a Debian release, so the pinned tini exists in it"
    users = [a for ins, a in final_stage if ins == "USER"]
    assert users, "the image must switch to a non-root user"
    uid = users[-1].split(":")[0].replace("${AGENTSTREAM_UID}", args["AGENTSTREAM_UID"])
    assert uid.isdigit() and int(uid) != 0, "numeric and non-root, so runAsNonRoot can verify it"
    (healthcheck,) = [a for ins, a in final_stage if ins == "HEALTHCHECK"]
    assert "python" in healthcheck and "/healthz" in healthcheck and "AGENTSTREAM_METRICS_PORT" in healthcheck
    assert ("ENTRYPOINT", '["tini", "--", "agentstream"]') in final_stage, (
        "tini is PID 1: it forwards signals and reaps"
    )
    (cmd,) = [json.loads(a) for ins, a in final_stage if ins == "CMD"]
    assert cmd == ["serve", "agent-loop", "--app", "agentstream.demo.app:app"]
    env = " ".join(a for ins, a in final_stage if ins == "ENV")
    assert "PYTHONPATH=/app" in env and "AGENTSTREAM_METRICS_PORT=9464" in env


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    assert lines[lines.index("*")] == "*", "allow-list: everything is excluded first"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed >= {"pyproject.toml", "README.md", "shared", "services"}
    assert not allowed & {".git", ".venv", ".tools", "tests"}


def test_the_image_gets_every_source_folder_of_the_distribution() -> None:
    import tomllib

    package_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    folders = {d.split("/")[0] for d in package_dirs}  # the top-level folder of each package
    dockerfile = (REPO / "Dockerfile").read_text()
    allowed = {
        line.strip()[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for folder in folders:
        assert re.search(rf"^COPY {folder} \./{folder}$", dockerfile, re.M), f"Dockerfile does not COPY {folder}/"
        assert folder in allowed, f".dockerignore leaves out {folder}/"


# ---------------------------------------------------------------- Grafana dashboard


def test_dashboard_queries_every_metric() -> None:
    dashboard = json.loads((CHART / "dashboards" / "agentstream.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    text = "\n".join(exprs)
    missing = [m for m in METRICS if not re.search(rf"\b{m}(_bucket|_count|_sum)?\{{", text)]
    assert not missing, f"metrics no panel queries: {missing}"
    for histogram in ("agentstream_step_seconds", "agentstream_model_call_seconds", "agentstream_tool_call_seconds"):
        assert f"{histogram}_bucket" in text, f"{histogram} is a histogram: its quantiles come from _bucket"
    assert re.search(r"by \(le, model\)", text) and re.search(r"by \(le, tool\)", text)
    assert "by (model, kind)" in text
    assert "by (stream, group)" in text
    assert "by (le, route)" in text, "the gateway's latency by route"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboards_metric_list_is_every_metric_the_services_export() -> None:
    """METRICS (what the dashboard must query) is what agentstream registers: a metric added to
    the services without a panel fails here, not silently."""
    from prometheus_client import REGISTRY

    import agentstream.ops.metrics  # noqa: F401 (registers the metrics)

    suffix = {"counter": "_total", "info": "_info"}
    exported = {f.name + suffix.get(f.type, "") for f in REGISTRY.collect() if f.name.startswith("agentstream_")}
    assert exported == set(METRICS)
