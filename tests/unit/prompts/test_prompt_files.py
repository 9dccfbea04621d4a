import jinja2
import pydantic
import pytest

from agentstream.declarations.prompts import PromptFile, PromptFileError, find_prompt_file, load_prompt_file
from agentstream.declarations.tools import tool
from agentstream.errors import ConfigError

BASE = {
    "system": "You help.{% block tools %} Use tools.{% endblock %} Cite as {{ citation }}.",
    "texts": {"nudge": "Answer now."},
    "tools": {"add": {"description": "Add numbers.", "arguments": {"a": "first"}}},
    "models": [
        {
            "endpoints": ["small"],
            "blocks": {"tools": "{{ super() }} One tool first."},
            "texts": {"nudge": "One sentence."},
            "tools": {"add": {"arguments": {"b": "second"}}},
        },
    ],
}


@tool
def add(a: int, b: int) -> int:
    """Original."""
    return a + b


def test_base_and_layer_resolve_per_model():
    pf = PromptFile.model_validate(BASE)
    assert pf.blocks == {"tools"} and pf.endpoints == {"small"}
    base = pf.for_model("big")
    assert base.system(citation="[1]") == "You help. Use tools. Cite as [1]."
    small = pf.for_model("small")
    assert small.system(citation="[1]") == "You help. Use tools. One tool first. Cite as [1]."
    assert small.text("nudge") == "One sentence." and base.text("nudge") == "Answer now."
    assert base.digest != small.digest and len(base.digest) == 16
    assert pf.for_model("big").digest == base.digest


def test_tool_texts_replace_the_tools_own():
    (described,) = PromptFile.model_validate(BASE).for_model("small").described([add])
    assert described is not add and add.description == "Original."
    assert described.description == "Add numbers."
    assert described.parameters["properties"]["a"]["description"] == "first"
    assert described.parameters["properties"]["b"]["description"] == "second"
    assert "description" not in add.parameters["properties"]["a"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"models": [{"endpoints": ["x"], "blocks": {"nope": "y"}}]}, "blocks the system template does not define"),
        ({"models": [{"endpoints": ["x"], "texts": {"nope": "y"}}]}, "texts the base does not define"),
        ({"models": [{"endpoints": ["x"]}, {"endpoints": ["x"]}]}, "both name endpoint 'x'"),
        ({"models": [{"endpoints": []}]}, "at least 1"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_bad_files_are_refused(change, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        PromptFile.model_validate({**BASE, **change})


def test_template_syntax_and_variables_are_checked_at_load():
    with pytest.raises((jinja2.TemplateSyntaxError, pydantic.ValidationError)):
        PromptFile.model_validate({"system": "{% block x %}unclosed"})
    pf = PromptFile.model_validate(BASE)
    with pytest.raises(PromptFileError, match=r"unknown variables \['citation'\]"):
        pf.check_variables([])
    pf.check_variables(["citation"])
    with pytest.raises(jinja2.UndefinedError):
        pf.for_model(None).system()


def test_errors_for_missing_texts_tools_and_files(tmp_path):
    prompts = PromptFile.model_validate(BASE).for_model(None)
    with pytest.raises(PromptFileError, match="no text 'zzz'"):
        prompts.text("zzz")
    with pytest.raises(PromptFileError, match="tools the agent does not have"):
        prompts.described([])
    with pytest.raises(ConfigError, match="not found"):
        find_prompt_file("no-such-file.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("system: [unclosed")
    with pytest.raises(ConfigError, match="not valid"):
        load_prompt_file(str(bad))


def test_prompts_dir_is_searched(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("system: Hello {{ name }}\n")
    monkeypatch.setenv("AGENTSTREAM_PROMPTS_DIR", str(tmp_path))
    pf = load_prompt_file("mine.yaml", variables=["name"])
    assert pf.for_model(None).system(name="you") == "Hello you"


def test_the_demo_prompt_file_gives_the_measured_text():
    from agentstream.demo import app as demo_app

    assert demo_app.SYSTEM_PROMPT == (
        "You are a helpful assistant with tools. Use the calculator tool for arithmetic questions and "
        "answer other questions yourself. After you get a tool result, answer the user's question "
        "briefly using that result."
    )
    large = load_prompt_file("demo.yaml").for_model("large").system()
    assert large.startswith("You are a helpful assistant with tools. Think about which tool fits")
