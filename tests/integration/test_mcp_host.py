"""A tool worker's MCP sessions against the real test server (the SDK's own server API) and a real
Redis, without the other services: the catalog, restarts, a server that never starts, a server
that refuses the worker's token, and hostile arguments."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentstream import McpServer
from agentstream.mcp_tools.host import SERVER_STOPPED, McpHost
from agentstream.runtime.mcp_catalogs import read_catalogs
from tests.support.procs import ROOT

pytestmark = pytest.mark.integration


def stdio_server(tmp_path: Path, **kwargs) -> McpServer:
    return McpServer(
        name="local",
        command=[sys.executable, "-m", "tests.support.mcp_servers", "stdio"],
        env={"MCP_TEST_DIR": str(tmp_path)},
        cwd=str(ROOT),
        connect_timeout_s=30,
        **kwargs,
    )


async def running(host: McpHost):
    stop = asyncio.Event()
    task = asyncio.create_task(host.run(stop))
    return stop, task


async def stopped(stop: asyncio.Event, task: asyncio.Task) -> None:
    stop.set()
    await asyncio.wait_for(task, 20)


@pytest.mark.slow
async def test_the_catalog_is_published_and_a_killed_server_is_started_again(redis, keys, tmp_path):
    host = McpHost(
        [stdio_server(tmp_path, tools=["add", "slow", "either", "nested"])], redis, keys, probe_interval_s=1.0
    )
    stop, task = await running(host)
    try:
        connection = host.connections[0]
        await asyncio.wait_for(connection.ready.wait(), 40)
        catalog = (await read_catalogs(redis, keys, ["local"]))["local"]
        assert [t.name for t in catalog.tools] == ["add", "slow", "nested"]  # the allow-list; `either` refused
        assert [(r.tool, r.keyword) for r in catalog.refused] == [("either", "anyOf")]
        first_pid = int((tmp_path / "pid").read_text())
        os.kill(first_pid, signal.SIGKILL)
        for _ in range(400):  # the death is seen (the dispatcher's EOF, or the next probe) and a new session opens
            if connection.sessions == 2 and connection.ready.is_set():
                break
            await asyncio.sleep(0.05)
        assert connection.sessions == 2 and int((tmp_path / "pid").read_text()) != first_pid
        from agentstream.ops import metrics

        assert metrics.MCP_SERVER_UP.labels(server="local")._value.get() == 1
        assert metrics.MCP_TOOLS_REFUSED.labels(server="local")._value.get() == 1
        value = await host.tool("add").invoke(json.dumps({"a": 1, "b": 2}), timeout_s=40)
        assert value.text == "3" and value.error is None
    finally:
        await stopped(stop, task)


async def test_hostile_arguments_never_reach_the_server(redis, keys, tmp_path):
    host = McpHost([stdio_server(tmp_path)], redis, keys)
    stop, task = await running(host)
    try:
        await asyncio.wait_for(host.connections[0].ready.wait(), 40)
        add = host.tool("add")
        for raw, words in [
            ("{not json", "not valid JSON"),
            ("[1, 2]", "must be a JSON object, got list"),
            ('{"a": 1, "b": "x", "c": 3}', "b: 'x' is not of type 'number'"),
            ("\x00\xff", "not valid JSON"),
        ]:
            value = await add.invoke(raw)
            assert value.error == "invalid_arguments" and words in value.text, value.text
        # a lone surrogate escape (high, low, in a key, a raw one) was sent and the SDK's transport
        # failed to write it: the session dropped, with its other calls, "may have partly run"
        fail = host.tool("fail")
        for raw, words in [
            ('{"reason": "x\\ud800y"}', "lone high UTF-16 surrogate"),
            ('{"reason": "\\udfff"}', "lone low UTF-16 surrogate"),
            ('{"re\\ud83dson": "a"}', "lone high UTF-16 surrogate"),
            ('{"reason": "\ud800"}', "not UTF-8"),
        ]:
            value = await fail.invoke(raw)
            assert value.error == "invalid_arguments" and words in value.text and "'fail'" in value.text, value.text
        assert host.connections[0].sessions == 1  # the session lives on
        assert (await add.invoke('{"a": 1, "b": 2}', timeout_s=20)).text == "3"
        assert host.connections[0].sessions == 1
        assert [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()] == [
            "add"
        ]  # only the good call ran
        unknown = await host.connections[0].call("nope", {}, call_id="c1")
        assert unknown.error == "unknown_tool" and "add" in unknown.text
    finally:
        await stopped(stop, task)


async def test_a_server_that_never_starts_gives_calls_an_error_result_in_time(redis, keys, caplog):
    server = McpServer(name="ghost", command=["/nonexistent/mcp-server"], connect_timeout_s=2)
    host = McpHost([server], redis, keys)
    stop, task = await running(host)
    try:
        tool = host.tool("anything")  # not listed yet: a call waits for the server
        assert tool is not None and tool.queue == "mcp-ghost"
        value = await tool.invoke("{}", timeout_s=1.5)
        assert value.error == SERVER_STOPPED and "was not available within 1.5 s" in value.text
        assert "nonexistent" in value.text or "FileNotFoundError" in value.text or "No such file" in value.text
    finally:
        await stopped(stop, task)
    assert (await read_catalogs(redis, keys, ["ghost"]))["ghost"] is None


@pytest.mark.slow
async def test_an_http_server_that_refuses_the_token_is_reported_without_it(redis, keys, tmp_path, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_servers", "http", "--port", str(port), "--token", "right"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wrong = McpServer(
            name="remote", url=f"http://127.0.0.1:{port}/mcp", headers_env={"Authorization": "T"}, connect_timeout_s=5
        )
        host = McpHost([wrong], redis, keys, environ={"T": "Bearer wrong-token-123"})
        stop, task = await running(host)
        caplog.set_level(logging.WARNING, logger="agentstream.mcp")
        try:
            value = await host.tool("add").invoke('{"a": 1, "b": 2}', timeout_s=6)
            assert value.error == SERVER_STOPPED
            assert "wrong-token-123" not in value.text and "wrong-token-123" not in caplog.text
        finally:
            await stopped(stop, task)
        right = McpServer(
            name="remote", url=f"http://127.0.0.1:{port}/mcp", headers_env={"Authorization": "T"}, connect_timeout_s=20
        )
        host = McpHost([right], redis, keys, environ={"T": "Bearer right"})
        stop, task = await running(host)
        try:
            value = await host.tool("add").invoke('{"a": 1, "b": 2}', timeout_s=30)
            assert value.text == "3"
        finally:
            await stopped(stop, task)
    finally:
        proc.kill()
        proc.wait(timeout=10)
