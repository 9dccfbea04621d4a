"""The docs site's pages (docs/) and README.md as tests read them: a page's text, a section of
it, its code blocks. A test that runs a page's example names the page with :func:`page`, so the
docs' code-block check (tests/unit/test_docs_blocks.py) can see that the test exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The Markdown source of ``docs/<name>`` (``"how-to/acls.md"``), or of README.md for ``"README.md"``."""
    return (ROOT / name if name == "README.md" else DOCS / name).read_text()


def all_pages() -> str:
    """README.md and every page under docs/, one text."""
    return "\n".join([page("README.md"), *(p.read_text() for p in sorted(DOCS.rglob("*.md")))])


def section(text: str, heading: str) -> str:
    """``text`` from just after ``heading`` (a whole heading line, e.g. ``"## Write your app"``) to
    the next heading of level 2 or deeper (a ``# `` line is a comment in a shell block).

    Raises:
        ValueError: no such heading.
    """
    match = re.search(rf"^{re.escape(heading)}$", text, re.M)
    if match is None:
        raise ValueError(f"no heading {heading!r}")
    rest = text[match.end() :]
    return re.split(r"\n##+ ", rest, maxsplit=1)[0]


def blocks(text: str, language: str) -> list[str]:
    """The bodies of ``text``'s fenced code blocks of ``language`` (```` ```python ````), in order."""
    return re.findall(rf"^```{re.escape(language)}\n(.*?)^```", text, re.S | re.M)
