"""The chart and docker-compose.yml expose the wire's limits and deadlines (issue 11): every
agentstream container gets them, with the library's defaults, and what they render is what the
services' settings read."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import yaml

from agentstream.ops.settings import Settings
from agentstream.wire.checks import DEFAULT_LIMITS, LIMIT_SETTINGS
from tests.deploy.deploy_support import REPO, find_tool, run

NUMERIC = {name: var for name, var in LIMIT_SETTINGS.items() if name != "reply_streams"}


def containers(rendered) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in rendered.of_kind("Deployment"):
        (c,) = d["spec"]["template"]["spec"]["containers"]
        out.append((d["metadata"]["name"], {e["name"]: e.get("value") for e in c.get("env", []) if "value" in e}))
    return out


def settings_from(env: dict[str, str]) -> Settings:
    wanted = {k: v for k, v in env.items() if k.startswith("AGENTSTREAM_") and k != "AGENTSTREAM_CONSUMER"}
    with mock.patch.dict(os.environ, wanted, clear=True):
        return Settings()


def test_the_chart_gives_every_service_the_default_limits_and_deadlines(default_render) -> None:
    found = containers(default_render)
    assert len(found) >= 4
    for where, env in found:
        for name, var in NUMERIC.items():
            assert env[var] == str(getattr(DEFAULT_LIMITS, name)), (where, var)
        assert env["AGENTSTREAM_MODEL_DEADLINE_S"] == "300" and "AGENTSTREAM_TURN_DEADLINE_S" not in env, where
        assert "AGENTSTREAM_REPLY_STREAMS" not in env
        assert settings_from(env).wire_limits == DEFAULT_LIMITS


def test_chart_values_reach_the_settings(render) -> None:
    rendered = render(
        values={
            "limits": {
                "maxToolResultBytes": 4194304,
                "maxTurnBytes": 2097152,
                "replyStreams": ["app:*:replies", "billing:replies"],
            },
            "deadlines": {"modelSeconds": 90, "turnSeconds": 600},
        }
    )
    for where, env in containers(rendered):
        settings = settings_from(env)
        assert (
            settings.wire_limits.max_tool_result_bytes == 4_194_304 and settings.wire_limits.max_turn_bytes == 2_097_152
        ), where
        assert settings.wire_limits.reply_streams == ("app:*:replies", "billing:replies")
        assert settings.model_deadline_s == 90 and settings.turn_deadline_s == 600
    bad = render(values={"limits": {"maxTurnBytes": 10}})
    assert bad.returncode != 0 and "maxTurnBytes" in bad.stderr


def test_the_backends_value_reaches_every_service(render, default_render) -> None:
    """Issue 33: the backends confined to their own conversations are named on every service (the
    agent loop reads their streams, every tool worker and agent loop hears their cancels)."""
    rendered = render(values={"backends": ["backend-7", "backend-8"]})
    found = containers(rendered)
    assert len(found) >= 4
    for where, env in found:
        assert settings_from(env).keys.backends == ("backend-7", "backend-8"), where
    for where, env in containers(default_render):
        assert "AGENTSTREAM_BACKENDS" not in env and settings_from(env).keys.backends == (), where
    for bad in (["a:b"], ["b7", "b7"]):
        refused = render(values={"backends": bad})
        assert refused.returncode != 0 and "backends" in refused.stderr, bad


def test_compose_gives_every_service_the_limits_and_deadlines() -> None:
    proc = run([find_tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config"])
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in ("agent-loop", "tool-worker", "delegation", "compaction"):
        env = {k: str(v) for k, v in services[name]["environment"].items()}
        for attr, var in NUMERIC.items():
            assert env[var] == str(getattr(DEFAULT_LIMITS, attr)), (name, var)
        assert env["AGENTSTREAM_MODEL_DEADLINE_S"] == "300" and env["AGENTSTREAM_TURN_DEADLINE_S"] == ""
        settings = settings_from(env)
        assert settings.turn_deadline_s is None and settings.wire_limits == DEFAULT_LIMITS, name
