"""Running the HTTP gateway (and the services behind it) as separate processes in tests."""

from __future__ import annotations

import json
import socket
import time

import httpx

from agentstream.ops.apikeys import hash_key
from tests.support.procs import Services

ADMIN_KEY = "ask_test-admin-0123456789abcdef0123456789abcdef"
CALC_KEY = "ask_test-calc-0123456789abcdef0123456789abcdef"
PLAN_KEY = "ask_test-plan-0123456789abcdef0123456789abcdef"
LIMITED_KEY = "ask_test-limited-0123456789abcdef0123456789abcdef"
LEAD_KEY = "ask_test-lead-0123456789abcdef0123456789abcdef"

KEYS_DOCUMENT = json.dumps(
    {
        "keys": [
            {"name": "admin", "sha256": hash_key(ADMIN_KEY), "agents": ["*"]},
            {"name": "calc-backend", "sha256": hash_key(CALC_KEY), "agents": ["calc"]},
            {"name": "plan-backend", "sha256": hash_key(PLAN_KEY), "agents": ["plan"]},
            {"name": "limited", "sha256": hash_key(LIMITED_KEY), "agents": ["plan"]},
            {"name": "lead-backend", "sha256": hash_key(LEAD_KEY), "agents": ["lead"]},
        ]
    }
)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(services: Services, name: str = "gateway-1", *, env: dict[str, str] | None = None) -> str:
    """Start ``agentstream serve gateway`` on a free port → its base URL once it is ready."""
    port = free_port()
    services.start(
        name,
        "gateway",
        env={
            "AGENTSTREAM_GATEWAY_HOST": "127.0.0.1",
            "AGENTSTREAM_GATEWAY_PORT": str(port),
            "AGENTSTREAM_GATEWAY_KEYS": KEYS_DOCUMENT,
            **(env or {}),
        },
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, services, name)
    return url


def wait_ready(url: str, services: Services, name: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = services.procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{services.log(name)[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{name} not ready within {timeout_s} s:\n{services.log(name)[-3000:]}")


def turn(trace_id: str, turn_id: str, text: str, agent: str = "calc", **extra) -> dict:
    return {"trace_id": trace_id, "turn_id": turn_id, "agent": agent, "text": text, **extra}
