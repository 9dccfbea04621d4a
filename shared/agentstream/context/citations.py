"""Citation styles: how the model is told to cite sources, and how its citations are read back.

A style writes the citation of a numbered source (``[4]`` or ``【4】``) and reads every common
form back, so a model that writes another style is still understood: ``[4]``, ``[4, 5]``,
``[4;5]``, ``[4][5]``, ``【4】`` and ``【4†source】`` all cite sources 4 (and 5).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_BRACKETS = re.compile(r"\[\s*(\d+(?:\s*[,;]\s*\d+)*)\s*\]")
_LENTICULAR = re.compile(r"【\s*(\d+(?:\s*[,;]\s*\d+)*)\s*(?:†[^】]*)?】")
_SEPARATOR = re.compile(r"\s*[,;]\s*")
_PATTERNS = ((_BRACKETS, "["), (_LENTICULAR, "【"))


@dataclass(frozen=True)
class CitationStyle:
    """How a model cites sources: the text around a source's number.

    Attributes:
        name: a short name (``brackets``, ``fullwidth``).
        opening: the text before the number.
        closing: the text after the number.
    """

    name: str
    opening: str
    closing: str

    def cite(self, number: int) -> str:
        """The citation of source ``number``, exactly as the model should write it."""
        return f"{self.opening}{number}{self.closing}"

    def cite_all(self, numbers: Iterable[int]) -> str:
        """The citation of several sources: one citation after another (``[4][5]``)."""
        return "".join(self.cite(n) for n in numbers)

    @property
    def example(self) -> str:
        """An example citation, for the system prompt."""
        return self.cite(1)

    def read(self, text: str) -> list[int]:
        """The source numbers that ``text`` cites, in order of first appearance, each once.

        Every form is read, whatever this style writes: ``[4]``, ``[4, 5]``, ``[4;5]``,
        ``【4】`` and ``【4†source】``.
        """
        found: list[tuple[int, int]] = []  # (position, number), in order for each pattern
        patterns = 0
        for pattern, opening in _PATTERNS:
            if opening not in text:  # neither pattern matches without its opening bracket
                continue
            before = len(found)
            for match in pattern.finditer(text):
                numbers, start = match.group(1), match.start()
                if "," in numbers or ";" in numbers:
                    for part in _SEPARATOR.split(numbers):
                        found.append((start, int(part)))
                else:
                    found.append((start, int(numbers)))
            patterns += len(found) > before
        if len(found) < 2:
            return [found[0][1]] if found else []
        if patterns > 1:
            found.sort(key=lambda pair: pair[0])
        return list(dict.fromkeys(number for _, number in found))

    def resolve(self, text: str, ids: Mapping[int, str]) -> list[str]:
        """The element ids that ``text`` cites, given the numbering (number → id); unknown numbers are dropped."""
        return [ids[n] for n in self.read(text) if n in ids]


BRACKETS = CitationStyle("brackets", "[", "]")
"""Cites as ``[4]``, and ``[4][5]`` for two sources."""

FULLWIDTH = CitationStyle("fullwidth", "【", "】")
"""Cites as ``【4】``, and ``【4】【5】`` for two sources."""
