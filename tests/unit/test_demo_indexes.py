"""The demo agents' offline indexes, entry by entry (pure): what one documented name gives."""

from __future__ import annotations

import pytest

from agentstream.demo import docs, tools


def documented() -> None:
    """Read a line.

    Second paragraph, long enough to be kept."""


def undocumented() -> None:
    pass


@pytest.mark.parametrize(
    ("case", "module", "qualname", "obj", "names"),
    [
        ("a builtin shows as its own name", "builtins", "len", len, ["len"]),
        ("a module's name shows qualified", "os", "getcwd", documented, ["os.getcwd"]),
        ("no docstring: no entry", "os", "nothing", undocumented, []),
    ],
)
def test_the_entry_of_a_documented_name(case, module, qualname, obj, names) -> None:
    assert [e.name for e in docs._entry(module, qualname, obj, "u")] == names, case


def test_a_builtin_type_gives_its_entry_then_its_public_methods() -> None:
    names = [e.name for e in docs._builtin_entries("str", str)]
    assert names[0] == "str" and "str.split" in names and not any(n.startswith("str._") for n in names)


def test_the_first_entry_of_a_name_wins_and_its_name_weighs() -> None:
    index = tools._Index()
    index.add("os.path", "module", "Common pathname manipulations.")
    index.add("os.path", "stdlib", "something else")
    assert index.entries == {"os.path": ("module", "Common pathname manipulations.")}
    assert index.words["os.path"]["path"] == 3 and index.words["os.path"]["pathname"] == 1


@pytest.mark.parametrize(
    ("case", "name", "loaded"),
    [
        ("imported already", "sys", True),
        ("safe to import", "textwrap", True),
        ("neither: not imported", "antigravity", False),
    ],
)
def test_which_standard_library_modules_are_read(case, name, loaded) -> None:
    assert (tools._loaded(name) is not None) == loaded, case
