"""The demo's tools: real, offline, and safe to give a model.

- :func:`calculator` evaluates arithmetic through the ``ast`` module (no ``eval``).
- :func:`python_docs_search` / :func:`python_docs_read` search and read the documentation that
  ships with Python itself: the language reference topics (``pydoc_data.topics``) and the
  docstrings of builtins and standard-library modules (through ``pydoc``).

A tool that cannot do what it is asked raises ``ValueError`` with a message for the model;
:meth:`agentstream.declarations.tools.Tool.invoke` turns it into an error result.
"""

from __future__ import annotations

import ast
import builtins
import functools
import math
import operator
import re
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentstream.declarations.tools import tool

# --------------------------------------------------------------------------------------------
# calculator
# --------------------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200
"""Longest accepted expression, in characters."""
MAX_EXPONENT = 1000
"""Largest absolute exponent accepted by ``**`` and ``pow``."""
MAX_RESULT_DIGITS = 1000
"""Largest integer result accepted, in decimal digits."""

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _pow(base: Any, exponent: Any) -> Any:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is too large (the limit is {MAX_EXPONENT})")
    return operator.pow(base, exponent)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "degrees": math.degrees,
    "radians": math.radians,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": lambda n: math.factorial(_small_int(n, "factorial", 500)),
    "pow": _pow,
    "min": min,
    "max": max,
}


