"""Every code block of the docs (README.md and docs/) is run by a test or marked as not runnable.

The convention (docs/contributing.md, "Code blocks"): the line just before a fenced block is
``<!-- run by: tests/....py -->``, naming the test that runs or checks it (that test reads the
page, so it names the page), or ``<!-- not run: why -->``. Whatever the marker, a Python block
must compile, a JSON block parse and a YAML block load. The turn each snippet of "Publish a turn
from any backend" publishes is the wire's turn, checked against ``agentstream schema turn``.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from agentstream.wire import codec
from tests.support import docs

FENCE = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.S | re.M)
MARKER = re.compile(r"^<!-- (run by: (\S+)|not run: .+) -->$")
PAGES = ["README.md", *sorted(str(p.relative_to(docs.DOCS)) for p in docs.DOCS.rglob("*.md"))]
PUBLISH = "how-to/publish-a-turn.md"


def fenced(text: str) -> list[tuple[int, str, str, str]]:
    """``(line, language, body, the line before the fence)`` of each fenced block of ``text``."""
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((line, match.group(1), match.group(2), before))
    return found


@pytest.mark.parametrize("name", PAGES)
def test_every_block_is_run_by_a_test_or_marked_not_run(name: str) -> None:
    text = docs.page(name)
    problems = []
    for line, language, body, before in fenced(text):
        where = f"{name}:{line}"
        marker = MARKER.match(before)
        if marker is None:
            problems.append(f"{where}: no <!-- run by: tests/... --> or <!-- not run: why --> line before the block")
        elif marker.group(2):
            test = docs.ROOT / marker.group(2)
            if not test.is_file():
                problems.append(f"{where}: run by {marker.group(2)}, which does not exist")
            elif name not in test.read_text():
                problems.append(f"{where}: {marker.group(2)} does not read {name}")
        if language == "python":
            try:
                ast.parse(body, where)
            except SyntaxError as exc:
                problems.append(f"{where}: the Python block does not compile: {exc}")
        elif language == "json":
            try:
                json.loads(body)
            except ValueError as exc:
                problems.append(f"{where}: the JSON block does not parse: {exc}")
        elif language == "yaml":
            try:
                yaml.safe_load(body)
            except yaml.YAMLError as exc:
                problems.append(f"{where}: the YAML block does not load: {exc}")
    assert not problems, "\n".join(problems)


def test_no_indented_code_blocks() -> None:
    """An indented block escapes the check above: the docs use fenced ones only."""
    for name in PAGES:
        outside = FENCE.sub("", docs.page(name))
        blocks = re.findall(r"(?:^|\n\n)((?: {4}|\t)\S.*)", outside)
        blocks = [b for b in blocks if not re.match(r"\s*([-*]|\d+\.) ", b)]  # list continuations are not code
        assert not blocks, f"{name}: an indented code block: {blocks[0][:80]!r}; fence it and mark it"


def test_the_readmes_python_examples_are_the_docs_ones() -> None:
    """README.md's Python blocks are copies of docs pages' blocks, which their tests run."""
    in_pages = "\n".join(docs.page(name) for name in PAGES if name != "README.md")
    for _line, _language, body, _before in (b for b in fenced(docs.page("README.md")) if b[1] == "python"):
        assert body in in_pages, f"README.md's Python block is in no docs page (where its test runs it):\n{body}"


def publish_snippets() -> dict[str, str]:
    return {language: body for _line, language, body, _before in fenced(docs.page(PUBLISH))}


TURN_IN = {
    "python": r"^turn = (\{.*\})$",
    "javascript": r"^const turn = (\{.*\});$",
    "go": r"^\s*turn := `(\{.*\})`$",
    "java": r'"""\s*\n\s*(\{.*\})""";',
}


@pytest.mark.parametrize("language", sorted(TURN_IN))
def test_each_languages_turn_is_the_wires_turn(language: str) -> None:
    snippet = publish_snippets()[language]
    match = re.search(TURN_IN[language], snippet, re.M)
    assert match, f"{PUBLISH}: the {language} snippet's turn is not where this test looks for it"
    turn = ast.literal_eval(match.group(1)) if language == "python" else json.loads(match.group(1))
    jsonschema.validate(turn, codec.turn_message_schema())
    assert turn == ast.literal_eval(re.search(TURN_IN["python"], publish_snippets()["python"], re.M).group(1))
    for stream in ("agentstream:turns", "agentstream:replies"):
        assert stream in snippet, f"{PUBLISH}: the {language} snippet does not name {stream}"


def test_the_node_snippet_is_valid_javascript(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs)")
    script = tmp_path / "publish.mjs"
    script.write_text(publish_snippets()["javascript"])
    checked = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


def test_the_readmes_links_name_files_that_exist() -> None:
    """README.md is read outside the site (where mkdocs checks links): its relative links are checked here."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", docs.page("README.md"))
    missing = [t for t in targets if "://" not in t and not (docs.ROOT / t).exists()]
    assert targets and not missing, f"README.md links files that do not exist: {missing}"
