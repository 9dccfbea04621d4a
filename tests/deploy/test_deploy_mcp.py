"""The chart runs a tool-worker pool for an MCP server: its command and env, or its URL and a
Secret for its headers, rendered as the variables agentstream.declarations.mcp_servers reads."""

from __future__ import annotations

from typing import Any

import pytest

from agentstream import McpServer
from tests.deploy.deploy_support import CHART, FULL_VALUES, RELEASE, Render, Rendered, find_tool, run

FULLNAME = f"{RELEASE}-agentstream"
MCP_VALUES = CHART / "ci" / "mcp-values.yaml"


@pytest.fixture(scope="module")
def mcp_render(render: Render) -> Rendered:
    return render(FULL_VALUES, MCP_VALUES)


def test_mcp_pools_lint_and_validate(helm: str, mcp_render: Rendered) -> None:
    proc = run([helm, "lint", "--strict", str(CHART), "-f", str(FULL_VALUES), "-f", str(MCP_VALUES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mcp_render.returncode == 0, mcp_render.stderr
    proc = run(
        [find_tool("kubernetes-validate"), "--strict", "-k", "1.31.0", "-"], stdin=mcp_render.stdout, timeout_s=120
    )
    assert proc.returncode == 0 and "ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    names = {d["metadata"]["name"] for d in mcp_render.of_kind("Deployment")}
    assert {f"{FULLNAME}-tool-worker-mcp-files", f"{FULLNAME}-tool-worker-mcp-search"} <= names
    scaled = [s["spec"]["triggers"][0]["metadata"]["stream"] for s in mcp_render.of_kind("ScaledObject")]
    assert any(stream.endswith(":tools:mcp-search") for stream in scaled)  # the pool scales on its own queue


def _container(rendered: Rendered, pool: str) -> dict[str, Any]:
    deployment = rendered.named("Deployment", f"{FULLNAME}-tool-worker-{pool}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _plain_env(container: dict[str, Any], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment as the pod would see it, Secrets resolved from ``secrets``."""
    out = {}
    for entry in container.get("env", []):
        if "value" in entry:
            out[entry["name"]] = entry["value"]
        elif "valueFrom" in entry and "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            out[entry["name"]] = secrets.get((ref["name"], ref["key"]), "(another secret)")
    return out


def test_a_stdio_pool_gets_the_command_and_the_servers_environment(mcp_render: Rendered) -> None:
    container = _container(mcp_render, "mcp-files")
    assert container["args"][-2:] == ["--queue", "mcp-files"]
    env = {e["name"]: e for e in container["env"]}
    assert env["FILES_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "files-mcp", "key": "token"}
    environ = _plain_env(container, {("files-mcp", "token"): "tok-1"})
    transport = McpServer(name="files").transport(environ)  # what the worker in the pod reads
    assert transport.command == ("npx", "-y", "@modelcontextprotocol/server-filesystem", "/data")
    assert transport.env == {"FILES_READ_ONLY": "1", "FILES_TOKEN": "tok-1"}


def test_an_http_pool_gets_the_url_and_its_headers_from_a_secret(mcp_render: Rendered) -> None:
    container = _container(mcp_render, "mcp-search")
    env = {e["name"]: e for e in container["env"]}
    header = env["AGENTSTREAM_MCP_SEARCH_HEADER_AUTHORIZATION"]
    assert "value" not in header and header["valueFrom"]["secretKeyRef"] == {
        "name": "search-mcp",
        "key": "authorization",
    }
    transport = McpServer(name="search").transport(_plain_env(container, {("search-mcp", "authorization"): "Bearer t"}))
    assert transport.url == "https://mcp.example.com/mcp" and transport.headers == {"authorization": "Bearer t"}


@pytest.mark.parametrize(
    ("mcp", "message"),
    [
        ({"server": "s", "command": ["x"], "url": "https://h/mcp"}, "not both"),
        (
            {
                "server": "s",
                "command": ["x"],
                "headers": [{"name": "Authorization", "secretName": "a", "secretKey": "b"}],
            },
            "mcp.headers apply to a streamable-HTTP server",
        ),
        (
            {"server": "s", "url": "https://h/mcp", "env": [{"name": "A", "value": "1"}]},
            "mcp.env is the environment of a stdio command",
        ),
        ({"server": "s", "url": "https://user:pw@h/mcp"}, "must not contain credentials"),
        ({"command": ["x"]}, "server"),
        ({"server": "s", "url": "ftp://h"}, "url"),
    ],
)
def test_an_mcp_pool_that_cannot_work_fails_to_render(render: Render, mcp: dict[str, Any], message: str) -> None:
    rendered = render(values={"toolWorkers": {"pools": [{"name": "m", "queue": "mcp-s", "mcp": mcp}]}})
    assert rendered.returncode != 0
    assert message in rendered.stderr, rendered.stderr
