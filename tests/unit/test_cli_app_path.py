"""What the CLI tells a newcomer about ``--app`` and ``--agent``, and the schemas' ``$schema``
(issue 38): a file name where a module goes, a missing attribute (the module's App objects are
listed), the agent that answers when none is named, ``$schema`` first in every schema."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from agentstream.cli.apppath import DEMO_APP, answering_agent, apps_named, file_path_mistake
from agentstream.cli.commands import cli
from agentstream.errors import ConfigError

WEATHER = textwrap.dedent(
    """
    from agentstream import Agent, App, tool

    @tool
    def get_weather(city: str) -> str:
        \"\"\"Current weather for a city.\"\"\"
        return f"18C, cloudy in {city}"

    app = App(agents=[Agent(name="weather", system_prompt="You answer weather questions.", tools=[get_weather])])
    other = App(agents=[Agent(name="a", system_prompt="A."), Agent(name="b", system_prompt="B.")])
    """
)


@pytest.fixture
def weather_folder(tmp_path, monkeypatch):
    """A fresh project folder holding weather.py, as the current directory."""
    (tmp_path / "weather.py").write_text(WEATHER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "weather", raising=False)
    yield tmp_path
    __import__("sys").modules.pop("weather", None)


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), env={"AGENTSTREAM_APP": ""})


@pytest.mark.parametrize("path", ["weather.py:app", "./weather.py:app", "src/weather.py:app"])
def test_a_file_name_for_the_app_says_to_give_the_module(path, weather_folder):
    result = _invoke("schema", "events", "--app", path)
    assert result.exit_code == 2
    expected = "src.weather:app" if path.startswith("src/") else "weather:app"
    assert f"give the module instead: --app {expected} (drop the .py" in result.output, result.output


def test_a_missing_app_attribute_lists_the_modules_app_objects(weather_folder):
    result = _invoke("schema", "events", "--app", "weather:nope")
    assert result.exit_code == 2
    assert "has no attribute 'nope'; its App objects: weather:app, weather:other" in result.output, result.output


def test_the_messages_are_pure_decisions():
    assert file_path_mistake("weather:app") is None and file_path_mistake("pkg.mod:app") is None
    assert apps_named("m", []) == "module 'm' has no App object at its top level"
    assert apps_named("m", ["b", "a"]) == "its App objects: m:a, m:b"


def test_an_app_with_one_agent_needs_no_agent_name():
    assert answering_agent("weather:app", ["weather"], None) == "weather"
    assert answering_agent("weather:app", ["weather"], "weather") == "weather"
    assert answering_agent(DEMO_APP, ["demo", "docs", "manager"], None) == "demo"
    with pytest.raises(ConfigError, match=r"has 2 agents \(a, b\): name the one that answers with --agent"):
        answering_agent("weather:other", ["b", "a"], None)
    with pytest.raises(ConfigError, match=r"has no agent 'demo' \(its agents: weather\)"):
        answering_agent("weather:app", ["weather"], "demo")


def test_run_with_an_app_of_several_agents_and_no_agent_is_one_line_before_anything_starts(weather_folder):
    result = _invoke("run", "hi", "--app", "weather:other")
    assert result.exit_code == 2
    assert "name the one that answers with --agent" in result.output and "embedded Redis" not in result.output


@pytest.mark.parametrize("args", [["schema", "turn"], ["schema", "reply"], ["schema", "events"]])
def test_every_schema_starts_with_its_dialect(args):
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    assert next(iter(schema)) == "$schema" and schema["$schema"].startswith("https://json-schema.org/")


def test_the_schema_of_each_agent_starts_with_its_dialect(weather_folder):
    result = _invoke("schema", "turn", "--app", "weather:other")
    assert result.exit_code == 0, result.output
    for schema in json.loads(result.output).values():
        assert next(iter(schema)) == "$schema"
