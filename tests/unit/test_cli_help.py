"""Every command's ``--help`` as a person reads it (issue 38): no reStructuredText markup
(double backquotes, ``:mod:``-style roles), no line broken in mid-sentence, and ``run --help``
says what ``run`` starts."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.cli.helptext import markup_in, plain_help


def _commands() -> list[tuple[list[str], Any]]:
    """Every command and group of the CLI with its words (``["trace", "show"]``)."""
    found: list[tuple[list[str], Any]] = []

    def walk(words: list[str], command: Any) -> None:
        found.append((words, command))
        if hasattr(command, "commands"):  # a group (typer's own click, not the click package)
            for name, sub in command.commands.items():
                walk([*words, name], sub)

    walk([], typer.main.get_command(cli))
    return found


COMMANDS = _commands()


def _help(words: list[str]) -> str:
    result = CliRunner().invoke(cli, [*words, "--help"], env={"COLUMNS": "4000", "TERMINAL_WIDTH": "4000"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_has_the_commands_a_newcomer_meets():
    names = {" ".join(words) for words, _ in COMMANDS}
    assert {"run", "dev", "ask", "serve", "trace show", "trace verify", "schema turn"} <= names


@pytest.mark.parametrize("words", [w for w, _ in COMMANDS], ids=lambda w: " ".join(w) or "agentstream")
def test_a_help_has_no_rest_markup_and_no_line_broken_mid_sentence(words):
    shown = _help(words)
    assert not markup_in(shown), markup_in(shown)
    command = dict((" ".join(w), c) for w, c in COMMANDS)[" ".join(words)]
    for param in command.params:
        assert not markup_in(getattr(param, "help", None) or ""), (param.name, param.help)
    # the description (above the boxes of arguments and options), at a width that wraps nothing:
    # every line ends a sentence or a list item, never in the middle of one
    description = shown.split("╭")[0].splitlines()
    for line in description:
        text = line.strip()
        if text and not text.startswith("Usage:"):
            assert text[-1] in ".:;)?!", f"a line broken mid-sentence in `{' '.join(words)} --help`: {text!r}"


def test_run_help_says_what_run_starts():
    shown = " ".join(_help(["run"]).split())
    for part in ("embedded", "local SmolLM2", "agent loop", "tool worker", "delegation", "compaction", "stops"):
        assert part in shown, part


def test_plain_help_drops_roles_and_double_backquotes_and_joins_lines():
    doc = """Stop a turn (see :mod:`agentstream.cli.interrupts` and
    :func:`~agentstream.runtime.cancel.publish_cancel`): ``run`` waits.

    - one item
      continued
    - another"""
    assert plain_help(doc) == (
        "Stop a turn (see agentstream.cli.interrupts and publish_cancel): `run` waits.\n\n"
        "- one item continued\n- another"
    )
    assert markup_in(doc) and not markup_in(plain_help(doc))
