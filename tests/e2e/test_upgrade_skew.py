"""Version skew during a rolling update: the previous release's services (git tag v0.1.0, run from
an export of that tag) beside this checkout's, on one Redis and one namespace, as a Deployment's
RollingUpdate runs them for a while. Every turn published meanwhile is answered once, whichever
version took each step, and the traces either version wrote read back with this version's codec.
Then the old services stop (the rollout ends) and the new ones answer the same conversations."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentstream.wire.events import TurnEnded, TurnFailed
from tests.support.procs import ROOT, publish_turn, trace_events, wait_replies
from tests.support.redis_server import kill_left_running, sync_client
from tests.support.scripted_model import ScriptedModelServer, parallel_rule

pytestmark = pytest.mark.e2e

PREVIOUS = "40632d39253ea6bbb6f4124da2bdf637e94a17b9"
"""The release before this one (v0.1.0, by its commit: a checkout may come without tags): the
version a rolling update replaces."""


def export_release(tag: str, into: Path) -> Path:
    """The tree of ``tag`` (git archive) under ``into``, with an import folder that maps the
    package names to it as an install would (agentstream, agentstream_services, agentstream_prompts)
    → that folder; its tree is its parent."""
    tree = into / tag
    archive = into / f"{tag}.tar"
    proc = subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), tag], cwd=ROOT, capture_output=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot export {tag} (a shallow clone? git fetch --unshallow): {proc.stderr.decode()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    imports = tree / ".imports"
    imports.mkdir()
    for name, folder in (
        ("agentstream", "shared/agentstream"),
        ("agentstream_services", "services"),
        ("agentstream_prompts", "prompts"),
    ):
        (imports / name).symlink_to(tree / folder)
    return imports


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_release(PREVIOUS, tmp_path_factory.mktemp("release"))


class Fleet:
    """Services of two versions: ``start(name, service, imports=None)`` runs this checkout's
    (``imports=None``) or the release whose import folder is given, each from its own tree."""

    def __init__(self, env: dict[str, str], logs: Path):
        self.env, self.logs, self.procs = env, logs, {}

    def start(self, name: str, service: str, imports: Path | None = None) -> None:
        tree = imports.parent if imports else ROOT
        path = [str(imports), str(tree)] if imports else [str(ROOT / "shared"), str(ROOT)]
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = (
            subprocess.Popen(
                [sys.executable, "-m", "agentstream", "serve", service, "--app", "tests.support.apps:app"],
                env={**self.env, "PYTHONPATH": os.pathsep.join(path), "AGENTSTREAM_CONSUMER": name},
                cwd=tree,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            log,
        )

    def imported_from(self, imports: Path | None = None) -> list[str]:
        """Where a process started as :meth:`start` starts it imports agentstream, its services
        and the test app from."""
        tree = imports.parent if imports else ROOT
        path = [str(imports), str(tree)] if imports else [str(ROOT / "shared"), str(ROOT)]
        code = "import agentstream, agentstream_services, tests.support.apps as a; "
        code += "print(agentstream.__file__, agentstream_services.__file__, a.__file__)"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**self.env, "PYTHONPATH": os.pathsep.join(path)},
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout.split()

    def stop(self, *names: str) -> None:
        for name in names:
            proc, log = self.procs.pop(name)
            proc.terminate()
            try:
                assert proc.wait(timeout=30) == 0, f"{name} exited {proc.returncode}:\n{self.log(name)[-3000:]}"
            finally:
                kill_left_running({proc})
                log.close()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc, _log in self.procs.values():
            proc.terminate()
        for proc, log in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        self.procs.clear()


@pytest.fixture
def fleet(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    with ScriptedModelServer(parallel_rule) as model:
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "AGENTSTREAM_NAMESPACE": namespace,
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_MODEL": "scripted-model",
            "AGENTSTREAM_BLOCK_MS": "100",
            "AGENTSTREAM_MIN_IDLE_MS": "1000",
            "AGENTSTREAM_LEASE_TTL_MS": "1000",
            "AGENTSTREAM_TRIM_INTERVAL_MS": "0",
        }
        f = Fleet(env, tmp_path)
        try:
            yield f
        finally:
            f.stop_all()


def test_the_previous_release_and_this_one_answer_every_turn_side_by_side(fleet, previous, redis_url, keys):
    client = sync_client(redis_url)
    tree = previous.parent.resolve()
    assert all(Path(f).resolve().is_relative_to(tree) for f in fleet.imported_from(previous)), "the old code runs"
    assert not any(Path(f).resolve().is_relative_to(tree) for f in fleet.imported_from())
    fleet.start("old-loop", "agent-loop", previous)
    fleet.start("old-tools", "tool-worker", previous)
    fleet.start("new-loop", "agent-loop")
    fleet.start("new-tools", "tool-worker")
    traces = [f"skew-{i}" for i in range(8)]
    turns = [(traces[i % 8], f"t{i}") for i in range(24)]
    for trace, turn in turns:
        publish_turn(client, keys, trace_id=trace, turn_id=turn, agent="plan", text=f"{turn} do: work(30) work(5)")
    replies = wait_replies(client, keys, len(turns), timeout_s=120)
    assert sorted(r.turn_id for r in replies) == sorted(t for _, t in turns), "each turn answered once"
    assert all(r.status == "ended" for r in replies), [r for r in replies if r.status != "ended"]
    # the rollout ends: the old version's pods go, the new one answers the same conversations
    fleet.stop("old-loop", "old-tools")
    for trace in traces:
        publish_turn(client, keys, trace_id=trace, turn_id=f"after-{trace}", agent="plan", text="again do: work(5)")
    replies = wait_replies(client, keys, len(turns) + len(traces), timeout_s=60)
    assert all(r.status == "ended" for r in replies)
    for trace in traces:
        events = trace_events(client, keys, trace)  # this version's codec reads what both wrote
        ends = [e for e in events if isinstance(e, (TurnEnded, TurnFailed))]
        assert len(ends) == 4 and all(isinstance(e, TurnEnded) for e in ends), trace
    for name in ("new-loop", "new-tools"):
        assert "Traceback" not in fleet.log(name), fleet.log(name)[-3000:]


def test_a_trace_written_by_a_newer_schema_is_refused_visibly(fleet, redis_url, keys):
    """What a worker does with a trace a newer release wrote in a schema above its own (a rollback
    after the new release wrote, or an old pod still running late in a rollout): the turn fails,
    its reply says which entry and "upgrade agentstream", the turn entry goes to its dead-letter
    stream (agentstream_dead_letters_total, the DeadLetters alert), and the trace is kept as it is."""
    from agentstream.wire.events import TRACE_SCHEMA_VERSION

    client = sync_client(redis_url)
    fleet.start("loop", "agent-loop")
    trace = "from-the-future"
    future = TRACE_SCHEMA_VERSION + 1
    written = client.xadd(keys.trace(trace), {"v": str(future), "e": '{"type":"turn_started","turn_id":"x"}'})
    publish_turn(client, keys, trace_id=trace, turn_id="t1", agent="plan", text="do: work(5)")
    (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    assert (reply.status, reply.code) == ("failed", "dead_letter")
    assert f"schema version {future}, newer than {TRACE_SCHEMA_VERSION}" in reply.reason
    assert "upgrade agentstream" in reply.reason
    turns = keys.turns_for(trace)
    assert client.xlen(keys.dead(turns)) == 1, "the turn entry is kept in its dead-letter stream"
    (first, *_) = client.xrange(keys.trace(trace))
    assert first[0] == written and first[1][b"v"] == str(future).encode(), "the newer entry is left as written"