def _small_int(value: Any, what: str, limit: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"{what} needs a whole number from 0 to {limit}, got {value}")
    return value


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_DIGITS * 3.33:
        raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_pow(left, right))
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ValueError(f"unknown name {node.id!r}; known constants: {', '.join(sorted(_CONSTANTS))}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise ValueError(f"unknown function; allowed functions: {', '.join(sorted(_FUNCTIONS))}")
        if node.keywords:
            raise ValueError(f"{node.func.id}() takes no keyword arguments")
        args = [_eval(a) for a in node.args]
        return _check_size(_FUNCTIONS[node.func.id](*args))
    raise ValueError(f"unsupported syntax: {type(node).__name__}; use numbers, + - * / // % ** and parentheses")


def _format_number(value: Any) -> str:
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    return str(value)


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely; the plain-Python core of :func:`calculator`.

    Raises:
        ValueError: the expression is empty, too long, not arithmetic, or its result is too large
            or undefined (division by zero, math domain errors).
    """
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    # lenient about wrapping that small models add: {2 + 3}, {12} * {12}, `2 + 3`, "2 + 3", 2 + 3 =
    text = text.replace("{", "").replace("}", "").strip()
    while len(text) >= 2 and text[0] + text[-1] in ("``", '""', "''"):
        text = text[1:-1].strip()
    text = text.removesuffix("=").strip()
    if not text:
        raise ValueError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}: {exc.msg}") from None
    try:
        value = _eval(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large") from None
    except TypeError as exc:
        raise ValueError(f"wrong arguments: {exc}") from None
    except ValueError as exc:
        if str(exc) == "math domain error":
            raise ValueError("math domain error (e.g. sqrt or log of a negative number)") from None
        raise
    if isinstance(value, complex):
        raise ValueError("the result is a complex number")
    return value


@tool(timeout_s=5.0)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as "(3 + 4) * 2" or "sqrt(16) / 2" and return the result.

    Supports numbers, + - * / // % ** (or ^), parentheses, the constants pi, e and tau, and the
    functions sqrt, log, log10, log2, exp, sin, cos, tan, asin, acos, atan, degrees, radians,
    abs, round, floor, ceil, factorial, pow, min and max.
    """
    return _format_number(evaluate(expression))


# --------------------------------------------------------------------------------------------
# Python documentation
# --------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z_][a-z0-9_]*|[0-9]+")
_STOPWORDS = frozenset(
    "a an and are as at be by do does for from how i in is it of on or the this to use what when "
    "which with you your can python".split()
)
_SUMMARY_CHARS = 160


_STATEMENT_KEYWORDS = frozenset(
    "assert async await break class continue def del elif else except finally for global if import "
    "lambda match nonlocal pass raise return try while with yield".split()
)
_STATEMENT_HINTS = frozenset("statement statements loop loops keyword clause block syntax".split())


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _query_words(text: str) -> list[str]:
    words = _words(text.replace(".", " "))
    kept = [w for w in words if w not in _STOPWORDS]
    return kept or words


@functools.lru_cache(maxsize=1)
def _topics() -> dict[str, str]:
    """Language-reference topic name → text (``pydoc_data.topics``)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its docs data
        return {}
    return dict(topics)


@functools.lru_cache(maxsize=1)
def _keyword_topics() -> dict[str, str]:
    """Keywords and symbols (``for``, ``with``, ``+``…) → the topic that documents them."""
    import pydoc

    mapping: dict[str, str] = {}
    for keyword, target in pydoc.Helper.keywords.items():
        topic = (target if isinstance(target, str) else target[0]).split()
        if topic:
            mapping[keyword] = topic[0]
    for symbol, topics in pydoc.Helper.symbols.items():
        if topics.split():
            mapping.setdefault(symbol, topics.split()[0])
    return mapping


@functools.lru_cache(maxsize=1)
def _stdlib_modules() -> tuple[str, ...]:
    names = set(getattr(sys, "stdlib_module_names", ()))
    return tuple(
        sorted(n for n in names if not n.startswith("_") and not n.startswith("test") and n not in _SKIP_MODULES)
    )


_SKIP_MODULES = frozenset({"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle", "lib2to3", "ensurepip"})


def _first_line(doc: str | None) -> str:
    if not doc:
        return ""
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()[:_SUMMARY_CHARS]
    return ""


@functools.lru_cache(maxsize=1)
def _index() -> tuple[dict[str, tuple[str, str]], dict[str, Counter[str]]]:
    """Build the search index once: name → (kind, summary) and name → word counts.

    Entries are the language-reference topics, the builtins (and the methods of builtin types
    such as ``str.split``), and the standard-library modules that import without side effects
    (with their public functions and classes). Built lazily on the first search (≈ 1–3 s).
    The first entry of a name wins, in that order.
    """
    index = _Index()
    for name, text in _topics().items():
        index.add(name, "language reference", text)
    for keyword, topic in _keyword_topics().items():
        if topic in index.words and re.fullmatch(r"[a-z_]+", keyword):
            index.words[topic][keyword] += 5  # "for" finds the "for" statement topic
    for name in dir(builtins):
        if not name.startswith("_"):
            _add_builtin(index, name, getattr(builtins, name))
    for module_name in _stdlib_modules():
        _add_module(index, module_name, _loaded(module_name))
    return index.entries, index.words


class _Index:
    """The index being built: name → (kind, summary), and name → word counts."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, str]] = {}
        self.words: dict[str, Counter[str]] = {}

    def add(self, name: str, kind: str, text: str, weight_name: int = 3) -> None:
        """An entry, unless the name has one: its text's first line, and the words of its text's
        start and of its name (each counted ``weight_name`` times)."""
        if name in self.entries:
            return
        self.entries[name] = (kind, _first_line(text))
        counts = Counter(_words(text[:3000]))
        for w in _words(name.replace(".", " ")):
            counts[w] += weight_name
        self.words[name] = counts


def _add_builtin(index: _Index, name: str, obj: object) -> None:
    """A builtin, and the public methods of a builtin type (not of an exception)."""
    index.add(name, "builtin", getattr(obj, "__doc__", "") or "")
    if isinstance(obj, type) and not issubclass(obj, BaseException):
        for attr, member in vars(obj).items():
            if not attr.startswith("_") and callable(member):
                index.add(f"{name}.{attr}", "builtin method", getattr(member, "__doc__", "") or "", weight_name=4)


def _loaded(module_name: str) -> Any:
    """The module if it is imported already, or safe to import (:data:`_SAFE_TO_IMPORT`) and imports; else None."""
    module = sys.modules.get(module_name)
    if module is None and module_name in _SAFE_TO_IMPORT:
        try:
            module = __import__(module_name)
        except Exception:
            module = None
    return module


def _add_module(index: _Index, module_name: str, module: Any) -> None:
    """A standard-library module (by name alone when it is not loaded), and its public callables
    defined in it (``__all__``, or its names without an underscore)."""
    if module is None:
        index.add(module_name, "module", f"{module_name} standard library module")
        return
    index.add(module_name, "module", getattr(module, "__doc__", "") or module_name)
    for attr in getattr(module, "__all__", None) or [a for a in vars(module) if not a.startswith("_")]:
        member = getattr(module, attr, None)
        if member is None or not callable(member) or getattr(member, "__module__", module_name) != module_name:
            continue
        index.add(f"{module_name}.{attr}", "stdlib", getattr(member, "__doc__", "") or "", weight_name=4)


# Modules imported for the index (documented, pure-Python-safe, no side effects on import).
_SAFE_TO_IMPORT = frozenset(
    """abc argparse array ast asyncio base64 bisect calendar collections contextlib copy csv
    dataclasses datetime decimal difflib enum fnmatch fractions functools glob hashlib heapq hmac
    html io itertools json logging math operator os pathlib pickle pprint random re secrets shlex
    shutil socket sqlite3 statistics string struct subprocess sys tempfile textwrap threading time
    timeit typing unicodedata urllib uuid warnings zipfile zlib""".split()
)


def search_docs(query: str, limit: int = 5) -> list[tuple[str, str, str, float]]:
    """Rank the documentation entries by word overlap with ``query``.

    Returns:
        Up to ``limit`` tuples ``(name, kind, summary, score)``, best first. The score is the sum,
        over the distinct query words found, of 1 + log(count) (+ 4 if the word is part of the
        entry's name), + 10 if the whole query is the name, + 8 for the reference topic of a
        statement keyword ("for loop"), + 6 if one query word is the whole name.
    """
    entries, index = _index()
    terms = _query_words(query)
    exact = " ".join(_words(query.replace(".", " ")))
    keyword_topic = _keyword_topics().get(query.strip())
    # "for statement", "while loop", "with": the reference topic of a statement keyword
    raw = _words(query)
    statement_query = len(raw) <= 2 or bool(_STATEMENT_HINTS.intersection(raw))
    boosted = {_keyword_topics()[w] for w in raw if w in _STATEMENT_KEYWORDS and statement_query}
    scored: list[tuple[float, str]] = []
    for name, counts in index.items():
        score = 0.0
        name_words = set(_words(name.replace(".", " ")))
        for term in set(terms):
            count = counts.get(term, 0)
            if count:
                score += 1.0 + math.log(count)
                if term in name_words:
                    score += 4.0
        if name.lower().replace(".", " ") == exact or name == keyword_topic:
            score += 10.0
        if name in boosted:
            score += 8.0
        elif name.lower() in terms:
            score += 6.0  # "what is a list" → list itself before list.sort
        if score > 0:
            # shorter names first on ties: "str.split" before "str.rsplit" for "split"
            scored.append((score - len(name) * 1e-3, name))
    scored.sort(reverse=True)
    return [(name, *entries[name], round(score, 2)) for score, name in scored[: max(1, limit)]]


@tool(timeout_s=20.0)
def python_docs_search(query: str, limit: int = 5) -> str:
    """Search the Python documentation (language reference, builtins, standard library) and list matching topics.

    Returns one line per match: the topic name to pass to python_docs_read, its kind and summary.
    """
    if not query.strip():
        raise ValueError("the query is empty; give a few words, e.g. 'for statement' or 'str split'")
    limit = min(max(limit, 1), 20)
    hits = search_docs(query, limit)
    if not hits:
        return f"No Python documentation matches {query!r}. Try other words."
    lines = [f"{name} ({kind}): {summary}" if summary else f"{name} ({kind})" for name, kind, summary, _ in hits]
    return "\n".join(lines) + "\n\nRead one with python_docs_read(topic)."


def _resolve(topic: str) -> tuple[str, str] | None:
    """A topic name → (canonical name, plain text), or None if nothing documents it."""
    name = topic.strip().strip("`'\"").removesuffix("()")
    if not name:
        return None
    topics = _topics()
    if name in topics:
        return name, topics[name]
    keyword_topic = _keyword_topics().get(name)
    if keyword_topic and keyword_topic in topics:
        return keyword_topic, topics[keyword_topic]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
        return None
    root = name.split(".")[0]
    if not (hasattr(builtins, root) or root in _stdlib_modules()):
        return None  # never import arbitrary (third-party or unknown) modules on a model's say-so
    import pydoc

    try:
        # typeshed does not declare pydoc.plaintext, the plain-text renderer of pydoc's own help()
        plain = pydoc.plaintext  # type: ignore[attr-defined]
        text = pydoc.render_doc(name, title="Python Library Documentation: %s", renderer=plain)
    except (ImportError, pydoc.ErrorDuringImport, AttributeError):
        return None
    return name, text


def read_docs(topic: str, max_chars: int = 4000) -> str | None:
    """The documentation text of ``topic`` cut to ``max_chars`` characters, or None if unknown.

    When cut, the text ends with a note saying how many characters were left out.
    """
    found = _resolve(topic)
    if found is None:
        return None
    name, text = found
    text = text.strip()
    max_chars = max(max_chars, 100)
    if len(text) > max_chars:
        cut = len(text) - max_chars
        text = text[:max_chars].rstrip() + f"\n\n[... {cut} more characters of {name!r} not shown]"
    return text


@tool(timeout_s=20.0)
def python_docs_read(topic: str, max_chars: int = 4000) -> str:
    """Read the Python documentation of a topic, e.g. "for", "str.split", "json.loads" or "formatstrings"."""
    if not topic.strip():
        raise ValueError("the topic is empty; give a name such as 'str.split' or 'for'")
    text = read_docs(topic, max_chars)
    if text is None:
        return f"No Python documentation found for {topic!r}; try python_docs_search({topic!r}) to find the right topic name."
    return text


DEMO_TOOLS = (calculator, python_docs_search, python_docs_read)
