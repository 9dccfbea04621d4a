"""The gateway fuzzed against its own OpenAPI document (schemathesis, a bounded run): whatever
schemathesis sends, the gateway never answers with a server error (5xx), and every status it
answers is one its document declares. The services behind it run as processes on a real Redis.

The event stream is left out of the fuzzing (a stream of a conversation that never ends stays
open by design); its input checks are in test_gateway.py."""

from __future__ import annotations

import subprocess
import sys
import uuid

import httpx
import pytest

from tests.support.gateway import ADMIN_KEY, CALC_KEY, auth, start_gateway, turn
from tests.support.procs import Services
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e


def test_no_server_error_whatever_is_sent(redis_url, tmp_path):
    with ScriptedModelServer() as model:
        services = Services(
            redis_url=redis_url, namespace=f"fuzz-{uuid.uuid4().hex[:8]}", model_url=model.base_url, log_dir=tmp_path
        )
        services.start("loop-1", "agent-loop")
        services.start("tools-1", "tool-worker")
        try:
            url = start_gateway(
                services, env={"AGENTSTREAM_GATEWAY_RATE_LIMIT_PER_MIN": "0", "AGENTSTREAM_GATEWAY_MAX_WAIT_S": "1"}
            )
            # a conversation to find, so that some generated requests reach real data
            with httpx.Client(base_url=url, timeout=30) as client:
                accepted = client.post(
                    "/v1/turns", json=turn("fuzz", "t1", "What is 2+2?"), headers=auth(CALC_KEY)
                ).json()
                client.get(accepted["reply_url"], params={"timeout_s": 1}, headers=auth(CALC_KEY))
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "schemathesis.cli",
                    "run",
                    f"{url}/openapi.json",
                    "--checks",
                    "not_a_server_error,status_code_conformance",
                    "--header",
                    f"Authorization: Bearer {ADMIN_KEY}",
                    "--exclude-path-regex",
                    "/stream$",
                    "--phases",
                    "coverage,fuzzing",
                    "--max-examples",
                    "20",
                    "--max-time",
                    "90",
                    "--request-timeout",
                    "10",
                    "--seed",
                    "1",
                    "--suppress-health-check",
                    "all",
                    "--workers",
                    "1",
                ],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=400,
            )
            log = services.log("gateway-1")
        finally:
            services.stop_all()
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, f"schemathesis found problems:\n{report}\n--- gateway log (tail) ---\n{log[-3000:]}"
    assert "Traceback" not in log, log[-3000:]
