"""The docs site builds in strict mode (a broken link, anchor or reference fails), with its
reference parts made from the code (scripts/docs_reference.py, the mkdocs hook)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentstream
from agentstream.ops.settings import Settings
from agentstream.wire.failures import FailureCode
from tests.support import docs

spec = importlib.util.spec_from_file_location("docs_reference", docs.ROOT / "scripts" / "docs_reference.py")
assert spec is not None and spec.loader is not None
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=docs.ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    settings_page = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    assert "AGENTSTREAM_FOLD_CACHE_BYTES" in settings_page and "<!-- generated" not in settings_page


def test_every_setting_has_its_default_and_meaning() -> None:
    page = reference.settings_reference()
    for name in Settings.model_fields:
        variable = "REDIS_URL" if name == "redis_url" else name.upper()
        assert any(f"`{variable}`" in row or f"`AGENTSTREAM_{variable}`" in row for row in page.splitlines())
    row = next(r for r in page.splitlines() if r.startswith("| `AGENTSTREAM_MIN_IDLE_MS`"))
    assert "| `60000` |" in row and "claimed" in row


def test_a_setting_without_a_documented_meaning_fails_the_build() -> None:
    bullets = reference._bullets("Variables:\n\n- ``AGENTSTREAM_A``: the first.\n  Two lines.\n")
    assert reference._meaning("AGENTSTREAM_A", bullets) == "the first. Two lines."
    with pytest.raises(reference.GenerationError, match="AGENTSTREAM_B has no meaning"):
        reference._meaning("AGENTSTREAM_B", bullets)


def test_every_failure_code_is_listed_with_its_meaning() -> None:
    page = reference.failure_codes_reference()
    for code in FailureCode:
        assert f"| `{code.value}` | " in page


def test_a_placeholder_without_a_generator_fails_the_build() -> None:
    with pytest.raises(reference.GenerationError, match="no generator 'nope'"):
        reference.expand("text\n<!-- generated: nope -->\n", "page.md")
    assert "| `bad_turn` |" in reference.expand("<!-- generated: failure-codes -->", "page.md")


def test_the_api_page_lists_every_exported_name() -> None:
    page = reference.api_reference()
    for name in agentstream.__all__:
        assert f"| `{name}` | " in page
    assert "| `Agent` | class: An agent" in page


def test_the_settings_page_names_every_variable_the_code_reads() -> None:
    """An AGENTSTREAM_* variable the code names (shared/, services/) is on the settings page,
    generated from the settings classes or in its table of the variables the commands read."""
    page = reference.expand((docs.DOCS / "reference" / "settings.md").read_text(), "reference/settings.md")
    named = set()
    for folder in ("shared", "services"):
        for source in (docs.ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r"\bAGENTSTREAM_[A-Z0-9_]*[A-Z0-9]\b", source.read_text()))
    missing = sorted(name for name in named if f"`{name}`" not in page)
    assert len(named) > 50 and not missing, f"docs/reference/settings.md does not name {missing}"
