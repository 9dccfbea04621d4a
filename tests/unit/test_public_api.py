"""The public API of :mod:`agentstream`: ``__all__`` is complete, and README's imports work.

After the layout of issue 17 the names a user imports from ``agentstream`` are the same; this
keeps them so (as httpx tests its ``__all__``), and runs every ``from agentstream... import ...``
line of README.md so that a moved module can not leave the README wrong.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import agentstream
from tests.support import docs

ROOT = Path(__file__).resolve().parents[2]


def _public_imports() -> set[str]:
    """Every public name ``agentstream/__init__.py`` imports or defines."""
    tree = ast.parse((ROOT / "shared/agentstream/__init__.py").read_text())
    names = set()
    body = [*tree.body, *(n for node in tree.body if isinstance(node, ast.If) for n in node.body)]  # TYPE_CHECKING
    names_of_typing = {"TYPE_CHECKING", "Any"}
    for node in body:
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {name for name in names if not name.startswith("_") and name not in names_of_typing}


def test_all_is_complete() -> None:
    exported = set(agentstream.__all__)
    assert _public_imports() <= exported, f"imported but not in __all__: {sorted(_public_imports() - exported)}"
    assert len(exported) == len(agentstream.__all__), "__all__ names a name twice"


def test_every_name_in_all_imports() -> None:
    missing = [name for name in agentstream.__all__ if not hasattr(agentstream, name)]
    assert not missing, f"in __all__ but not importable: {missing}"


README_IMPORTS = sorted(
    set(
        re.findall(
            r"^\s*(from agentstream[\w.]* import [\w, ]+|import agentstream[\w.]*)\s*$",
            docs.all_pages(),
            re.M,
        )
    )
)


@pytest.mark.parametrize("line", README_IMPORTS)
def test_readme_imports_work(line: str) -> None:
    exec(compile(line, "README.md", "exec"), {})


SPAN_NAMES = {"step", "model_call", "tool_call", "hand_back", "compaction"}
"""The OpenTelemetry span names README lists (``agentstream.step``...): names, not modules."""


def test_readme_names_only_existing_modules() -> None:
    text = docs.all_pages()
    for dotted in sorted(set(re.findall(r"(?<![\w./-])agentstream(?:\.[a-z_]\w*)+", text))):
        parts = dotted.split(".")
        if len(parts) == 2 and parts[1] in SPAN_NAMES:
            continue
        for n in range(len(parts), 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:n]))
            except ImportError:
                continue
            rest = parts[n:]
            obj = module
            for attr in rest:
                assert hasattr(obj, attr), f"README names {dotted}: {'.'.join(parts[:n])} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"README names {dotted}, which is no module")
