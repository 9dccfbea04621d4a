"""The exception tree of :mod:`agentstream.errors` and the failure codes of the wire.

- the tree drawn in the docstring of :mod:`agentstream.errors` names every exception class of the
  package (read from the source with :mod:`ast`, and found again in every module imported;
  private ``_Name`` classes are left out), each under its real base;
- signals (:class:`~agentstream.errors.AgentStreamSignal`) are not failures: ``except
  AgentStreamError`` lets them through;
- the failure codes the code writes are members of :class:`~agentstream.wire.failures.FailureCode`,
  and the published schemas name them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import agentstream
import agentstream.errors as errors
import agentstream_services
from agentstream.errors import AgentStreamError, AgentStreamSignal, Deferred, ToolCancelled, TurnDenied, TurnRejected
from agentstream.wire import codec
from agentstream.wire.events import CompactionFailed, TurnFailed
from agentstream.wire.failures import FailureCode
from agentstream.wire.schemas import trace_events_schema

ROOT = Path(__file__).resolve().parents[2] / "shared/agentstream"
FOREIGN = {"AssertionError", "RuntimeError", "BrokenResourceError", "DecodeError"}
"""The other families the tree draws classes of the package under (Python's, anyio's, msgspec's)."""
ROOTS = {"Exception", "BaseException", *FOREIGN}


def _drawn_tree() -> dict[str, str]:
    """{class name: the name it is drawn under} from the docstring's tree (roots under ``Exception``)."""
    tree = (errors.__doc__ or "").split("::", 1)[1].split("\nErrors say", 1)[0]
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in tree.splitlines():
        # a node: its guides (4 characters a level), its branch, its name, then a space or the end
        match = re.match(r"^    ((?:[│ ]   )*)([├└]── )?([A-Z][A-Za-z]+)(?=\s|$)", line)
        if not match:
            continue  # a description's next line, or prose
        depth = len(match.group(1)) // 4 + (1 if match.group(2) else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group(3)] = stack[-1][1] if stack else "Exception"
        stack.append((depth, match.group(3)))
    for foreign in FOREIGN:
        parents.pop(foreign, None)
    return parents


def _exception_classes() -> dict[str, str]:
    """{class name: its base's name} for every public exception class of the package's source."""
    classes: dict[str, str] = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.bases and not node.name.startswith("_"):
                base = node.bases[0]
                name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
                classes[node.name] = name
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, base in classes.items():
            if name not in found and (base in ROOTS or base in found):
                found[name] = base
                changed = True
    return found


def test_the_drawn_tree_names_every_exception_class_under_its_base() -> None:
    drawn, real = _drawn_tree(), _exception_classes()
    assert sorted(set(real) - set(drawn)) == [], "exception classes missing from the tree of errors.py"
    assert sorted(set(drawn) - set(real)) == [], "the tree of errors.py draws classes that do not exist"
    wrong = {name: (drawn[name], real[name]) for name in real if drawn[name] != real[name]}
    assert wrong == {}, "drawn under another base than the class has: {name: (drawn, real)}"


def _imported_exception_classes() -> dict[str, type[BaseException]]:
    """{class name: class} for every public exception class defined in a module of the package
    (and of its services), every module imported; the modules that fail to import, by name."""
    classes: dict[str, type[BaseException]] = {}
    failed: dict[str, str] = {}
    for package in (agentstream, agentstream_services):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if module.name.rsplit(".", 1)[-1] == "__main__":  # runs the command line
                continue
            try:
                imported = importlib.import_module(module.name)
            except Exception as exc:  # a module the walk cannot see into: reported below
                failed[module.name] = repr(exc)
                continue
            for name, value in vars(imported).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == imported.__name__
                    and not name.startswith("_")
                ):
                    classes[name] = value
    assert failed == {}, "modules that do not import: their exception classes are not checked"
    return classes


def test_every_exception_class_imported_is_drawn_under_its_base() -> None:
    drawn, imported = _drawn_tree(), _imported_exception_classes()
    assert {"AgentStreamError", "Deferred", "Retryable", "MissingField"} <= set(imported), "the walk is stale"
    assert sorted(set(imported) - set(drawn)) == [], "exception classes missing from the tree of errors.py"
    wrong = {n: (drawn[n], c.__bases__[0].__name__) for n, c in imported.items() if drawn[n] != c.__bases__[0].__name__}
    assert wrong == {}, "drawn under another base than the class has: {name: (drawn, real)}"


def test_the_tree_reader_sees_depth() -> None:
    drawn = _drawn_tree()
    assert drawn["ModelDeadlineExceeded"] == "ModelUnanswered"
    assert drawn["ModelStopError"] == "ModelError"
    assert drawn["ToolCancelled"] == "AgentStreamSignal"
    assert drawn["AgentStreamSignal"] == "Exception"


@pytest.mark.parametrize("signal", [Deferred(0.5), TurnDenied("no"), ToolCancelled("stop")])
def test_except_agentstream_error_lets_signals_through(signal: AgentStreamSignal) -> None:
    with pytest.raises(AgentStreamSignal):
        try:
            raise signal
        except AgentStreamError:  # meant for failures
            pytest.fail(f"{type(signal).__name__} was caught as a failure")


def test_default_codes_are_failure_codes() -> None:
    assert TurnDenied("no").code in set(FailureCode)
    assert TurnRejected("bad").code in set(FailureCode)


def test_failure_codes_are_their_stored_strings() -> None:
    failed = TurnFailed(turn_id="t1", code=FailureCode.BUSY, reason="r")
    assert codec.encode(failed) == codec.encode(TurnFailed(turn_id="t1", code="busy", reason="r"))
    assert FailureCode("passes_cap") is FailureCode.PASSES_CAP


def test_every_code_literal_in_the_source_is_a_failure_code() -> None:
    # a code written as a literal (code="x", FailTurn(turn, "x", ...), X_CODE = "x") must be listed
    known = {code.value for code in FailureCode}
    found = set()
    for path in [*ROOT.rglob("*.py"), *(ROOT.parents[1] / "services").rglob("*.py")]:
        text = path.read_text()
        found.update(re.findall(r"\bcode=\"([a-z_]+)\"", text))
        found.update(re.findall(r"FailTurn\(turn, \"([a-z_]+)\"", text))
    assert found, "the reading found no code literal: the patterns are stale"
    assert found <= known, f"codes not in FailureCode: {sorted(found - known)}"


@pytest.mark.parametrize(
    ("schema", "holders"),
    [
        (codec.reply_schema(), ["Reply"]),
        (trace_events_schema(), [TurnFailed.__name__, CompactionFailed.__name__]),
    ],
)
def test_the_schemas_reference_the_failure_codes(schema: dict, holders: list[str]) -> None:
    assert schema["$defs"]["FailureCode"]["enum"] == [code.value for code in FailureCode]
    for name in holders:
        choices = schema["$defs"][name]["properties"]["code"]["anyOf"]
        assert {"$ref": "#/$defs/FailureCode"} in choices


def test_a_config_error_is_a_value_error_as_the_seeds_callers_catch_it():
    from agentstream.models.endpoints import ModelEndpoint

    with pytest.raises(ValueError, match="unknown provider"):
        ModelEndpoint(id="x", provider="nope", base_url="http://x", model="m")
    assert issubclass(errors.ConfigError, errors.AgentStreamError)
