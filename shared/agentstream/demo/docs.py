"""The ``docs`` demo agent's tool: passages of the Python documentation that ships with Python, as sources.

Offline: the corpus is what the running Python carries on disk, the language-reference topics
(``pydoc_data.topics``, what ``python -m pydoc for`` prints) and the docstrings of the builtins,
their methods, and the public functions, classes and methods of a set of standard-library
modules. Each documented name is a :class:`~agentstream.wire.events.Document` (its title, where it is
published, the pydoc command that prints it on this machine) and each paragraph of it a
:class:`~agentstream.wire.events.Passage` of that document, so the model cites paragraphs and the
answer's sources say where to read them.

Ranking is BM25 (k1 = 1.2, b = 0.75) over the paragraphs' words, lightly stemmed (``lines`` and
``line``, ``reading`` and ``read``), plus a bonus when query words make up the documented name
(``readline`` for "read a line").
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

import pydantic

from agentstream.declarations.tools import ToolResult, tool
from agentstream.wire.events import Document, Passage

_WORD = re.compile(r"[a-z][a-z0-9]*")
_STOPWORDS = frozenset(
    "a an and are as at be by do does for from how i in is it its of on or the this that to use what when "
    "which with you your can me my python into if not".split()
)

MODULES = (
    "io os os.path pathlib json csv re collections itertools functools string datetime shutil glob "
    "tempfile textwrap codecs contextlib subprocess math random statistics"
).split()
"""The standard-library modules whose public names are indexed (besides the builtins and the reference topics)."""

PASSAGE_CHARS = 700
"""The longest passage, in characters (a longer paragraph is cut at a sentence end)."""

HITS = 2
"""How many passages one search returns (one per documented name)."""

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            return stem[:-1] if suffix == "ing" and len(stem) > 3 and stem[-1] == stem[-2] else stem
    return word


def words(text: str) -> list[str]:
    """The stemmed words of a text, without stop words."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


@dataclass(frozen=True)
class Entry:
    """One documented name: where it is published and printed, and its paragraphs."""

    name: str
    title: str
    url: str
    location: str
    paragraphs: tuple[str, ...]


def _paragraphs(text: str) -> tuple[str, ...]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.strip().splitlines()]
        block = " ".join(line for line in lines if line and not set(line) <= set("*=-~^"))
        if len(block) < 25:
            continue
        while len(block) > PASSAGE_CHARS:
            cut = block.rfind(". ", 0, PASSAGE_CHARS)
            cut = cut + 1 if cut > PASSAGE_CHARS // 2 else PASSAGE_CHARS
            out.append(block[:cut].strip())
            block = block[cut:].strip()
        if block:
            out.append(block)
    return tuple(out)


