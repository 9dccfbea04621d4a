"""The project's history reads: every commit since the checks began has a subject of at most 72
characters (the details go in the body), as `git log --oneline` and most tools show it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The first commit held to the rule: the formatting commit that started the machine checks.
FIRST_CHECKED = "33ee2a9"
SUBJECT_MAX_CHARS = 72
# Landed over the limit before the check ran on it; main's history is never rewritten.
LANDED_LONG = {"95ffdde"}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_commit_subjects_are_at_most_72_characters():
    try:
        _git("rev-parse", "--verify", f"{FIRST_CHECKED}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout that holds the project's history")
    log = _git("log", "--format=%h %s", f"{FIRST_CHECKED}^..HEAD")
    long = [
        line
        for line in log.splitlines()
        if len(line.split(" ", 1)[1]) > SUBJECT_MAX_CHARS and not any(line.startswith(h) for h in LANDED_LONG)
    ]
    assert not long, f"commit subjects over {SUBJECT_MAX_CHARS} characters (put the details in the body): {long}"
