"""Every app example of the docs pages, run on the default local model (SmolLM2-135M on llama.cpp),
gives a correct answer: each example's code is taken from its page (docs/) as written, loaded by an agent
loop and a tool worker (separate processes) on one local model server, and asked a question
(issue 13). Kept to one model server and one short turn per example: the local model is slow on
2 cores.

The demo app's ``agentstream run`` commands run as written (the command line taken from README.md),
pointed at the same model server and the test's Redis. Greedy decoding (every demo agent has
temperature 0); the checks are on what the answer says, not on its wording where the model writes it.

Not run here: the MCP example (it starts ``npx`` servers that need the network), the
``Testing your app`` tests (model doubles; tests/integration/test_testing_kit.py runs them), the
main job (tests/e2e/test_local_model.py runs it on the embedded defaults) and the gateway's
``curl`` turn (the same turn as the ``redis-cli`` one below, through the gateway's decoder)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentstream.cli.localmodel import LocalModelServer
from agentstream.wire import codec
from agentstream.wire.events import Compaction, TurnEnded
from tests.support import docs
from tests.support.procs import ROOT, Services, publish_turn, trace_events, wait_replies

pytestmark = [pytest.mark.e2e, pytest.mark.local_model]

README = docs.page("README.md")
PAGES = {
    "first-agent": docs.page("tutorials/first-agent.md"),
    "tools": docs.page("tutorials/tools-and-mcp.md"),
    "prompt-files": docs.page("how-to/prompt-files.md"),
    "subagents": docs.page("tutorials/subagents.md"),
    "publish": docs.page("how-to/publish-a-turn.md"),
}
DOCS = "\n".join(PAGES.values())
REPLY_S = 240.0  # a model call takes 1–40 s on 2 busy cores


def section(heading: str, where: str = "tools") -> str:
    """The section under ``heading`` of a docs page (``where``: a key of PAGES, or ``"README"``)."""
    return docs.section(README if where == "README" else PAGES[where], heading)


def python_block(heading: str, where: str = "tools") -> str:
    return re.search(r"```python\n(.*?)```", section(heading, where), re.S).group(1)


@pytest.fixture(scope="module")
def local_model() -> Iterator[LocalModelServer]:
    with LocalModelServer(ready_timeout_s=120) as server:
        yield server


@pytest.fixture
def run_example(local_model, redis_url, namespace, tmp_path):
    """``run_example(code, publish)`` → the reply of the turn ``publish(client, keys)`` sends to
    the services loading the README's ``code`` (an app module)."""
    started: list[Services] = []

    def run(
        code: str | None,
        publish,
        client,
        keys,
        *,
        app: str = "readme_example:app",
        services=("agent-loop", "tool-worker"),
        replies: int = 1,
    ):
        if code is not None:
            (tmp_path / "readme_example.py").write_text(code)
        s = Services(
            redis_url=redis_url,
            namespace=namespace,
            model_url=local_model.base_url,
            app=app,
            log_dir=tmp_path,
            extra_env={
                "OPENAI_MODEL": local_model.model or "",
                "PYTHONPATH": f"{tmp_path}:{ROOT}",
                "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(local_model.endpoint_options()),
            },
        )
        started.append(s)
        for service in services:
            s.start(service, service)
        publish(client, keys)
        got = wait_replies(client, keys, replies, timeout_s=REPLY_S * replies)
        return got[0] if replies == 1 else got

    yield run
    for s in started:
        s.stop_all()


def test_the_weather_app(run_example, client, keys):
    reply = run_example(
        python_block("## Write your app", "first-agent"),
        lambda c, k: publish_turn(
            c, k, trace_id="w-1", turn_id="t1", agent="weather", text="What is the weather in Paris?"
        ),
        client,
        keys,
    )
    assert reply.status == "ended" and reply.answer == "18C, cloudy in Paris", reply


def test_the_chat_turn_published_from_redis_cli(run_example, client, keys):
    text = section("## Typed inputs, tool states and per-turn settings")
    payload = re.search(r"^redis-cli XADD agentstream:turns '\*' turn '(.*)'$", text, re.M).group(1)
    reply = run_example(
        python_block("## Typed inputs, tool states and per-turn settings"),
        lambda c, k: c.xadd(k.turns, {"turn": payload}),
        client,
        keys,
    )
    assert reply.status == "ended" and reply.answer == "18C, cloudy in Oslo", reply


