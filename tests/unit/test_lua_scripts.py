"""The Lua scripts of the runtime: one ``.lua`` file per operation, each readable whole.

- every script the runtime sends is a file of :mod:`agentstream.runtime.lua`, loaded by name,
  and every file there is used (read from the source with :mod:`ast`);
- no module holds Lua in a string (no script put together from pieces across modules);
- a helper function written in several scripts has the same text in each;
- the files ship as package data.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from agentstream.runtime.lua import script

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "shared/agentstream/runtime/lua"
FILES = sorted(path.stem for path in LUA.glob("*.lua"))
SOURCES = [*(ROOT / "shared/agentstream").rglob("*.py"), *(ROOT / "services").rglob("*.py")]


def _loaded_names() -> dict[str, list[str]]:
    """{script name: the modules that load it with ``script("<name>")``}."""
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "script"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.setdefault(node.args[0].value, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_script_loaded_is_a_file_and_every_file_is_loaded() -> None:
    loaded = _loaded_names()
    assert sorted(set(loaded) - set(FILES)) == [], "script() names a file that does not exist"
    assert sorted(set(FILES) - set(loaded)) == [], "Lua files no module loads"


def test_no_module_holds_lua_in_a_string() -> None:
    holders = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "redis.call(" in node.value:
                holders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert holders == [], "Lua belongs in agentstream/runtime/lua/<operation>.lua"


def _functions(text: str) -> dict[str, str]:
    """{name: text} of each top-level ``local function`` (from its line to the ``end`` at column 0)."""
    pattern = re.compile(r"^local function (\w+)\(.*?^end$", re.M | re.S)
    return {match.group(1): match.group(0) for match in pattern.finditer(text)}


def test_a_helper_written_in_several_scripts_is_the_same_in_each() -> None:
    seen: dict[str, tuple[str, str]] = {}
    shared = set()
    for name in FILES:
        for function, text in _functions(script(name)).items():
            if function in seen:
                shared.add(function)
                first, where = seen[function]
                assert text == first, f"local function {function} of {name}.lua differs from the one in {where}.lua"
            else:
                seen[function] = (text, name)
    assert {"read_after", "next_fence", "release", "ack_entries"} <= shared


@pytest.mark.parametrize("name", FILES)
def test_a_script_is_read_once_and_says_what_it_does(name: str) -> None:
    assert script(name) is script(name)
    assert script(name).startswith(f"-- {name}.lua: ")


def test_an_unknown_script_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="no Lua script 'nope'"):
        script("nope")


def test_the_scripts_ship_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "*.lua" in config["package-data"]["agentstream.runtime.lua"]