def _library_url(module: str, qualname: str) -> str:
    page = {"builtins": "functions", "os.path": "os.path"}.get(module, module.split(".")[0])
    return f"https://docs.python.org/{VERSION}/library/{page}.html#{qualname}"


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[Entry, ...]:
    """Every documented name, built once per process (about a second): the reference topics,
    then the builtins and their methods, then the public names of :data:`MODULES` and their methods."""
    entries = _topic_entries()
    for name in dir(builtins):
        obj = getattr(builtins, name)
        if name.startswith("_") or (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        entries.extend(_builtin_entries(name, obj))
    for module_name in MODULES:
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            continue
        entries.extend(_module_entries(module_name, module))
    return tuple(entries)


def _topic_entries() -> list[Entry]:
    """The language-reference topics (none in a Python built without its docs data), by name."""
    topics: dict[str, str]
    try:
        from pydoc_data import topics as topics_data

        topics = topics_data.topics
    except ImportError:  # a Python built without its docs data
        topics = {}
    entries = []
    for name, text in sorted(topics.items()):
        heading = text.strip().splitlines()[0].strip() if text.strip() else name
        entries.append(Entry(name, heading, "", f"python -m pydoc {name}", _paragraphs(text)))
    return entries


def _entry(module: str, qualname: str, obj: object, url: str) -> list[Entry]:
    """A documented name's entry, or none when it has no docstring."""
    doc = inspect.getdoc(obj)
    if not doc:
        return []
    shown = qualname if module == "builtins" else f"{module}.{qualname}"
    return [Entry(shown, shown, url, f"python -m pydoc {shown}", _paragraphs(doc))]


def _builtin_entries(name: str, obj: object) -> list[Entry]:
    """A builtin's entry, then those of its public methods when it is a type."""
    entries = _entry("builtins", name, obj, _library_url("builtins", name))
    if isinstance(obj, type):
        for attr, member in vars(obj).items():
            if not attr.startswith("_") and callable(member):
                url = f"https://docs.python.org/{VERSION}/library/stdtypes.html#{name}.{attr}"
                entries += _entry("builtins", f"{name}.{attr}", member, url)
    return entries


def _module_entries(module_name: str, module: Any) -> list[Entry]:
    """A module's public callables (``__all__``, or its names without an underscore), each then
    the public methods of a class."""
    entries: list[Entry] = []
    for attr in getattr(module, "__all__", None) or [a for a in vars(module) if not a.startswith("_")]:
        member = getattr(module, attr, None)
        if member is None or not callable(member):
            continue
        entries += _entry(module_name, attr, member, _library_url(module_name, f"{module_name}.{attr}"))
        if isinstance(member, type):
            for method, value in vars(member).items():
                if not method.startswith("_") and callable(value):
                    qualified = f"{attr}.{method}"
                    entries += _entry(
                        module_name, qualified, value, _library_url(module_name, f"{module_name}.{qualified}")
                    )
    return entries


@functools.lru_cache(maxsize=1)
def _index() -> tuple[list[tuple[int, int, Counter[str]]], dict[str, int], float]:
    rows = []
    frequency: Counter[str] = Counter()
    for e, entry in enumerate(corpus()):
        for p, paragraph in enumerate(entry.paragraphs):
            counts = Counter(words(paragraph))
            rows.append((e, p, counts))
            frequency.update(counts.keys())
    average = sum(sum(c.values()) for _, _, c in rows) / max(len(rows), 1)
    return rows, dict(frequency), average


def _name_bonus(name: str, terms: set[str]) -> float:
    last = name.lower().rsplit(".", 1)[-1].replace("_", "")
    found = [t for t in terms if len(t) >= 3 and t in last]
    if not found:
        return 0.0
    covered = min(sum(len(t) for t in found) / max(len(last), 1), 1.0)
    return 3.0 * covered if len(found) > 1 else covered


_KEYWORD_QUERY = re.compile(
    r"\b(for|with|if|while|try|import|return|yield|class|def|lambda|assert|raise|del|pass|break|"
    r"continue|global|nonlocal|async|await)\s+(statement|loop|keyword|clause|block)"
)


_CODE_NAME = re.compile(r"`([A-Za-z_][\w.]*)(?:\(\))?`|\b([A-Za-z_][\w.]*)\(\)")

NAMED_BONUS = 6.0
"""What a documented name that the query writes as code (```sorted```, ``os.path.join()``) adds
to its entry's score: a small model that rewrites the question often names the function it has
in mind, and that name is a better guide than the words around it."""


def named_in(query: str) -> set[str]:
    """The names ``query`` writes as code: in backticks or followed by ``()`` (``str.split()``)."""
    return {(a or b).rstrip(".") for a, b in _CODE_NAME.findall(query)}


def search(query: str, limit: int = 3) -> list[tuple[Entry, int, float]]:
    """The best passages for ``query``: ``(entry, paragraph index, score)``, best first, one per entry.

    Scores: BM25 over the paragraph's words, a bonus for query words that make up the entry's
    name, :data:`NAMED_BONUS` when the query writes the entry's name as code, and the reference
    topic of a keyword the query asks about (``the with statement``)."""
    terms = words(query)
    named = named_in(query)
    keyword = _KEYWORD_QUERY.search(query.lower())
    if keyword:  # "the with statement": the reference topic of that keyword
        terms.append(keyword.group(1))
    if not terms:
        return []
    rows, frequency, average = _index()
    n = len(rows)
    entries = corpus()
    unique = set(terms)
    best: dict[int, tuple[float, int]] = {}
    for e, p, counts in rows:
        length = sum(counts.values())
        score = 0.0
        for term in unique:
            tf = counts.get(term, 0)
            if tf:
                idf = math.log(1 + (n - frequency[term] + 0.5) / (frequency[term] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
        if score <= 0:
            continue
        name = entries[e].name
        score += _name_bonus(name, unique) - p * 0.05  # a name's first paragraphs first
        if name in named:
            score += NAMED_BONUS
        if keyword and name == keyword.group(1):
            score += 8.0
        if score > best.get(e, (0.0, 0))[0]:
            best[e] = (score, p)
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], len(entries[item[0]].name), entries[item[0]].name))
    out: list[tuple[Entry, int, float]] = []
    seen: set[str] = set()
    for e, (score, p) in ranked:
        text = entries[e].paragraphs[p]
        if text in seen:  # an inherited docstring: the shortest name that has it
            continue
        seen.add(text)
        out.append((entries[e], p, round(score, 3)))
        if len(out) >= max(limit, 1):
            break
    return out


def elements_of(entry: Entry, paragraph: int) -> tuple[Document, Passage]:
    """The document of a documented name and the passage of one of its paragraphs."""
    doc_id = f"pydoc:{entry.name}"
    document = Document(id=doc_id, title=entry.title, url=entry.url, properties={"location": entry.location})
    passage = Passage(id=f"{doc_id}#{paragraph + 1}", ref=doc_id, text=entry.paragraphs[paragraph])
    return document, passage


Question = Annotated[str, pydantic.Field(description="The user's question, copied word for word.")]


@tool(timeout_s=30.0)
def docs_search(question: Question) -> ToolResult:
    """Search the Python documentation for the user's question; returns the best passage as the
    result's text, and the best passages as sources to cite."""
    if not question.strip():
        raise ValueError("the question is empty; copy the user's question, e.g. 'How do I round a number?'")
    hits = search(question, HITS)
    if not hits:
        return ToolResult(text=f"No passage of the Python documentation matches {question!r}. Try other words.")
    elements = [element for entry, paragraph, _ in hits for element in elements_of(entry, paragraph)]
    best, paragraph, _ = hits[0]
    return ToolResult(text=best.paragraphs[paragraph], elements=elements)