def test_the_prompt_file_and_its_cited_answer(run_example, client, keys):
    reply = run_example(
        python_block("# Prompt files, citations and the turn's model", "prompt-files"),
        lambda c, k: publish_turn(
            c, k, trace_id="hr-1", turn_id="t1", agent="hr", text="How many days of paid leave do staff get?"
        ),
        client,
        keys,
    )
    assert reply.status == "ended" and reply.answer == "Staff get 25 days of paid leave a year.", reply
    shown = json.loads(
        re.search(
            r"```json\n(.*?)```", section("# Prompt files, citations and the turn's model", "prompt-files"), re.S
        ).group(1)
    )
    assert [msgspec_builtins(c) for c in reply.citations] == shown["citations"]  # the reply the README shows
    events = [e for _, e in codec.decode_entries(client.xrange(keys.trace("hr-1")), trace_id="hr-1")]
    (ended,) = [e for e in events if isinstance(e, TurnEnded)]
    assert ended.citations == reply.citations and ended.answer_call  # in the trace too


def test_the_handbook_with_sources_and_citations(run_example, client, keys):
    reply = run_example(
        python_block("## Sources, citations and images"),
        lambda c, k: publish_turn(
            c, k, trace_id="src-1", turn_id="t1", agent="hr", text="How many days of paid leave do staff get?"
        ),
        client,
        keys,
    )
    assert reply.status == "ended" and reply.answer == "Staff get 25 days of paid leave a year.", reply
    assert [(c.number, c.id, c.title, c.url) for c in reply.citations] == [
        (2, "hb:leave#0", "Leave policy", "https://handbook.example/leave")
    ]


def test_the_apps_own_element_types(run_example, client, keys):
    reply = run_example(
        python_block("## Your own element and event types"),
        lambda c, k: publish_turn(
            c, k, trace_id="desk-1", turn_id="t1", agent="desk", text="What is the status of ticket 42?"
        ),
        client,
        keys,
    )
    assert reply.status == "ended" and reply.answer == "Ticket T-42 is open: The printer on floor 2 is broken.", reply


def test_the_demos_manager_hands_the_question_to_a_subagent(run_example, client, keys):
    command = re.search(r'^agentstream run --agent manager "(.*?)"', DOCS, re.M).group(1)
    reply = run_example(
        None,
        lambda c, k: publish_turn(c, k, trace_id="mgr-1", turn_id="t1", agent="manager", text=command),
        client,
        keys,
        app="agentstream.demo.app:app",
        services=("agent-loop", "tool-worker", "delegation"),
    )
    assert command == "What is 1234 * 5678?"
    assert reply.status == "ended" and reply.answer == "7006652", reply  # the subagent's calculator, exactly


def msgspec_builtins(value):
    import msgspec

    return json.loads(msgspec.json.encode(value))


def readme_command(prefix: str) -> str:
    """The README's command line that starts with ``prefix`` (up to its comment)."""
    line = re.search(rf"^({re.escape(prefix)}.*?)(?:\s+#.*)?$", DOCS, re.M).group(1)
    return line.strip()


