"""An agent's system prompt (issue 13, section 5): a text with ``{citation}`` and ``{context}``
filled in one pass, a function of (turn, citation), or a prompt file whose layer follows the
call's endpoint; the file is checked when the agent is made; a tool's result as the answer."""

from __future__ import annotations

import dataclasses

import pytest

from agentstream.context import BRACKETS, FULLWIDTH, ContextConfig, build_request
from agentstream.declarations.agents import Agent
from agentstream.declarations.inputs import ChatTurnInput
from agentstream.declarations.prompts import PromptFile, PromptFileError, fill_prompt, prompt_template, turn_context
from agentstream.declarations.tools import tool
from agentstream.errors import ConfigError, PromptError
from agentstream.steps.decision import CallModel, EndTurn, decide
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnInput
from tests.support import docs


@tool
def add(a: int, b: int) -> str:
    """Add two numbers (own text)."""
    return str(a + b)


FILE = {
    "system": "{% block role %}Base.{% endblock %} Cite like {{ citation }}.{% if context %} Context: {{ context }}{% endif %}",
    "tools": {"add": {"description": "Add (base)."}},
    "models": [
        {
            "endpoints": ["big"],
            "blocks": {"role": "{{ super() }} Big."},
            "tools": {"add": {"arguments": {"a": "The first."}}},
        },
        {"endpoints": ["small"], "blocks": {"role": "Small."}, "tools": {"add": {"description": "Add (small)."}}},
    ],
}


def turn(text="Hi", **fields):
    return TurnInput(turn_id="t1", agent="a", text=text, **fields)


def test_placeholders_are_filled_in_one_pass_and_other_braces_stay():
    assert fill_prompt(" Cite as {citation}. {context} {x} {{y}} ", citation="[1]", context="{citation} {context}") == (
        "Cite as [1]. {citation} {context} {x} {{y}}"
    )
    assert fill_prompt("No placeholders {json: 1}") == "No placeholders {json: 1}"
    write = prompt_template("Ctx: {context}|{citation}")
    assert write(ChatTurnInput(text="x", context="  ok  "), None) == "Ctx: ok|"
    assert turn_context(ChatTurnInput(text="x")) == "" and turn_context(object()) == ""


def test_a_text_prompt_gets_the_citation_example_and_the_turns_context():
    agent = Agent(
        name="a",
        system_prompt="Cite like {citation}. {context}",
        input=ChatTurnInput,
        context=ContextConfig(citations=FULLWIDTH),
    )
    event = turn(input={"text": "Hi", "context": "The user {citation} is new."})
    assert agent.system_text(event) == "Cite like 【1】. The user {citation} is new."
    assert Agent(name="a", system_prompt="Cite like {citation}.").system_text(None) == "Cite like ."
    assert build_request([event], agent, turn_id="t1", step=0).system == "Cite like 【1】. The user {citation} is new."


def test_a_prompt_function_gets_the_parsed_turn_and_the_example():
    seen = []

    def prompt(parsed, citation):
        seen.append((type(parsed).__name__, parsed.text, citation))
        return f"About {parsed.text}"

    agent = Agent(name="a", system_prompt=prompt, context=ContextConfig(citations=BRACKETS))
    assert build_request([turn("cats")], agent, turn_id="t1", step=0).system == "About cats"
    assert seen == [("Text", "cats", "[1]")]
    broken = Agent(name="a", system_prompt=lambda parsed, citation: 1 / 0)
    with pytest.raises(PromptError, match="ZeroDivisionError"):
        broken.system_text(turn())
    with pytest.raises(PromptError, match="not a text"):
        Agent(name="a", system_prompt=lambda parsed, citation: 7).system_text(turn())


def test_a_prompt_files_layer_follows_the_calls_endpoint_with_its_tool_texts():
    agent = Agent(
        name="a",
        system_prompt=PromptFile.model_validate(FILE),
        tools=[add],
        models=["big", "small"],
        input=ChatTurnInput,
        context=ContextConfig(citations=BRACKETS),
    )
    event = turn(input={"text": "Hi", "context": "Be kind."})
    texts = {}
    for model in ("default", "big", "small"):
        on = dataclasses.replace(agent, model=model)  # as the agent loop offers it for a turn on that endpoint
        request = build_request([event], on, turn_id="t1", step=0)
        texts[model] = (
            request.system,
            request.tools[0].description,
            request.tools[0].parameters["properties"]["a"].get("description"),
        )
    assert texts == {
        "default": ("Base. Cite like [1]. Context: Be kind.", "Add (base).", None),
        "big": ("Base. Big. Cite like [1]. Context: Be kind.", "Add (base).", "The first."),
        "small": ("Small. Cite like [1]. Context: Be kind.", "Add (small).", None),
    }
    assert add.description == "Add two numbers (own text)."  # the tool itself is unchanged
    digests = {m: dataclasses.replace(agent, model=m).prompt_digest for m in ("default", "big", "small")}
    assert len(set(digests.values())) == 3 and all(len(d) == 16 for d in digests.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"system": "{% block role %}Hello {{ user_name }}{% endblock %}"},
            r"unknown variables \['user_name'\]",
        ),  # a renamed field fails at startup
        ({"models": [{"endpoints": ["big"], "blocks": {"role": "{{ citatoin }}"}}]}, "citatoin"),
        ({"tools": {"subtract": {"description": "x"}}}, "tools the agent does not have"),
        (
            {"models": [{"endpoints": ["big"], "tools": {"add": {"arguments": {"c": "x"}}}}]},
            "arguments tool 'add' does not take",
        ),
    ],
)
def test_a_prompt_file_that_does_not_fit_its_agent_fails_when_the_agent_is_made(change, message):
    with pytest.raises(PromptFileError, match=message):
        Agent(name="a", system_prompt=PromptFile.model_validate({**FILE, **change}), tools=[add])


