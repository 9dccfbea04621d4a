"""One name per concept: the fold of a trace and its caches live in the modules named for them.

- the context library's fold (what a model call's context is built from) is
  :class:`~agentstream.context._context_fold.ContextFold`, its pieces and its structural type in
  ``context/_context_fold_parts.py`` and ``context/_context_fold_protocol.py``, its per-worker
  cache in ``context/_context_fold_cache.py``: internal modules (an underscore), reached through
  :mod:`agentstream.context`;
- the trace fold the agent loop keeps (the next decision's inputs and one context fold per agent)
  is :class:`~agentstream.steps.trace_fold.TraceFold`, cached in its ``FoldCache``;
- :class:`~agentstream.runtime.fold_reader.FoldReader` keeps them current from Redis.

Read from the source: a class named like a fold anywhere else fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "shared/agentstream"

WHERE = {
    "ContextFold": "context/_context_fold.py",
    "ContextCache": "context/_context_fold_cache.py",
    "FoldState": "context/_context_fold_protocol.py",
    "TraceFold": "steps/trace_fold.py",
    "FoldCache": "steps/trace_fold.py",
    "FoldReader": "runtime/fold_reader.py",
    "_Folds": "steps/replay.py",  # private to the replay of stored calls: one context fold per agent
}


def _fold_classes() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and re.search(r"Fold(?!er)|ContextCache", node.name):
                found[node.name] = str(path.relative_to(ROOT))
    return found


def test_each_fold_concept_has_one_class_in_its_module() -> None:
    assert _fold_classes() == WHERE


def test_the_fold_modules_are_the_named_ones() -> None:
    named = {*WHERE.values(), "context/_context_fold_parts.py"} - {"steps/replay.py"}
    modules = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*fold*.py")}
    assert modules == named, "a module about the fold outside the named ones"
