"""The ``--help`` text of a command, made from its docstring (pure: no I/O).

The commands' docstrings are written for developers (reStructuredText roles such as
``:mod:`x```, double backquotes, lines wrapped at the source's width); a person reading
``agentstream run --help`` should see neither the markup nor a line broken in mid-sentence.
:func:`plain_help` turns one into the other: roles become the name they point at, double
backquotes become single ones (as a terminal shows code), and the lines of each paragraph are
joined into one, which the help formatter then wraps at the terminal's width. A paragraph whose
lines are list items (``- ...``) keeps one line per item.
"""

from __future__ import annotations

import inspect
import re

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|ref|doc):`(~?)([^`<]*?)(?:\s*<([^>]*)>)?`")
"""A reST role such as ``:func:`~agentstream.x.y```, ``:ref:`text <target>```."""

DOUBLE_BACKQUOTES = re.compile(r"``(.+?)``", re.S)

MARKUP = re.compile(r"``|:(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|ref|doc):`")
"""What reST markup in a help text looks like (for checks: :func:`markup_in`)."""


def _role(match: re.Match[str]) -> str:
    short, text, _target = match.group(1), match.group(2).strip(), match.group(3)
    return text.rsplit(".", 1)[-1] if short else text


def plain_help(docstring: str | None) -> str:
    """``docstring`` as a command's help: no reST markup, one line per paragraph (or per list
    item), paragraphs apart by a blank line; "" for None."""
    text = inspect.cleandoc(docstring or "")
    text = ROLE.sub(_role, text)
    text = DOUBLE_BACKQUOTES.sub(lambda m: f"`{m.group(1)}`", text)
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        if not lines:
            continue
        items: list[str] = []
        for line in lines:
            if line.startswith(("- ", "* ")) or not items:
                items.append(line)
            else:
                items[-1] += " " + line
        paragraphs.append("\n".join(items))
    return "\n\n".join(paragraphs)


def markup_in(text: str) -> list[str]:
    """The pieces of reST markup in ``text`` (what :func:`plain_help` removes), each with a few
    characters around it; [] when there is none."""
    return [text[max(0, m.start() - 20) : m.end() + 20] for m in MARKUP.finditer(text)]
