"""The demo app's offline tools: calculator, Python docs search and read."""

from __future__ import annotations

import math

import pytest

from agentstream.app.base import invoke_tool, load_app
from agentstream.declarations.tools import Tool
from agentstream.demo import tools as demo_tools
from agentstream.demo.tools import (
    calculator,
    evaluate,
    python_docs_read,
    python_docs_search,
    read_docs,
    search_docs,
)

# -- calculator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2", "3"),
        ("1234 * 5678", "7006652"),
        ("(3 + 4) * 12", "84"),
        ("7 * 8 - 6", "50"),
        ("1000 / 8", "125"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),
        ("-(2 + 3)", "-5"),
        ("+4", "4"),
        ("sqrt(144)", "12"),
        ("2 ** -1", "0.5"),
        ("factorial(5)", "120"),
        ("max(3, 9, 4)", "9"),
        ("abs(-3.5)", "3.5"),
        ("{(3 + 4) * 12}", "84"),  # the braces SmolLM2 sometimes adds
        ("{12} * {12}", "144"),
        ("  `2 + 2` ", "4"),
        ("6 * 7 =", "42"),
        ("1_000 + 1", "1001"),
    ],
)
def test_calculator_computes(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


def test_calculator_math_functions_and_constants() -> None:
    assert float(calculator("sin(pi / 2)")) == pytest.approx(1.0)
    assert float(calculator("cos(0)")) == pytest.approx(1.0)
    assert float(calculator("log(e)")) == pytest.approx(1.0)
    assert float(calculator("log10(1000)")) == pytest.approx(3.0)
    assert float(calculator("pi")) == pytest.approx(math.pi)
    assert float(calculator("0.1 + 0.2")) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "unknown function"),
        ("__import__('os').system('true')", "unknown function"),
        ("().__class__", "unsupported syntax"),
        ("open('/etc/passwd')", "unknown function"),
        ("x + 1", "unknown name"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("2**99999999", "exponent"),
        ("pow(10, 100000)", "exponent"),
        ("9**999 * 9**999 * 9**999 * 9**999", "digits"),
        ("factorial(100000)", "factorial"),
        ("10.0 ** 400", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("sqrt(-1)", "domain"),
        ("log(0)", "domain"),
        ("", "empty"),
        ("1 +", "cannot parse"),
        ("sqrt(x=4)", "keyword"),
        ("max()", "wrong arguments"),
        ("1" + "+1" * 200, "longer than"),
        ("(-8) ** 0.5", "complex"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


async def test_calculator_errors_become_error_results() -> None:
    assert isinstance(calculator, Tool)
    result = await invoke_tool(calculator, '{"expression": "__import__(\'os\')"}')
    assert result.error == "tool_error"
    assert "ValueError" in result.text and "unknown function" in result.text
    ok = await invoke_tool(calculator, '{"expression": "6 * 7"}')
    assert ok.error is None and ok.text == "42"


def test_calculator_schema() -> None:
    assert calculator.definition()["parameters"]["required"] == ["expression"]
    assert calculator.definition()["description"].startswith("Evaluate an arithmetic expression")


# -- Python docs -----------------------------------------------------------------------------


def test_search_finds_the_for_statement() -> None:
    names = [name for name, *_ in search_docs("for statement")]
    assert names[0] == "for"
    assert [name for name, *_ in search_docs("while loop")][0] == "while"


@pytest.mark.parametrize("query", ["str split", "str.split", "split a string"])
def test_search_finds_str_split(query: str) -> None:
    names = [name for name, *_ in search_docs(query, limit=3)]
    assert "str.split" in names


def test_search_finds_stdlib_functions() -> None:
    assert search_docs("json loads")[0][0] == "json.loads"
    assert "math.sqrt" in [name for name, *_ in search_docs("sqrt")]


def test_search_respects_limit_and_kinds() -> None:
    hits = search_docs("list", limit=2)
    assert len(hits) == 2
    name, kind, summary, score = hits[0]
    assert kind in {"language reference", "builtin", "builtin method", "module", "stdlib"}
    assert score > 0


def test_search_tool_text() -> None:
    text = python_docs_search("for statement", limit=3)
    assert text.splitlines()[0].startswith("for (language reference)")
    assert "python_docs_read" in text
    assert "No Python documentation matches" in python_docs_search("zzqqxxnonsense")
    with pytest.raises(ValueError, match="empty"):
        python_docs_search("   ")


def test_search_index_is_built_once() -> None:
    search_docs("for")
    info_before = demo_tools._index.cache_info()
    search_docs("while")
    assert demo_tools._index.cache_info().misses == info_before.misses


def test_read_language_reference_topic() -> None:
    text = python_docs_read("for", max_chars=100_000)
    assert 'The "for" statement' in text
    assert "not shown" not in text


def test_read_builtin_method_and_stdlib() -> None:
    assert "sep" in python_docs_read("str.split")
    assert "Deserialize" in python_docs_read("json.loads")
    assert "str.split" in python_docs_read("str.split()")  # a trailing () is forgiven


def test_read_truncates_with_a_note() -> None:
    full = read_docs("for", max_chars=1_000_000)
    assert full is not None
    cut = python_docs_read("for", max_chars=200)
    assert cut.startswith(full[:150])
    omitted = len(full) - 200
    assert cut.endswith(f"[... {omitted} more characters of 'for' not shown]")


@pytest.mark.parametrize("topic", ["no_such_thing_xyz", "os.no_such_function", "definitely not a topic", "requests"])
def test_read_unknown_topic_says_to_search(topic: str) -> None:
    text = python_docs_read(topic)
    assert text.startswith("No Python documentation found")
    assert "python_docs_search" in text


def test_read_never_imports_unknown_modules() -> None:
    assert read_docs("antigravity") is None
    assert read_docs("this") is None


def test_read_rejects_empty_topic() -> None:
    with pytest.raises(ValueError, match="empty"):
        python_docs_read("  ")


# -- the app ---------------------------------------------------------------------------------


def test_demo_app_loads() -> None:
    app = load_app("agentstream.demo.app:app")
    agent = app.agent("demo")
    assert agent is not None
    assert agent.tool("calculator") is calculator
    assert agent.tool_choice_for(0) == "required"
    assert agent.tool_choice_for(agent.max_passes + agent.tool_rounds_after_cap) == "none"
    assert {"calculator", "python_docs_search", "python_docs_read"} <= set(app.tools)
