"""Every service's metrics port binds the address ``AGENTSTREAM_METRICS_HOST`` names (issue 33,
item 10: it bound 0.0.0.0 with no setting), read back from the kernel's table of listening sockets."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.support.gateway import free_port, start_gateway
from tests.support.procs import Services

pytestmark = pytest.mark.e2e


def _listening_addresses(port: int) -> set[str]:
    """The local IPv4 addresses listening on ``port`` (from /proc/net/tcp: hex, little-endian)."""
    found = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_the_metrics_port_binds_the_configured_address(redis_url, tmp_path):
    services = Services(
        redis_url=redis_url, namespace=f"mh-{uuid.uuid4().hex[:8]}", model_url="http://127.0.0.1:9", log_dir=tmp_path
    )
    ports = {"agent-loop": free_port(), "tool-worker": free_port(), "gateway": free_port()}
    try:
        for service in ("agent-loop", "tool-worker"):
            env = {"AGENTSTREAM_METRICS_PORT": str(ports[service]), "AGENTSTREAM_METRICS_HOST": "127.0.0.1"}
            services.start(service, service, env=env)
        start_gateway(
            services,
            env={"AGENTSTREAM_METRICS_PORT": str(ports["gateway"]), "AGENTSTREAM_METRICS_HOST": "127.0.0.1"},
        )
        for service, port in ports.items():
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            assert _listening_addresses(port) == {"127.0.0.1"}, (service, _listening_addresses(port))
    finally:
        services.stop_all()
