"""Fixtures for the deployment tests: the chart rendered with helm for each values set.

Rendering happens once per session; a missing helm fails every test that needs it, with a
message saying to run scripts/install-deploy-tools (see deploy_support.find_tool).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_support import CHART, FULL_VALUES, K8S_NAMESPACE, RELEASE, Render, Rendered, find_tool, run


@pytest.fixture(scope="session")
def helm() -> str:
    return find_tool("helm")


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """render(*values_files, values={...}) → Rendered; `values` is written to a file and applied last."""
    tmp = tmp_path_factory.mktemp("values")
    numbers = itertools.count()

    def _render(*values_files: Path, values: dict[str, Any] | None = None, extra: Iterable[str] = ()) -> Rendered:
        args = [helm, "template", RELEASE, str(CHART), "--namespace", K8S_NAMESPACE]
        for f in values_files:
            args += ["-f", str(f)]
        if values is not None:
            path = tmp / f"values-{next(numbers)}.yaml"
            path.write_text(yaml.safe_dump(values))
            args += ["-f", str(path)]
        args += list(extra)
        proc = run(args)
        return Rendered(proc.returncode, proc.stdout, proc.stderr)

    return _render


@pytest.fixture(scope="session")
def default_render(render: Render) -> Rendered:
    return render()


@pytest.fixture(scope="session")
def full_render(render: Render) -> Rendered:
    return render(FULL_VALUES)


@pytest.fixture(scope="session")
def hpa_render(render: Render) -> Rendered:
    """The full values with the HPA in place of KEDA (which alone can scale a pool from zero)."""
    pools = yaml.safe_load(FULL_VALUES.read_text())["toolWorkers"]["pools"]
    pools = [{**p, "minReplicas": max(1, p.get("minReplicas", 1))} for p in pools]
    values = {"autoscaling": {"keda": {"enabled": False}, "hpa": {"enabled": True}}, "toolWorkers": {"pools": pools}}
    return render(FULL_VALUES, values=values)


@pytest.fixture(scope="session")
def default_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.fixture(scope="session")
def full_values(default_values: dict[str, Any]) -> dict[str, Any]:
    """values.yaml overlaid with ci/full-values.yaml (maps merged, everything else replaced, as helm does)."""

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            return {k: merge(base.get(k), over[k]) if k in base else over[k] for k in over} | {
                k: v for k, v in base.items() if k not in over
            }
        return over

    return merge(default_values, yaml.safe_load(FULL_VALUES.read_text()))
