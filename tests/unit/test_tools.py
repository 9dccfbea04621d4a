import asyncio

import pytest

from agentstream.app.base import invoke_tool, load_app
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.declarations.tools import tool
from agentstream.errors import ConfigError, ToolArgumentsError


@tool(timeout_s=0.2)
def add(a: int, b: int = 2) -> int:
    """Add two integers.

    More text."""
    return a + b


@tool(timeout_s=0.1)
async def sleepy(seconds: float) -> str:
    """Sleep."""
    await asyncio.sleep(seconds)
    return "ok"


@tool
def boom() -> str:
    """Raise."""
    raise RuntimeError("kaput")


def test_schema_comes_from_the_signature():
    d = add.definition()
    assert d["name"] == "add" and d["description"] == "Add two integers."
    assert d["parameters"]["required"] == ["a"]
    assert d["parameters"]["properties"]["a"]["type"] == "integer"
    assert d["parameters"]["additionalProperties"] is False


@pytest.mark.parametrize("raw", ["", "   ", "\n"])
def test_empty_arguments_mean_empty_object(raw):
    assert boom.parse_arguments(raw) == {}


@pytest.mark.parametrize(
    "raw, message",
    [
        ('{"a": 1}{"a": 2}', "not valid JSON"),  # C11: concatenated objects
        ('{"a": "x"}', "a: Input should be a valid integer"),
        ("[1, 2]", "must be a JSON object"),
        ('{"a": 1, "zzz": 3}', "zzz: Extra inputs are not permitted"),
        ("{}", "a: Field required"),
        (
            '{"a": 1, "b": "\\ud800"}',
            r"in the value of key `b`\) is a lone high UTF-16 surrogate",
        ),  # not Unicode (RFC 8259 §8.2)
        ('{"a": 1, "b": "\\udc00x"}', "lone low UTF-16 surrogate"),
        ('{"a": 1, "b": "\ud800"}', "not UTF-8"),  # the raw character, not its escape
    ],
)
def test_bad_arguments_are_explained(raw, message):
    with pytest.raises(ToolArgumentsError, match=message):
        add.parse_arguments(raw)


async def test_invoke_turns_every_failure_into_an_error_result():
    assert (await invoke_tool(add, '{"a": 1}')).text == "3"
    bad = await invoke_tool(add, '{"a": "one"}')
    assert bad.error == "invalid_arguments" and "valid integer" in bad.text
    raised = await invoke_tool(boom, "")
    assert raised.error == "tool_error" and "RuntimeError: kaput" in raised.text
    slow = await invoke_tool(sleepy, '{"seconds": 5}')
    assert slow.error == "timeout" and "0.1 s" in slow.text


def test_structured_results_keep_data():
    @tool
    def pair() -> dict:
        """A dict."""
        return {"x": 1}

    result = asyncio.run(invoke_tool(pair, ""))
    assert result.data == {"x": 1} and result.text == '{"x":1}'


def test_passes_cap_and_tool_choice():
    agent = Agent(name="a", system_prompt="s", tools=[add], max_passes=2, first_tool_choice="required")
    # two calls with tools, one more past the cap that keeps them (not forced), then none
    assert [agent.tool_choice_for(i) for i in range(4)] == ["required", "auto", "auto", "none"]
    with pytest.raises(ConfigError, match="tool_rounds_after_cap"):
        Agent(name="a", system_prompt="s", tool_rounds_after_cap=-1)
    with pytest.raises(ConfigError):
        Agent(name="a", system_prompt="s", max_passes=0)


def test_load_app_errors_are_clear():
    with pytest.raises(ConfigError, match="module:attribute|package.module:attribute"):
        load_app("nocolon")
    with pytest.raises(ConfigError, match="cannot import"):
        load_app("no_such_module_xyz:app")
    with pytest.raises(ConfigError, match="no attribute"):
        load_app("tests.support.apps:nope")
    assert isinstance(load_app("tests.support.apps:app"), App)


# --- sync tools run on kept daemon threads ----------------------------------------------------

import contextvars  # noqa: E402
import threading  # noqa: E402

_seen_var: contextvars.ContextVar[str] = contextvars.ContextVar("seen_var", default="unset")
_threads: list[threading.Thread] = []  # the thread of each call of `where`, in order


@tool(timeout_s=5)
def where() -> str:
    """Which thread runs the call, and what the context variable held."""
    before = _seen_var.get()
    _seen_var.set("set by the tool")
    current = threading.current_thread()
    _threads.append(current)
    return f"{current.ident}|{current.name}|{current.daemon}|{before}"


_release = threading.Event()


@tool(timeout_s=0.2)
def stuck() -> str:
    """Blocks until the test lets it go."""
    _release.wait(10)
    return "late"


async def test_a_sync_tool_call_reuses_the_daemon_thread_of_the_call_before():
    first = (await invoke_tool(where, "{}")).text.split("|")
    second = (await invoke_tool(where, "{}")).text.split("|")
    assert _threads[-1] is _threads[-2]  # the same thread object: none started per call
    assert second[1] == "tool:where" and second[2] == "True"
    assert first[3] == second[3] == "unset"  # a call's context variables do not reach the next one


async def test_a_stuck_sync_tool_keeps_only_its_own_thread():
    _release.clear()
    try:
        timed_out = await invoke_tool(stuck, "{}")
        assert timed_out.error == "timeout"
        # the stuck thread is still running: the next calls get other threads, at once
        results = await asyncio.wait_for(asyncio.gather(*(invoke_tool(where, "{}") for _ in range(3))), 2)
        assert all(not r.error for r in results)
        stuck_threads = [t for t in threading.enumerate() if t.name == "tool:stuck"]
        assert stuck_threads and not any(t is s for t in _threads[-3:] for s in stuck_threads)
    finally:
        _release.set()
