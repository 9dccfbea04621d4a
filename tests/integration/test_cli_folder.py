"""Two commands on one data folder never take each other's turns (issue 38): `run` or `dev` of
another app is refused with one line naming the app that holds the folder, before its embedded
Redis starts; a command of the same app shares it; the claim of a killed command does not hold
the folder. A turn that an interrupted `run` published is cancelled, also when no agent loop
had taken it yet, so the next services on that Redis do not carry it on."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from tests.integration.test_cli_run import (
    AGENTSTREAM,
    APP,
    RunProcess,
    _still_running,
    agentstream,
    clean_env,
)
from tests.support.procs import ROOT
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.integration

DEMO = ["--app", "agentstream.demo.app:app"]


class DevProcess:
    """`agentstream dev` in a process group of its own, its stderr in a file."""

    def __init__(self, tmp_path, args: list[str], env: dict[str, str]):
        self.err = tmp_path / "dev.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [*AGENTSTREAM, "dev", *args],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, f"dev exited before it was ready: {self.err.read_text()[-3000:]}"
            if line.startswith("# ready"):
                return
        raise AssertionError(f"dev not ready within {timeout_s:g} s: {self.err.read_text()[-3000:]}")

    def redis_pid(self) -> int:
        return int(re.search(r"embedded Redis \(pid (\d+)\)", self.err.read_text()).group(1))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()


def test_a_command_of_another_app_is_refused_the_folder_and_one_of_the_same_app_shares_it(tmp_path):
    data = tmp_path / "data"
    with ScriptedModelServer() as model:  # the calculator rule
        env = clean_env(
            OPENAI_BASE_URL=model.base_url,
            OPENAI_MODEL="scripted-model",
            AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false}',
            AGENTSTREAM_BLOCK_MS="100",
            AGENTSTREAM_SHUTDOWN_GRACE_S="2",
            XDG_CACHE_HOME=str(tmp_path / "cache"),
        )
        dev = DevProcess(tmp_path, [*APP, "--data-dir", str(data)], env)
        redis_pid = None
        try:
            dev.wait_ready()
            redis_pid = dev.redis_pid()
            # another app on the folder: one line naming who holds it, before its Redis or services start
            other = agentstream("run", "What is 2 + 3?", *DEMO, "--data-dir", str(data), env=env, timeout_s=120)
            assert other.returncode == 2, other.stderr[-3000:]
            lines = other.stderr.strip().splitlines()
            assert len(lines) == 1 and "embedded Redis" not in other.stderr, other.stderr
            assert (
                f"is in use by `agentstream dev --app tests.support.apps:app` (pid {dev.proc.pid}, in {ROOT})"
                in lines[0]
            ), lines[0]
            assert "--data-dir" in lines[0]
            other_dev = agentstream("dev", *DEMO, "--data-dir", str(data), env=env, timeout_s=120)
            assert other_dev.returncode == 2 and "is in use by `agentstream dev" in other_dev.stderr, other_dev.stderr
            # the same app shares it (its services are alike)
            same = agentstream(
                "run", "What is 2 + 3?", *APP, "--agent", "calc", "--data-dir", str(data), env=env, timeout_s=180
            )
            assert same.returncode == 0 and "✓ answer: The answer is 5." in same.stdout, same.stderr[-3000:]
            # kill -9 of the holder: its claim goes with it
            os.kill(dev.proc.pid, signal.SIGKILL)
            dev.proc.wait()
            assert not _still_running({"embedded Redis": redis_pid}, timeout_s=30)  # its guard stopped it
        finally:
            dev.stop()
            if redis_pid is not None and _still_running({"r": redis_pid}, 0):
                os.kill(redis_pid, signal.SIGKILL)
        after = agentstream("run", "What is 2 + 3?", *DEMO, "--data-dir", str(data), env=env, timeout_s=180)
    assert after.returncode == 0 and "✓ answer: 5" in after.stdout, after.stdout + after.stderr[-3000:]
    assert [p.name for p in (data / "claims").glob("*.json")] == []  # each command removed its own


def test_an_interrupted_run_cancels_the_turn_no_agent_loop_had_taken_and_nothing_carries_it_on(
    tmp_path, redis_url, namespace
):
    """The agent loop is stopped (SIGSTOP) before the turn is published, so no service has taken
    it when Ctrl-C comes: run publishes a cancel naming the turn, and services started later on
    the same Redis end the turn as cancelled instead of answering it."""
    with ScriptedModelServer(parallel_rule) as model:
        env = clean_env(
            REDIS_URL=redis_url,
            AGENTSTREAM_NAMESPACE=namespace,
            OPENAI_BASE_URL=model.base_url,
            OPENAI_MODEL="scripted-model",
            AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false}',
            AGENTSTREAM_SHUTDOWN_GRACE_S="1",
            AGENTSTREAM_BLOCK_MS="100",
        )
        run = RunProcess(tmp_path, ["do: work(1)", *APP, "--agent", "plan", "--timeout-s", "120"], env)
        pids: dict[str, int] = {}
        try:
            run.wait_for(lambda: "agent-loop pid" in run.stderr(), "the services' pids")
            found = re.findall(r"(agent-loop|tool-worker|delegation|compaction) pid (\d+)", run.stderr())
            pids = {name: int(pid) for name, pid in found}
            psutil.Process(pids["agent-loop"]).suspend()  # it takes nothing from here on
            run.wait_for(lambda: re.search(r"^trace [0-9a-f]{32}$", run.stderr(), re.M), "the trace id")
            trace_id = re.search(r"^trace ([0-9a-f]{32})$", run.stderr(), re.M).group(1)
            time.sleep(0.5)  # the turn is on the turns stream
            os.killpg(run.proc.pid, signal.SIGINT)
            code = run.wait(timeout_s=60)
        finally:
            if run.proc.poll() is None or _still_running(pids, 0):
                run.kill_leftovers(pids)
        err = run.stderr()
        assert code == 130, err[-3000:]
        assert "stopping: cancelling turn" in err and "its cancel is recorded" in err, err[-3000:]
        assert not model.requests  # nobody answered it
        # later services on the same Redis: the turn ends cancelled, with no model call
        later = subprocess.Popen(
            [*AGENTSTREAM, "dev", *APP],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            shown = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                shown = agentstream("trace", "show", trace_id, env=env, timeout_s=60)
                if "✗ turn failed" in shown.stdout or "✓ answer" in shown.stdout:
                    break
                time.sleep(0.5)
        finally:
            os.killpg(later.pid, signal.SIGTERM)
            later.wait(timeout=30)
    assert "✗ turn failed (cancelled): the turn was cancelled by agentstream run" in shown.stdout, shown.stdout
    assert not model.requests, "a service carried the interrupted turn on"
