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


def scripts_test(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run scripts/test with ``args`` (and ``env`` added to its environment) → one line per pytest
    run: "<profile> <arguments>"."""
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
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTREAM_")}
    environment.update(STUB_CALLS=str(calls), PATH=f"{stubs}:{environment.get('PATH', '')}", **(env or {}))
    done = subprocess.run(
        ["bash", str(root / "scripts" / "test"), *args],
        cwd=root,
        env=environment,
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
    assert runs[0] == "(none) -m pytest tests -n 4 --dist loadgroup --durations=25"  # every test, the full examples
    assert runs[1].startswith("(none) -m pytest -n 4 --dist loadgroup tests/integration/"), runs


def test_other_arguments_run_pytest_with_them_and_no_cluster_pass(tmp_path):
    runs = scripts_test(tmp_path, "-x", "tests/unit")
    assert runs == ["(none) -m pytest tests -n 4 --dist loadgroup --durations=25 -x tests/unit"]


def test_the_workers_are_as_many_as_agentstream_test_workers_says(tmp_path):
    runs = scripts_test(tmp_path, env={"AGENTSTREAM_TEST_WORKERS": "2"})
    assert [r.split(" -n ")[1].split()[0] for r in runs] == ["2", "2"], runs


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


TINY_INI = """[pytest]
markers =
    local_model: runs the real local model
    slow: left out of the quick tier
"""

TINY_CONFTEST = """
import os
import pytest
import tests.conftest
from tests.conftest import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401  the suite's hooks

tests.conftest.LOCAL_MODEL_TESTS = frozenset({"test_b_model.py", "test_c_model.py"})  # this suite's


@pytest.fixture(autouse=True)
def _record(request):
    with open(os.path.join(os.environ["TINY_OUT"], os.environ["PYTEST_XDIST_WORKER"]), "a") as f:
        f.write(request.node.name + "\\n")
"""


@pytest.mark.slow  # a whole pytest run with 2 workers in subprocesses (30 s and more on 2 busy cores)
def test_under_workers_the_local_model_tests_share_one_worker_and_the_longest_start_first(tmp_path):
    """The suite's collection hook (tests/conftest.py) in a tiny suite run as scripts/test runs the
    full one (2 pytest-xdist workers, --dist loadgroup): the local-model tests of two modules run
    on one worker, one after another and before anything else there; the other worker starts
    with a slow test, not a quick one collected before it."""
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "pytest.ini").write_text(TINY_INI)
    (suite / "conftest.py").write_text(TINY_CONFTEST)
    (suite / "test_a_quick.py").write_text("".join(f"def test_quick_{n}():\n    pass\n" for n in range(4)))
    for module in ("b", "c"):
        (suite / f"test_{module}_model.py").write_text(
            "import pytest\npytestmark = pytest.mark.local_model\n"
            + "".join(f"def test_model_{module}{n}():\n    pass\n" for n in range(2))
        )
    (suite / "test_d_slow.py").write_text(
        "import pytest\n" + "".join(f"@pytest.mark.slow\ndef test_slow_{n}():\n    pass\n" for n in range(2))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTSTREAM_", "PYTEST_"))}
    env.update(PYTHONPATH=str(ROOT), TINY_OUT=str(out))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {worker.name: worker.read_text().split() for worker in out.iterdir()}
    assert sorted(runs) == ["gw0", "gw1"], runs
    model = ["test_model_b0", "test_model_b1", "test_model_c0", "test_model_c1"]
    (with_model,) = [names for names in runs.values() if "test_model_b0" in names]
    (other,) = [names for names in runs.values() if names is not with_model]
    assert with_model[:4] == model, runs
    assert not set(model) & set(other), runs
    assert other[0].startswith("test_slow_"), runs
