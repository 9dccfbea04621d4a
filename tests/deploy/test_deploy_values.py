"""The chart's values: documented (`## @param`), covered by values.schema.json, and bad
combinations refused at render time with a message that says what to change. NOTES.txt tells
how to publish a first turn.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import CHART, FULL_VALUES, RELEASE, Render, run

PARAM_LINE = re.compile(r"^\s*## @param (\S+) (.+)$")


def leaf_paths(values: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves of values.yaml; lists and empty maps are leaves."""
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in leaf_paths(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def all_paths(values: Any, prefix: str = "") -> set[str]:
    if isinstance(values, dict):
        out = set()
        for k, v in values.items():
            out.add(f"{prefix}{k}")
            out |= all_paths(v, f"{prefix}{k}.")
        return out
    return set()


def documented() -> dict[str, str]:
    params = {}
    for line in (CHART / "values.yaml").read_text().splitlines():
        if m := PARAM_LINE.match(line):
            params[m.group(1)] = m.group(2)
    return params


# ---------------------------------------------------------------- documentation and schema


def test_every_value_has_a_param_line(default_values: dict[str, Any]) -> None:
    params = documented()
    undocumented = [
        path for path in leaf_paths(default_values) if not any(path == p or path.startswith(p + ".") for p in params)
    ]
    assert not undocumented, f"values without a `## @param` line: {undocumented}"


def test_every_param_line_names_a_value(default_values: dict[str, Any]) -> None:
    stale = set(documented()) - all_paths(default_values)
    assert not stale, f"`## @param` lines for values that do not exist: {sorted(stale)}"


def schema_has(schema: dict[str, Any], path: str) -> bool:
    """Whether the schema declares the dotted path, or an ancestor of it that is a free-form map
    (a Kubernetes object such as resources or a security context). Follows `$ref`s."""
    node = schema
    for key in path.split("."):
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        if "properties" not in node:
            return node.get("type") == "object"
        if key not in node["properties"]:
            return False
        node = node["properties"][key]
    return True


def test_schema_covers_every_value(default_values: dict[str, Any]) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    missing = [p for p in leaf_paths(default_values) if not schema_has(schema, p)]
    assert not missing, f"values missing from values.schema.json: {missing}"


def test_schema_refuses_unknown_and_mistyped_values(render: Render) -> None:
    r = render(values={"agentLoop": {"replica": 2}})
    assert r.returncode != 0 and "replica" in r.stderr
    r = render(values={"shutdownGraceSeconds": "30s"})
    assert r.returncode != 0 and "shutdownGraceSeconds" in r.stderr
    r = render(values={"redis": {"bundled": {"appendfsync": "sometimes"}}})
    assert r.returncode != 0 and "appendfsync" in r.stderr
    r = render(values={"models": [{"id": "default", "provider": "gemini", "baseUrl": "http://m/v1", "model": "m"}]})
    assert r.returncode != 0 and "provider" in r.stderr
    r = render(values={"models": [{"id": "default", "baseUrl": "http://m/v1", "model": "m", "windowTokens": "big"}]})
    assert r.returncode != 0 and "windowTokens" in r.stderr


# ---------------------------------------------------------------- bad combinations

EXTERNAL = {"bundled": {"enabled": False}, "external": {"enabled": True, "url": "redis://redis.example.com:6379/0"}}

BAD_COMBINATIONS = {
    "bundled and external redis": (
        {"redis": {"external": {"enabled": True, "url": "redis://r:6379/0"}}},
        "redis.bundled.enabled and redis.external.enabled are both true",
    ),
    "no redis": (
        {"redis": {"bundled": {"enabled": False}}},
        "neither redis.bundled.enabled nor redis.external.enabled",
    ),
    "external without url": (
        {"redis": {"bundled": {"enabled": False}, "external": {"enabled": True}}},
        "redis.external.url is empty",
    ),
    "password in the url": (
        {"redis": {**EXTERNAL, "external": {"enabled": True, "url": "redis://:hunter2@r:6379/0"}}},
        "must not contain credentials",
    ),
    "rediss without tls": (
        {"redis": {**EXTERNAL, "external": {"enabled": True, "url": "rediss://r:6379/0"}}},
        "set redis.external.tls=true",
    ),
    "username on bundled redis": ({"redis": {"auth": {"username": "me"}}}, "applies only to an external Redis"),
    "keda and hpa": (
        {"autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}},
        "autoscaling.keda.enabled and autoscaling.hpa.enabled are both true",
    ),
    "pool without queue": ({"toolWorkers": {"pools": [{"name": "heavy"}]}}, "(heavy) has no queue"),
    "pool without name": ({"toolWorkers": {"pools": [{"queue": "q"}]}}, "toolWorkers.pools[0] has no name"),
    "pool queue named like a partition": (
        {"toolWorkers": {"pools": [{"name": "heavy", "queue": "heavy:p1"}]}},
        "queue \"heavy:p1\" ends in the partition suffix ':p<k>' of work streams "
        '(its stream would be a partition of queue "heavy"',
    ),
    "duplicate pool": (
        {"toolWorkers": {"pools": [{"name": "a", "queue": "a"}, {"name": "a", "queue": "b"}]}},
        'the pool name "a" appears twice',
    ),
    "no pools": ({"toolWorkers": {"pools": []}}, "toolWorkers.pools is empty"),
    "hpa from zero": (
        {"autoscaling": {"hpa": {"enabled": True}, "minReplicas": 0}},
        "minReplicas 0 needs KEDA",
    ),
    "hpa without cpu request": (
        {"autoscaling": {"hpa": {"enabled": True}}, "toolWorkers": {"resources": {"requests": None}}},
        "autoscaling.hpa needs resources.requests.cpu",
    ),
    "keda without triggers": (
        {"autoscaling": {"keda": {"enabled": True, "lagCount": 0, "pendingTrigger": False}}},
        "the ScaledObject has no trigger",
    ),
    "min above max": (
        {"autoscaling": {"keda": {"enabled": True}, "minReplicas": 5, "maxReplicas": 2}},
        "minReplicas (5) is above maxReplicas (2)",
    ),
    "no default model": (
        {"models": [{"id": "cheap", "baseUrl": "http://m/v1", "model": "m"}]},
        'no model has id "default"',
    ),
    "two ids, one key variable": (
        {
            "models": [
                {"id": "default", "baseUrl": "http://m/v1", "model": "m"},
                {"id": "a-b", "baseUrl": "http://m/v1", "model": "m"},
                {"id": "a.b", "baseUrl": "http://m/v1", "model": "m"},
            ]
        },
        "both give the key variable AGENTSTREAM_KEY_A_B",
    ),
    "thinking budget on an openai endpoint": (
        {"models": [{"id": "default", "baseUrl": "http://m/v1", "model": "m", "thinkingBudgetTokens": 2048}]},
        "thinkingBudgetTokens is an Anthropic setting",
    ),
    "model secret without key": (
        {
            "models": [
                {"id": "default", "baseUrl": "http://m/v1", "model": "m", "apiKey": {"existingSecret": "s", "key": ""}}
            ]
        },
        "apiKey.key is empty",
    ),
}


@pytest.mark.parametrize("values, message", BAD_COMBINATIONS.values(), ids=BAD_COMBINATIONS.keys())
def test_bad_combinations_fail_to_render(render: Render, values: dict[str, Any], message: str) -> None:
    r = render(values=values)
    assert r.returncode != 0, f"rendered although it should not:\n{r.stdout[:2000]}"
    assert message in r.stderr, r.stderr


# ---------------------------------------------------------------- NOTES.txt


def render_notes(helm: str, tmp_path: Path, *values_files: Path) -> str:
    """NOTES.txt as `helm install` would print it (which needs a cluster here): rendered through a
    throw-away template in a copy of the chart."""
    chart = tmp_path / "agentstream"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n'
    )
    args = [helm, "template", RELEASE, str(chart), "--show-only", "templates/zz-notes-under-test.yaml"]
    for f in values_files:
        args += ["-f", str(f)]
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["data"]["notes"]


def test_notes_tell_how_to_publish_a_first_turn(helm: str, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path)
    turn = """'{"trace_id":"c1","turn_id":"t1","agent":"demo","text":"What is 2+2?"}'"""
    assert f"redis-cli XADD agentstream:turns '*' turn {turn}" in notes
    assert "XREAD BLOCK 60000 STREAMS agentstream:replies 0" in notes
    assert f"exec -i {RELEASE}-agentstream-redis-0" in notes
    assert "has no API key" in notes
    assert "a new one is generated each\n  time" in notes and "redis.auth.requireExistingSecret=true" in notes


def test_notes_for_external_redis(helm: str, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path, FULL_VALUES)
    assert "redis-cli -u 'rediss://agentstream@redis.example.com:6380/2' --tls" in notes
    assert "XADD prod:turns '*' turn" in notes
    assert "STREAMS prod:replies 0" in notes
    assert "REDIS_PASSWORD" not in notes
    assert "has no API key" not in notes
    assert "requireExistingSecret" not in notes  # the password is the user's own Secret


def test_chart_readme_lists_every_param() -> None:
    readme = (CHART / "README.md").read_text()
    missing = [p for p in documented() if f"| `{p}` |" not in readme]
    assert not missing, f"charts/agentstream/README.md lacks these parameters: {missing}"
    stale = [p for p, text in documented().items() if f"| `{p}` | {text} |" not in readme]
    assert not stale, f"charts/agentstream/README.md describes these parameters otherwise than values.yaml: {stale}"


def test_the_charts_concurrency_is_the_services_default(default_values: dict[str, Any]) -> None:
    # issue 35: the services' defaults are the fast ones; a chart pod runs as a bare process would
    from agentstream.ops.settings import ConsumerConfig, Settings

    default = Settings.model_fields["concurrency"].default
    assert default == ConsumerConfig().concurrency
    assert default_values["toolWorkers"]["concurrency"] == default
    env = yaml.safe_dump(default_values)
    assert "AGENTSTREAM_BLOCK_MS" not in env and "AGENTSTREAM_LOG_LEVEL" not in env  # the services' own defaults


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


@pytest.mark.parametrize("service", ["agentLoop", "gateway", "delegation", "compaction"])
def test_the_charts_memory_limits_hold_the_fold_cache(default_values: dict[str, Any], service: str) -> None:
    # issue 35: every service that keeps folds has a memory limit, its cache's bound follows it
    # (the setting is not pinned by the chart), and the bound (counted within 1.5× of what the
    # folds hold, tests/unit/test_fold_memory.py) plus the process's own 68 MB leaves headroom
    from agentstream.ops.memory import cache_bytes_for_limit

    block = default_values[service]
    limit = _quantity_bytes(block["resources"]["limits"]["memory"])
    assert "AGENTSTREAM_FOLD_CACHE_BYTES" not in yaml.safe_dump(block)
    assert "AGENTSTREAM_FOLD_CACHE_BYTES" not in yaml.safe_dump(default_values.get("extraEnv", []))
    assert cache_bytes_for_limit(limit) * 1.5 + 128 * (1 << 20) <= limit * 0.75