def test_a_prompt_file_without_a_system_template_and_a_bad_prompt_are_refused():
    with pytest.raises(ConfigError, match="no system template"):
        Agent(name="a", system_prompt=PromptFile.model_validate({"texts": {"x": "y"}}))
    with pytest.raises(ConfigError, match="system_prompt must be"):
        Agent(name="a", system_prompt=42)  # type: ignore[arg-type]


def test_a_tools_result_is_the_answer_and_later_turns_show_it():
    agent = Agent(name="a", system_prompt="S", tools=[add], result_as_answer=["add"])
    call = ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}')
    output = ModelOutput(turn_id="t1", step=0, tool_calls=(call,), stop_reason="tool_calls")
    events = [turn(), output]
    for bad in (
        ToolOutput(turn_id="t1", call_id="c1", name="add", text="Error", error="tool_error"),
        ToolOutput(turn_id="t1", call_id="c1", name="add", text="  "),
    ):
        assert decide([*events, bad], lambda name: agent) == CallModel(turn(), agent, 1)  # no answer: the model goes on
    result = ToolOutput(turn_id="t1", call_id="c1", name="add", text=" 3 ")
    assert decide([*events, result], lambda name: agent) == EndTurn(turn(), "3", answer_call="c1")
    history = [
        *events,
        result,
        TurnEnded(turn_id="t1", answer="3", answer_call="c1"),
        TurnInput(turn_id="t2", agent="a", text="Again"),
    ]
    request = build_request(history, agent, turn_id="t2", step=0)
    assert [type(m).__name__ for m in request.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "UserMessage",
    ]
    assert request.messages[3].content == "3"
    with pytest.raises(ConfigError, match="result_as_answer names tools it does not have"):
        Agent(name="a", system_prompt="S", tools=[add], result_as_answer=["nope"])


def test_a_tools_answer_cites_the_sources_its_result_carries():
    from agentstream.wire.events import Document, Passage

    agent = Agent(
        name="a", system_prompt="S", tools=[add], result_as_answer=["add"], context=ContextConfig(citations=BRACKETS)
    )
    call = ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}')
    result = ToolOutput(
        turn_id="t1",
        call_id="c1",
        name="add",
        text="Staff get 25 days.",
        elements=(
            Document(id="hb", title="Leave", url="https://h.example/leave"),
            Passage(id="hb#0", ref="hb", text="Staff get 25 days."),
        ),
    )
    events = [turn(), ModelOutput(turn_id="t1", step=0, tool_calls=(call,), stop_reason="tool_calls"), result]
    ended = decide(events, lambda name: agent)
    assert isinstance(ended, EndTurn) and ended.answer == "Staff get 25 days." and ended.answer_call == "c1"
    (cited,) = ended.citations  # the passage, not its document; citing the whole answer
    assert (cited.number, cited.id, cited.title, cited.url, cited.whole, cited.spans) == (
        2,
        "hb#0",
        "Leave",
        "https://h.example/leave",
        "hb",
        ((0, 18),),
    )


def test_the_readmes_prompt_file_is_the_shipped_one_and_fits_its_agent():
    import re

    from agentstream.declarations.prompts import find_prompt_file, load_prompt_file

    block = re.search(
        r"`prompts/hr.yaml`:\n\n(?:<!--.*?-->\n)?```yaml\n(.*?)```", docs.page("how-to/prompt-files.md"), re.S
    ).group(1)
    shipped = find_prompt_file("hr.yaml").read_text()
    assert shipped.split("\n", 1)[1] == block  # after its comment line
    prompt_file = load_prompt_file("hr.yaml")
    assert prompt_file.endpoints == {"default", "big"} and prompt_file.variables == {"citation"}