@pytest.fixture
def run_command(local_model, redis_url, namespace, tmp_path):
    """``run_command(line)`` → the finished process of an ``agentstream ...`` README command line, run as
    written (its own services, as separate processes) on the module's model server and the test's Redis."""

    def run(line: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        argv = shlex.split(line)
        assert argv[0] == "agentstream", line
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_"))}
        env.update(
            {
                "REDIS_URL": redis_url,
                "AGENTSTREAM_NAMESPACE": namespace,
                "XDG_CACHE_HOME": str(tmp_path),
                "OPENAI_BASE_URL": local_model.base_url,
                "OPENAI_MODEL": local_model.model or "",
                "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(local_model.endpoint_options()),
            }
        )
        proc = subprocess.run(
            [sys.executable, "-m", "agentstream", *argv[1:]],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=2 * REPLY_S,
        )
        assert proc.returncode == 0, f"{line}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
        return proc

    return run


def answers(out: str) -> list[str]:
    """The answers ``agentstream run`` printed (``✓ answer: ...``, up to its sources or the next step's line)."""
    return [
        a.strip()
        for a in re.findall(
            r"^✓ answer(?: \([^)]*\))?: (.*?)(?=^[»✓·⋯]|^  \[\d+\] |^fingerprints|\Z)", out, re.M | re.S
        )
    ]


def test_the_first_agent_runs_as_the_tutorial_shows_and_its_trace_reads_back(run_command, tmp_path):
    """docs/tutorials/first-agent.md: its app saved as weather.py, the `run` line run from that
    folder gives the answer the page shows; `trace show` of the trace it printed shows it too."""
    page = PAGES["first-agent"]
    project = tmp_path / "project"
    project.mkdir()
    (project / "weather.py").write_text(python_block("## Write your app", "first-agent"))
    line = re.search(r"^(agentstream run --app weather:app .*)$", page, re.M).group(1)
    shown = re.search(r"```sh\n" + re.escape(line) + r"\n# ✓ answer: (.*)\n", page).group(1)
    assert f"```sh\n{line}\n# ✓ answer: {shown}\n" in README  # README.md shows the same run
    proc = run_command(line, cwd=project)
    assert answers(proc.stdout) == [shown], proc.stdout
    trace_id = re.search(r"^trace ([0-9a-f]+)$", proc.stderr + proc.stdout, re.M).group(1)
    assert f"✓ answer: {shown}" in run_command(f"agentstream trace show {trace_id}", cwd=project).stdout


def test_the_demos_docs_agent_answers_from_the_documentation(run_command):
    line = readme_command("agentstream run --agent docs")
    out = run_command(line).stdout
    (answer,) = answers(out)
    # the passage of round()'s documentation, and the source it came from, where to read it
    assert re.search(r"\bround", answer, re.I) and re.search(r"digit|precision|decimal", answer, re.I), out
    assert re.search(
        r"^  \[\d+\] round — https://docs\.python\.org/3\.\d+/library/functions\.html#round$", out, re.M
    ), out
    shown = re.search(r"```sh\n" + re.escape(line) + r"\n# ✓ answer: (.*)\n", DOCS).group(1)
    assert answer == shown  # the answer the README shows


def test_the_demos_notes_agent_compacts_its_conversation(run_command, client, keys):
    line = readme_command("agentstream run --agent notes")
    turns = int(re.search(r"--turns (\d+)", line).group(1))
    proc = run_command(line)
    out = proc.stdout
    said = answers(out)
    assert len(said) == turns and all(re.search(r"\bpython\b", a, re.I) for a in said), (
        out
    )  # each answer is about Python
    trace_id = re.search(r"^trace ([0-9a-f]+)$", proc.stderr, re.M).group(1)
    compactions = [e for e in trace_events(client, keys, trace_id) if isinstance(e, Compaction)]
    assert compactions and compactions[0].summary.strip() and compactions[0].replaced_turns == 1, (
        compactions
    )  # the second turn compacted the first


def test_the_demo_turn_published_from_redis_cli_and_the_demos_other_question(run_example, client, keys):
    payload = re.search(r"^redis-cli XADD agentstream:turns '\*' turn '(.*\"agent\":\"demo\".*)'$", DOCS, re.M).group(1)
    question = re.search(
        r'^\./scripts/demo "(.*?)"$', section("## The two commands", "README").split("OPENAI_MODEL=", 1)[1], re.M
    ).group(1)

    def publish(c, k):
        c.xadd(k.turns, {"turn": payload})
        publish_turn(c, k, trace_id="demo-2", turn_id="t1", agent="demo", text=question)

    replies = run_example(None, publish, client, keys, app="agentstream.demo.app:app", replies=2)
    by_trace = {r.trace_id: r for r in replies}
    assert json.loads(payload)["text"] == "What is 12 * 12?" and question == "What is 2**20 / 7?"
    twelve, seventh = by_trace["conv-42"], by_trace["demo-2"]
    assert twelve.status == "ended" and twelve.answer == "144" and twelve.metadata == {"user": "u7"}, twelve
    assert seventh.status == "ended" and seventh.answer.startswith("149796.571"), (
        seventh
    )  # exact: the calculator's result


def test_a_turn_with_a_document_and_an_image_published_from_redis_cli(run_example, client, keys):
    payload = re.search(r"^redis-cli XADD agentstream:turns '\*' turn '(.*\"elements\".*)'$", DOCS, re.M).group(1)
    reply = run_example(
        python_block("## Sources, citations and images"), lambda c, k: c.xadd(k.turns, {"turn": payload}), client, keys
    )
    assert reply.status == "ended" and reply.answer == "Staff get 25 days of paid leave a year.", (
        reply
    )  # what the policy says
    assert [(c.id, c.title) for c in reply.citations] == [("hb:leave#0", "Leave policy")]
