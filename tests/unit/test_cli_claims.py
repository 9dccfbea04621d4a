"""The data folder's claims (issue 38): who may serve from a folder (pure), and a claim that lives
exactly as long as its process (a real second process holds one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from agentstream.cli.claims import Claim, FolderClaim, app_identity, refusal
from agentstream.errors import AgentStreamError

WEATHER = Claim(app="weather:app", app_id="/p/weather.py:app", command="dev", pid=41, cwd="/p")
DEMO = Claim(app="agentstream.demo.app:app", app_id="/s/demo/app.py:app", command="run", pid=42, cwd="/q")


def test_only_another_app_is_refused():
    assert refusal("~/f", WEATHER, []) is None
    assert refusal("~/f", WEATHER, [WEATHER.__class__(**{**WEATHER.__dict__, "pid": 7})]) is None
    said = refusal("~/f", DEMO, [WEATHER])
    assert said.startswith(
        "the data folder ~/f is in use by `agentstream dev --app weather:app` (pid 41, in /p), which serves another app"
    )
    assert "--data-dir" in said


def test_the_same_module_path_in_two_folders_is_two_apps(tmp_path):
    assert app_identity("weather:app", str(tmp_path / "a" / "weather.py")) != app_identity(
        "weather:app", str(tmp_path / "b" / "weather.py")
    )


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from agentstream.cli.claims import Claim, FolderClaim
    import os
    held = FolderClaim(Path(sys.argv[1]), Claim(app="weather:app", app_id="w", command="dev", pid=os.getpid(), cwd="/p")).take()
    print("claimed", flush=True)
    time.sleep(60)
    """
)


def test_a_claim_lives_as_long_as_its_process(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        mine = FolderClaim(tmp_path, Claim(app="demo:app", app_id="d", command="run", pid=1, cwd="/q"))
        with pytest.raises(AgentStreamError, match=rf"`agentstream dev --app weather:app` \(pid {holder.pid}, in /p\)"):
            mine.take()
        holder.kill()  # no handler runs: only the kernel drops its lock
        holder.wait()
        with mine:  # the claim of a dead process holds nothing
            files = sorted(p.name for p in (tmp_path / "claims").glob("*.json"))
            assert files == ["1.json"] and json.loads((tmp_path / "claims" / "1.json").read_text())["app"] == "demo:app"
        assert not list((tmp_path / "claims").glob("*.json"))
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
