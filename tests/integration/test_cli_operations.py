"""The CLI for the people who run it (issue 15): --version, completion, --log-level choices,
environment variables for serve's options, one-line errors with exit code 2 for bad settings,
the app found from the current directory and imported before anything starts, `run --agent
unknown` failing first, cancel telling an unknown trace from an idle one, and `dev`'s ready line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from agentstream.cli import commands as cli_module
from agentstream.cli.commands import cli
from agentstream.wire.events import TurnEnded, TurnInput

pytestmark = pytest.mark.integration

AGENTSTREAM = [sys.executable, "-m", "agentstream"]


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, env=env or {})


def test_version_and_completion():
    result = invoke(["--version"])
    assert result.exit_code == 0 and result.output.startswith("agentstream 0.") and "Python 3." in result.output
    help_text = invoke(["--help"]).output
    assert "--install-completion" in help_text and "--show-completion" in help_text
    assert "Exit codes" in help_text and "2 a usage or configuration error" in " ".join(help_text.split())


@pytest.mark.parametrize("command", [["serve", "agent-loop"], ["dev"], ["run", "hi"]])
def test_log_level_has_choices_and_refuses_others(command):
    result = invoke([*command, "--log-level", "LOUD"])
    assert result.exit_code == 2 and "LOUD" in result.output and "is not one of" in result.output


def test_every_serve_option_has_an_environment_variable(monkeypatch):
    seen = {}

    async def fake_serve(services, app_path, queues, settings, **_):
        seen.update(services=services, app=app_path, queues=queues)

    monkeypatch.setattr(cli_module, "_serve", fake_serve)
    env = {
        "AGENTSTREAM_APP": "tests.support.apps:app",
        "AGENTSTREAM_QUEUES": "browser heavy",
        "AGENTSTREAM_LOG_LEVEL": "debug",
    }
    result = invoke(["serve", "tool-worker"], env)
    assert result.exit_code == 0, result.output
    assert seen["app"] == "tests.support.apps:app" and seen["queues"] == ["browser", "heavy"]
    import logging

    assert logging.getLogger().level == logging.DEBUG


@pytest.mark.parametrize(
    "env, says",
    [
        ({"REDIS_URL": "redis://127.0.0.1:1/0", "AGENTSTREAM_CONCURRENCY": "lots"}, "AGENTSTREAM_CONCURRENCY='lots'"),
        ({"REDIS_URL": "redis://127.0.0.1:1/0", "AGENTSTREAM_CONCURRENCY": "0"}, "AGENTSTREAM_CONCURRENCY='0'"),
        ({"REDIS_URL": "nonsense"}, "REDIS_URL 'nonsense' is not a Redis URL"),
        ({"REDIS_URL": "redis://127.0.0.1:1/0", "AGENTSTREAM_BUSY_POLICY": "maybe"}, "AGENTSTREAM_BUSY_POLICY='maybe'"),
    ],
    ids=["concurrency not a number", "concurrency 0", "bad url", "bad busy policy"],
)
def test_bad_settings_print_one_line_and_exit_2(env, says):
    proc = subprocess.run(
        [*AGENTSTREAM, "serve", "tool-worker"], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_the_app_module_is_found_from_the_current_directory(tmp_path):
    (tmp_path / "myagents.py").write_text(
        textwrap.dedent("""
        from agentstream import Agent, App
        app = App(agents=[Agent(name="here", system_prompt="s")])
    """)
    )
    # the console script (not python -m): sys.path does not start with the current directory
    code = (
        "import sys; from agentstream.cli.commands import main; sys.argv = ['agentstream', 'run', 'hi', "
        "'--app', 'myagents:app', '--agent', 'nope']; main()"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    # -I leaves the current directory off sys.path: only load_app's lookup can find myagents
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "has no agent 'nope' (its agents: here)" in proc.stderr, proc.stderr


def test_run_with_an_unknown_agent_fails_before_starting_anything(monkeypatch):
    started = []
    monkeypatch.setattr(cli_module, "_environment", lambda settings: started.append("environment"))
    monkeypatch.setattr(cli_module.subprocess, "Popen", lambda *a, **k: started.append("process"))
    result = invoke(["run", "hi", "--app", "tests.support.apps:app", "--agent", "unknown"])
    assert result.exit_code == 2 and "has no agent 'unknown'" in result.output
    assert started == [], "nothing may start for a turn that cannot run"


def test_a_bad_app_fails_dev_before_the_embedded_redis_or_the_local_model(monkeypatch):
    monkeypatch.setattr(cli_module, "_environment", lambda settings: pytest.fail("started the environment"))
    result = invoke(["dev", "--app", "no.such.module:app"])
    assert result.exit_code == 2 and "cannot import app module 'no.such.module'" in result.output


async def test_cancel_tells_an_unknown_trace_from_an_idle_one(redis_url, namespace, store):
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    unknown = await asyncio.to_thread(invoke, ["cancel", "never-seen", "--wait-s", "0"], env)
    assert unknown.exit_code == 1 and "trace 'never-seen' is unknown: it has no events" in unknown.output
    await store.append("idle", TurnInput(turn_id="t1", agent="calc", text="hi"))
    await store.append("idle", TurnEnded(turn_id="t1", answer="hello"))
    idle = await asyncio.to_thread(invoke, ["cancel", "idle", "--wait-s", "0"], env)
    assert idle.exit_code == 1 and "trace 'idle' is idle: no turn is running (its last turn t1 ended)" in idle.output


def test_dev_prints_one_ready_line_after_the_export_lines_on_stdout(redis_url, namespace, scripted_model):
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "AGENTSTREAM_NAMESPACE": namespace,
        "OPENAI_BASE_URL": scripted_model.base_url,
        "OPENAI_MODEL": "scripted-model",
        "AGENTSTREAM_BLOCK_MS": "50",
    }
    proc = subprocess.Popen(
        [*AGENTSTREAM, "dev", "--app", "tests.support.apps:app"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("# ready"):
                break
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        proc.stdout.close()
    ready = [line for line in lines if line.startswith("# ready")]
    assert len(ready) == 1, lines
    exports = [i for i, line in enumerate(lines) if line.startswith("export ")]
    assert exports and max(exports) < lines.index(ready[0]), lines
    assert f"export REDIS_URL={redis_url}" in lines
    assert "agent-loop" in ready[0] and "tool-worker" in ready[0]


async def test_ask_prints_the_trace_id_before_the_steps_and_the_answer_as_run_does(
    redis_url, namespace, scripted_model
):
    """`ask` and `run` both print `trace <id>` first (stderr), then the steps and the answer, so a
    person (or a script reading both streams in order) knows the id before anything else."""
    from tests.support import apps
    from tests.support.inprocess import InProcess

    services = InProcess(apps.app, redis_url, namespace, scripted_model.base_url)
    await services.start("p1", "agent-loop", "tool-worker")
    try:
        # unbuffered: both streams reach the one pipe in the order they were written
        env = {**os.environ, "REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace, "PYTHONUNBUFFERED": "1"}
        asked = await asyncio.to_thread(
            subprocess.run,
            [*AGENTSTREAM, "ask", "What is 2 + 3?", "--agent", "calc", "--timeout-s", "60"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )
    finally:
        await services.stop_all()
    lines = asked.stdout.splitlines()
    assert asked.returncode == 0, asked.stdout
    traced = [i for i, line in enumerate(lines) if line.startswith("trace ")]
    answered = [i for i, line in enumerate(lines) if line.startswith("✓ answer:")]
    assert traced == [0] and answered and traced[0] < answered[0], lines


async def test_trace_verify_in_another_folder_says_the_recorded_app_path_is_relative(redis_url, namespace, redis, keys):
    """The agent loops recorded `weatherapp:app`, found in the folder they ran in; `trace verify`
    run elsewhere cannot import it and says why, and what to do."""
    from agentstream.runtime import service_settings

    await service_settings.record(redis, keys, "weatherapp:app", {})
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    result = await asyncio.to_thread(invoke, ["trace", "verify", "t1"], env)
    assert result.exit_code == 2, result.output
    assert "cannot import app module 'weatherapp'" in result.output
    assert (
        f"the app path 'weatherapp:app' that the agent loops recorded is relative to the folder they ran in, and "
        f"this command runs in {os.getcwd()}: run it from that folder, or give --app" in " ".join(result.output.split())
    ), result.output


async def test_ask_without_an_agent_asks_the_only_agent_of_the_app_the_agent_loops_serve(
    redis_url, namespace, redis, keys
):
    """`dev --app weather:app` then `ask "..."`: the agent is the served app's only one (it was
    `demo`, which that app does not have); an app of several agents is told to name one."""
    from agentstream.runtime import service_settings

    served = []

    async def no_turn(settings, agent, text, trace_id, timeout_s, echo=None, **_):
        served.append(agent)
        return TurnEnded(turn_id="t", answer="ok")

    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_module, "_ask", no_turn)
        await service_settings.record(redis, keys, "tests.support.compaction_apps:app", {}, now_ms=1)
        none = await asyncio.to_thread(invoke, ["ask", "hi"], env)
        await service_settings.record(redis, keys, "tests.support.apps:app", {}, now_ms=2)
        several = await asyncio.to_thread(invoke, ["ask", "hi"], env)
    assert several.exit_code == 2 and "name the agent with --agent" in several.output, several.output
    assert "has 2 agents (calc, plan)" in several.output
    assert none.exit_code == 0 and served == ["chatty"], none.output
