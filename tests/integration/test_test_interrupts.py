"""Ctrl-C during the test suite: pytest stops (one KeyboardInterrupt, its summary printed), the
fixtures' teardown stops the Redis servers, cluster nodes and service processes the tests
started, with their Redis still answering, and nothing is left running; ``scripts/test`` ends
with 130 instead of going on to the cluster pass.

The terminal's Ctrl-C is SIGINT to the whole foreground process group; each run here starts in
a process group of its own and gets that SIGINT with ``os.killpg``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.procs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # whole pytest runs in subprocesses

TINY_CONFTEST = '''
import pytest
from tests.conftest import *  # noqa: F401,F403  the project's fixtures (redis_url, namespace, ...)
from tests.support.procs import Services
from tests.support.redis_server import sync_client


@pytest.fixture
def service(redis_url, namespace, tmp_path):
    """An agent loop as a separate process, started and stopped as the e2e fixtures do."""
    s = Services(redis_url=redis_url, namespace=namespace, model_url="http://127.0.0.1:9/v1", log_dir=tmp_path)
    s.start("loop", "agent-loop")
    yield s
    s.stop_all()


@pytest.fixture
def teardown_probe(redis_url):
    """Records whether the session's Redis still answered when this test's fixtures were torn down."""
    yield
    client = sync_client(redis_url)
    try:
        answer = "PONG" if client.ping() else "no"
    except Exception as exc:  # what an interrupted test's teardown met
        answer = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    with open(os.environ["TINY_OUT"] + "/teardown", "w") as f:
        f.write(answer)
'''

TINY_TESTS = '''
import os
import time

import redis

from agentstream.wire.keys import Keys
from tests.support.redis_server import sync_client

OUT = os.environ["TINY_OUT"]


def _server_pids(client):
    """The redis-server process of every node (INFO server's process_id)."""
    if hasattr(client, "get_nodes"):  # a Redis Cluster
        pids = []
        for node in client.get_nodes():
            one = redis.Redis(host=node.host, port=node.port)
            try:
                pids.append(one.info("server")["process_id"])
            finally:
                one.close()
        return pids
    return [client.info("server")["process_id"]]


def test_interrupted(redis_url, namespace, service, teardown_probe):
    client = sync_client(redis_url)
    try:
        keys = Keys(namespace, int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1))
        deadline = time.monotonic() + 60
        while not all(client.exists(s) for s in keys.partitions_of(keys.turns)):  # the loop's groups exist: it runs
            assert service.procs["loop"].poll() is None, service.log("loop")
            assert time.monotonic() < deadline, "the agent loop did not start"
            time.sleep(0.1)
        pids = _server_pids(client) + [service.procs["loop"].pid]
    finally:
        client.close()
    with open(OUT + "/pids", "w") as f:
        f.write(" ".join(map(str, pids)))
    print("READY", flush=True)
    time.sleep(120)  # Ctrl-C arrives here


def test_after_the_interrupted_one(redis_url):
    with open(OUT + "/after", "w") as f:
        f.write("ran")
'''


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after ``timeout_s`` seconds (an empty list once all have exited)."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("redis_kind", ["single", "cluster"])
def test_ctrl_c_stops_pytest_and_the_fixtures_stop_every_server_and_service(tmp_path, redis_kind):
    suite = tmp_path / "suite"
    out = tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "conftest.py").write_text(TINY_CONFTEST)
    (suite / "test_tiny.py").write_text(TINY_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "AGENTSTREAM_"))}
    env.update(
        PYTHONPATH=str(ROOT), TINY_OUT=str(out), DOCKER_HOST="unix:///nonexistent/docker.sock"
    )  # a local redis-server
    if redis_kind == "cluster":
        env["AGENTSTREAM_TEST_REDIS"] = "cluster"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "--rootdir",
            str(suite),
            str(suite),
        ],
        cwd=suite,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    pids: list[int] = []
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while not lines or "READY" not in lines[-1]:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines) + proc.communicate()[0]
            lines.append(line)
        pids = [int(p) for p in (out / "pids").read_text().split()]
        assert len(pids) == (4 if redis_kind == "cluster" else 2), pids
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        output = "".join(lines) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, output  # pytest's "interrupted"
    assert output.count("KeyboardInterrupt !!!") == 1, output  # one interruption, reported once
    assert "Error" not in output.replace("KeyboardInterrupt", ""), output
    assert (out / "teardown").read_text() == "PONG", output  # the teardown had its Redis
    assert not (out / "after").exists(), "a test ran after Ctrl-C"
    assert not _gone_within(pids, 15), f"still running after pytest stopped: {_gone_within(pids, 0)} of {pids}"


STUB_PYTHON = """#!/usr/bin/env bash
# pytest, as far as scripts/test can tell: it records each run, and the first one waits for
# Ctrl-C, which it handles (its summary) and exits 2, as pytest does
echo "$*" >> "$STUB_CALLS"
if [ "$(wc -l < "$STUB_CALLS")" -gt 1 ]; then exit 0; fi
sleep 60 &  # (a background job of a script ignores SIGINT: the trap stops it)
trap 'kill $! 2>/dev/null; echo "stub pytest: KeyboardInterrupt"; exit 2' INT
echo READY
wait
"""


def test_ctrl_c_ends_scripts_test_without_its_cluster_pass(tmp_path):
    """scripts/test itself, run by bash without arguments (the whole suite, then the cluster
    pass), with its bootstrap and pytest stood in for: Ctrl-C during the first pass ends it
    with 130, and no second pass starts."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test", root / "scripts" / "test")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in {
        "python": STUB_PYTHON,
        **dict.fromkeys(("apt-get", "ruff", "mypy"), "#!/bin/sh\nexit 0\n"),
    }.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    (root / "scripts" / "bootstrap").write_text("#!/bin/sh\nexit 0\n")
    (root / "scripts" / "bootstrap").chmod(0o755)
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "activate").write_text(f'PATH="{stubs}:$PATH"\n')
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTREAM_")}
    env.update(STUB_CALLS=str(calls), PATH=f"{stubs}:{env.get('PATH', '')}")
    proc = subprocess.Popen(
        ["bash", str(root / "scripts" / "test")],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.strip() == "READY", first + proc.communicate(timeout=30)[0]
        os.killpg(proc.pid, signal.SIGINT)
        output = first + proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output
    assert "stub pytest: KeyboardInterrupt" in output, output
    runs = calls.read_text().splitlines()
    assert len(runs) == 1 and runs[0].startswith("-m pytest tests"), runs  # no cluster pass after it
