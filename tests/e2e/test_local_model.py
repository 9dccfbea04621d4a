"""The README's main job against the real local model (llama.cpp + SmolLM2-135M), exactly as a
newcomer runs it: nothing configured, so Redis is embedded and the model is started locally;
the agent loop and the tool worker run as separate processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.procs import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.local_model]


def test_main_job_on_the_embedded_defaults(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path)  # the embedded Redis keeps its data under the cache: this test's own
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "run", "What is 365 * 24?"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr[-3000:]}"
    assert re.search(r"→ tool call calculator\(", out), out
    assert re.search(r"← tool result calculator \[[^\]]+\]: 8760", out), out
    # the answer is the tool's result (the local model copies short numbers reliably)
    assert re.search(r"✓ answer: .*8,?760", out), out
    assert re.search(r"fingerprints: (\d+)/\1 model calls rebuilt from the stored trace match", proc.stderr), (
        proc.stderr
    )
