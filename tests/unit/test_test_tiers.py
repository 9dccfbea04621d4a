"""The two tiers of scripts/test: ``--quick`` runs the tests not marked slow, with the quick
Hypothesis profile and no cluster pass; without arguments, the whole suite and then the cluster
pass; with other arguments, pytest with those and nothing more. scripts/test runs with its
bootstrap and pytest stood in for (a stub records how it was called)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.examples import examples

ROOT = Path(__file__).resolve().parents[2]

STUB_PYTHON = """#!/usr/bin/env bash
# pytest, as far as scripts/test can tell: records its arguments and the Hypothesis profile
echo "${AGENTSTREAM_HYPOTHESIS_PROFILE:-(none)} $*" >> "$STUB_CALLS"
"""


def scripts_test(tmp_path: Path, *args: str) -> list[str]:
    """Run scripts/test with ``args`` → one line per pytest run: "<profile> <arguments>"."""
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
    done = subprocess.run(
        ["bash", str(root / "scripts" / "test"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return calls.read_text().splitlines()


def test_quick_runs_the_tests_not_marked_slow_with_the_quick_profile_and_no_cluster_pass(tmp_path):
    assert scripts_test(tmp_path, "--quick") == ["quick -m pytest tests -m not slow -n 4 --durations=25"]


def test_quick_passes_the_other_arguments_on(tmp_path):
    runs = scripts_test(tmp_path, "--quick", "-x", "tests/unit")
    assert runs == ["quick -m pytest tests -m not slow -n 4 --durations=25 -x tests/unit"]


def test_without_arguments_the_whole_suite_then_the_cluster_pass(tmp_path):
    runs = scripts_test(tmp_path)
    assert len(runs) == 2, runs
    assert runs[0] == "(none) -m pytest tests --durations=25"  # every test, the full examples
    assert runs[1].startswith("(none) -m pytest tests/integration/"), runs


def test_other_arguments_run_pytest_with_them_and_no_cluster_pass(tmp_path):
    assert scripts_test(tmp_path, "-x", "tests/unit") == ["(none) -m pytest tests --durations=25 -x tests/unit"]


def test_every_end_to_end_and_chaos_test_is_slow_and_the_others_only_when_marked():
    """The quick tier's selection, as pytest collects it (from one module of each kind)."""
    modules = [
        "tests/e2e/test_url_secrets.py",  # not marked itself: its folder is slow
        "tests/chaos/test_chaos.py",
        "tests/integration/test_cli_run.py",  # marked slow module-wide
        "tests/integration/test_store.py",
        "tests/unit/test_layers.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow", *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    quick = [line for line in done.stdout.splitlines() if "::" in line]
    assert {t.split("::")[0] for t in quick} == {"tests/integration/test_store.py", "tests/unit/test_layers.py"}


def test_the_slow_marker_is_registered():
    """`-m "not slow"` selects by a registered marker (pytest only warns about an unknown one)."""
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers), markers


@pytest.mark.parametrize(
    ("profile", "full", "drawn"), [("ci", 150, 150), ("quick", 150, 15), ("quick", 12, 1), ("quick", 3, 1)]
)
def test_examples_scale_with_the_profile(profile, full, drawn):
    settings.register_profile("before-test-examples", parent=settings())  # the profile in force, put back after
    settings.load_profile(profile)
    try:
        assert examples(full) == drawn
    finally:
        settings.load_profile("before-test-examples")


def test_examples_refuse_a_count_below_one():
    with pytest.raises(ValueError, match=r"examples\(full=0\)"):
        examples(0)
