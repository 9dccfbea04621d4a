"""A tool worker's MCP sessions against a malicious server (tests/support/mcp_hostile.py) and a
real Redis (issue 33, items 1 and 8): a schema bomb is refused with its reason, a flood on stderr
becomes bounded, escaped log records named by the server, garbage and huge or endless messages
fail only their own call (at once), and the server serves the next call."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentstream import McpServer
from agentstream.mcp_tools.host import SERVER_STOPPED, McpHost
from agentstream.mcp_tools.transports import BURST_LINES, MAX_LINE_BYTES, StderrLog
from agentstream.runtime.mcp_catalogs import read_catalogs
from tests.support.mcp_hostile import FORGED
from tests.support.procs import ROOT

pytestmark = pytest.mark.integration


def hostile(tmp_path: Path, **kwargs) -> McpServer:
    return McpServer(
        name="hostile",
        command=[sys.executable, "-m", "tests.support.mcp_hostile", "stdio"],
        env={"MCP_TEST_DIR": str(tmp_path)},
        cwd=str(ROOT),
        connect_timeout_s=30,
        **kwargs,
    )


async def _running(host: McpHost):
    stop = asyncio.Event()
    task = asyncio.create_task(host.run(stop))
    await asyncio.wait_for(host.connections[0].ready.wait(), 40)
    return stop, task


async def _stopped(stop: asyncio.Event, task: asyncio.Task) -> None:
    stop.set()
    await asyncio.wait_for(task, 20)


async def test_a_schema_bomb_is_refused_with_its_reason_and_the_other_tools_are_offered(redis, keys, tmp_path):
    host = McpHost([hostile(tmp_path)], redis, keys)
    stop, task = await _running(host)
    try:
        catalog = (await read_catalogs(redis, keys, ["hostile"]))["hostile"]
        refused = {r.tool: r for r in catalog.refused}
        assert set(refused) == {"bomb"} and refused["bomb"].keyword == "inputSchema"
        assert "more than" in refused["bomb"].reason, refused["bomb"].reason
        assert "ok" in {t.name for t in catalog.tools}
        assert (await host.tool("ok").invoke("{}", timeout_s=20)).text == "ok"
    finally:
        await _stopped(stop, task)


@pytest.mark.slow
async def test_a_stderr_flood_is_logged_escaped_named_cut_and_rate_limited(redis, keys, tmp_path, caplog, capfd):
    caplog.set_level(logging.INFO, logger="agentstream.mcp.stderr")
    host = McpHost([hostile(tmp_path)], redis, keys)
    stop, task = await _running(host)
    try:
        value = await host.tool("flood_stderr").invoke(json.dumps({"lines": 20_000}), timeout_s=30)
        assert value.text == "flooded"
        assert (await host.tool("ok").invoke("{}", timeout_s=20)).text == "ok"
    finally:
        await _stopped(stop, task)
    records = [r for r in caplog.records if r.name == "agentstream.mcp.stderr"]
    assert BURST_LINES <= len(records) < 20_000 // 10, len(records)  # a burst, then a rate; not 20,000 records
    assert all(r.getMessage().startswith("MCP server 'hostile' stderr: ") for r in records)
    assert all(r.levelno == logging.INFO and r.mcp_server == "hostile" for r in records)
    messages = [r.getMessage() for r in records]
    assert not any(c in m for m in messages for c in "\x07\x1b\r\n")  # control characters escaped
    assert any("\\x1b[31m" in m for m in messages)
    assert any(m.endswith("[cut: 100,000 bytes]") and len(m) < MAX_LINE_BYTES + 100 for m in messages)
    assert any(FORGED in m for m in messages)  # the forged record is text inside the server's own record
    assert any("line(s) dropped" in m for m in messages)
    assert FORGED not in capfd.readouterr().err  # nothing of the server's went to the worker's stderr


@pytest.mark.slow
async def test_a_server_busy_with_a_call_past_the_probes_wait_keeps_its_session_and_the_call(redis, keys, tmp_path):
    """A server that serves one request at a time leaves the probe unanswered while a call runs:
    that is not death (the flood of stderr under load was such a call, and lost its session)."""
    host = McpHost([hostile(tmp_path, probe_interval_s=0.2)], redis, keys)  # a probe waits 5 s for its answer
    stop, task = await _running(host)
    try:
        connection = host.connections[0]
        value = await host.tool("busy").invoke(json.dumps({"s": 8}), timeout_s=40)  # longer than the probe's 5 s
        assert value.text == "done", value.text
        assert connection.sessions == 1 and connection.last_error == ""
        assert (await host.tool("ok").invoke("{}", timeout_s=20)).text == "ok"
    finally:
        await _stopped(stop, task)


@pytest.mark.slow
async def test_garbage_a_huge_message_and_death_mid_call_fail_only_their_own_call(redis, keys, tmp_path):
    host = McpHost([hostile(tmp_path)], redis, keys)
    stop, task = await _running(host)
    try:
        connection = host.connections[0]
        assert (await host.tool("garbage").invoke("{}", timeout_s=20)).text == "after garbage"
        assert connection.sessions == 1  # lines that are not JSON-RPC do not end the session
        for name, arguments in [("huge", {"mb": 40}), ("endless", {}), ("die", {})]:
            sessions = connection.sessions
            value = await host.tool(name).invoke(json.dumps(arguments), timeout_s=60)
            assert value.error == SERVER_STOPPED, (name, value.text[:300])  # not a timeout: its error came at once
            assert (await host.tool("ok").invoke("{}", timeout_s=40)).text == "ok"  # started again, serving
            assert connection.sessions == sessions + 1, name
    finally:
        await _stopped(stop, task)


async def test_an_http_servers_endless_body_fails_the_call_not_the_worker(redis, keys, tmp_path, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_hostile", "http", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        server = McpServer(name="hostile", url=f"http://127.0.0.1:{port}/mcp", connect_timeout_s=20)
        host = McpHost([server], redis, keys)
        stop, task = await _running(host)
        try:
            for name in ("endless", "huge"):
                value = await host.tool(name).invoke("{}", timeout_s=60)
                assert value.error == SERVER_STOPPED, (name, value.text[:300])  # not a timeout: its error came at once
            assert caplog.text.count("bytes; not read further (the call fails") == 2
            assert (await host.tool("ok").invoke("{}", timeout_s=40)).text == "ok"
        finally:
            await _stopped(stop, task)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_the_stderr_log_cuts_escapes_and_limits_by_the_clock(caplog):
    caplog.set_level(logging.INFO, logger="agentstream.mcp.stderr")
    now = [0.0]
    log = StderrLog("s", max_line_bytes=10, lines_per_s=1.0, burst=2, clock=lambda: now[0])
    log.feed(b"one\ntwo\nthree\n")  # the third is over the burst
    log.feed(b"a very long line")
    now[0] = 5.0
    log.feed(b" indeed\n\xff\x00\n")
    log.close()
    assert [r.getMessage().removeprefix("MCP server 's' stderr: ") for r in caplog.records] == [
        "one",
        "two",
        "1 line(s) dropped (over 1/s)",
        "a very lon [cut: 23 bytes]",
        "\\xff\\x00",
    ]


async def test_a_long_message_under_the_cap_is_read_and_parsed_off_the_event_loop(redis, keys, tmp_path, monkeypatch):
    import anyio.to_thread

    parsed_in_threads = []
    run_sync = anyio.to_thread.run_sync

    async def spy(fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "_parse":
            parsed_in_threads.append(len(args[0]))
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", spy)
    host = McpHost([hostile(tmp_path)], redis, keys)
    stop, task = await _running(host)
    try:
        value = await host.tool("huge").invoke(json.dumps({"mb": 8}), timeout_s=60)
        assert value.error is None and len(value.text) == 8 * 1024 * 1024
        assert host.connections[0].sessions == 1  # under the cap: the session goes on
    finally:
        await _stopped(stop, task)
    assert any(size > 8 * 1024 * 1024 for size in parsed_in_threads), parsed_in_threads
