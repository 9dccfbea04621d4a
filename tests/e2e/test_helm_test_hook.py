"""The chart's `helm test` script (charts/agentstream/files/turn_test.py) against real services:
it passes when the turn gets an answer, and fails (exit 1, saying why) when nothing answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.deploy.deploy_support import CHART
from tests.support.procs import Services

pytestmark = pytest.mark.e2e

SCRIPT = CHART / "files" / "turn_test.py"


def run_script(redis_url: str, namespace: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "TEST_AGENT": "calc",
        "TEST_TEXT": "What is 2*2?",
        "TEST_TIMEOUT_S": str(timeout_s),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout_s + 30
    )


def test_helm_test_script_passes_when_the_turn_is_answered(redis_url, namespace, scripted_model, tmp_path):
    services = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    try:
        services.start("loop", "agent-loop")
        services.start("tools", "tool-worker")
        proc = run_script(redis_url, namespace, 60)
    finally:
        services.stop_all()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"status": "ended"' in proc.stdout and "published turn" in proc.stdout


def test_helm_test_script_fails_when_nothing_answers(redis_url, namespace):
    proc = run_script(redis_url, namespace, 2)
    assert proc.returncode == 1
    assert "no reply within 2 s" in proc.stderr


def test_helm_test_script_exits_2_when_redis_is_unreachable(namespace):
    proc = run_script("redis://127.0.0.1:1/0", namespace, 2)
    assert proc.returncode == 2 and "cannot reach Redis" in proc.stderr
