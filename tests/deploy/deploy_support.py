"""Helpers of the deployment tests: where the tools and the chart are, running them, parsing output.

The tools come from ``scripts/install-deploy-tools`` (helm in ``<repo>/.tools/bin``; kubernetes-validate
and hadolint in the venv; docker-compose from Debian). A missing tool fails the tests that need it,
with a message saying how to install it: these tests never skip silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentstream"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
INSTALL_HINT = "run scripts/install-deploy-tools (it installs helm, kubernetes-validate, hadolint and docker-compose)"
RELEASE = "t"
K8S_NAMESPACE = "agents"

Manifest = dict[str, Any]


def find_tool(name: str) -> str:
    """The path of a deployment tool, or a test failure that says how to install it.

    Looks in ``<repo>/.tools/bin``, then beside the running Python (the venv's bin), then on PATH.
    """
    for directory in (REPO / ".tools" / "bin", Path(sys.executable).parent):
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"{name} not found in .tools/bin, the venv or PATH: {INSTALL_HINT}", pytrace=False)


def run(args: list[str], *, stdin: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


@dataclass(frozen=True)
class Rendered:
    """One `helm template` run: its exit code, output and parsed manifests."""

    returncode: int
    stdout: str
    stderr: str

    @cached_property
    def manifests(self) -> list[Manifest]:
        assert self.returncode == 0, f"helm template failed:\n{self.stderr}"
        return [doc for doc in yaml.safe_load_all(self.stdout) if doc]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def named(self, kind: str, name: str) -> Manifest:
        matches = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
        return matches[0]


Render = Callable[..., Rendered]
