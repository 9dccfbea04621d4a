"""Reading an answer's citations back: the text without its marks, and the sources it cites.

A model that cites writes marks such as ``[3]``, ``[3, 4]``, ``[3;4]``, ``【3】`` or
``【3†source】`` (every form that :class:`~agentstream.context.citations.CitationStyle` reads,
whatever style it was told). Each mark whose numbers all name sources of the trace (under the
numbering the model saw, :class:`~agentstream.context.elements.Numbering`) is taken out of the
text, with the space before it; a mark that names an unknown number or a non-source stays as
written. Each cited source comes back once, with every part of the answer that cites it.

The part a mark cites (its span) is the text before it, back to the start of its sentence or
to the previous mark in that sentence; a mark right after a sentence's full stop cites that
sentence; marks side by side (``[1][2]``) cite the same part.
"""

from __future__ import annotations

import re
from typing import Any

from agentstream.context.citations import BRACKETS, CitationStyle
from agentstream.context.elements import Numbering
from agentstream.wire.events import CitedSource, Document, Source

_MARK = re.compile(r"[ \t]?(?:\[\s*\d+(?:\s*[,;]\s*\d+)*\s*\]|【\s*\d+(?:\s*[,;]\s*\d+)*\s*(?:†[^】]*)?】)")
_SENTENCE_END = re.compile(r"[.!?](?:\s+|$)|\n")


def _title_url(element: Source, whole: Source | None) -> tuple[str, str]:
    def of(e: Source | None) -> tuple[str, str]:
        if e is None:
            return "", ""
        title = e.title if isinstance(e, Document) else ""
        url = e.url if isinstance(e, Document) else ""
        props = e.properties
        title = title or (props.get("title") if isinstance(props.get("title"), str) else "") or ""
        url = url or (props.get("url") if isinstance(props.get("url"), str) else "") or ""
        return title, url

    title, url = of(element)
    whole_title, whole_url = of(whole)
    return title or whole_title, url or whole_url


def _span_start(clean: str, end: int, floor: int) -> int:
    """Where the part that ends at ``end`` starts: after the last sentence end before it, not before ``floor``."""
    head = clean[floor:end].rstrip()
    if head.endswith((".", "!", "?")):  # the mark follows a full stop: it cites that sentence
        head = head[:-1]
    start = floor
    for match in _SENTENCE_END.finditer(head):
        start = floor + match.end()
    while start < end and clean[start] in " \t,;:":
        start += 1
    return start


def read_back(text: str, numbering: Numbering, style: CitationStyle = BRACKETS) -> tuple[str, tuple[CitedSource, ...]]:
    """The answer without the marks that resolved, and the sources they cite, in order of first citation.

    Args:
        text: the model's answer.
        numbering: the numbering the model saw (the trace's, up to the answer).
        style: the agent's citation style (every style reads every form).

    Returns:
        ``(text without resolved marks, cited sources)``; spans are ``[start, end)`` offsets
        into the returned text.
    """
    if "[" not in text and "【" not in text:
        return text, ()
    ids = numbering.ids
    pieces: list[str] = []
    length = 0  # characters of the clean text so far
    last = 0
    floor = 0  # the clean text before this point belongs to an earlier cited part
    previous: tuple[int, int] | None = None  # the span of the mark just before, when nothing came between
    found: dict[str, dict[str, Any]] = {}
    for match in _MARK.finditer(text):
        numbers = style.read(match.group(0))
        elements: list[tuple[int, Source]] = []
        for number in numbers:
            element_id = ids.get(number)
            first = numbering.first(element_id) if element_id is not None else None
            if not isinstance(first, Source):
                elements = []
                break
            elements.append((number, first))
        if not elements:
            continue
        between = text[last : match.start()]
        pieces.append(between)
        length += len(between)
        last = match.end()
        if previous is not None and not between.strip():
            span = previous
        else:
            clean = "".join(pieces)
            end = len(clean.rstrip())
            if clean.rstrip().endswith((".", "!", "?")):
                end -= 1
            span = (_span_start(clean, end, floor), end)
        previous = span
        floor = length
        for number, element in elements:
            entry = found.get(element.id)
            if entry is None:
                whole = numbering.first(element.ref) if element.ref and element.ref != element.id else None
                title, url = _title_url(element, whole if isinstance(whole, Source) else None)
                entry = found[element.id] = {
                    "number": number,
                    "id": element.id,
                    "kind": type(element).__struct_config__.tag or "",
                    "title": title,
                    "url": url,
                    "whole": element.ref,
                    "spans": [],
                }
            if span not in entry["spans"]:
                entry["spans"].append(span)
    if not found:
        return text, ()
    pieces.append(text[last:])
    clean = "".join(pieces)
    cited = tuple(
        CitedSource(
            number=e["number"],
            id=e["id"],
            kind=e["kind"],
            title=e["title"],
            url=e["url"],
            whole=e["whole"],
            spans=tuple(e["spans"]),
        )
        for e in found.values()
    )
    return clean, cited


def result_sources(answer: str, elements: tuple[object, ...], numbering: Numbering) -> tuple[CitedSource, ...]:
    """The sources of a tool result that is a turn's answer (``Agent.result_as_answer``): of the
    sources the result carries that are not the whole of another one it carries (a passage, not
    its document), those whose text the answer quotes, else all of them; each cites the whole
    answer, in the result's order.

    Args:
        answer: the answer (the result's text).
        elements: the result's elements.
        numbering: the trace's numbering, which holds them.
    """
    sources = [e for e in elements if isinstance(e, Source)]
    wholes = {e.ref for e in sources if e.ref and e.ref != e.id}
    leaves = [e for e in sources if e.id not in wholes]
    quoted = [e for e in leaves if e.text.strip() and e.text.strip() in answer]
    out = []
    for element in quoted or leaves:
        number = numbering.number(element.id)
        if number is None:
            continue
        whole = numbering.first(element.ref) if element.ref and element.ref != element.id else None
        title, url = _title_url(element, whole if isinstance(whole, Source) else None)
        tag = type(element).__struct_config__.tag
        out.append(
            CitedSource(
                number=number,
                id=element.id,
                kind=tag if isinstance(tag, str) else "",
                title=title,
                url=url,
                whole=element.ref,
                spans=((0, len(answer)),),
            )
        )
    return tuple(out)
