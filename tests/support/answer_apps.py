"""An app for the e2e tests of the agent's answers and prompts (issue 13, sections 4–7):
``tests.support.answer_apps:app``, and the scripted model rule that plays each agent
(:func:`rule`; it tells agents apart by the first word of their system prompt).

- ``manager`` (``resets_on_answer``, ``max_passes=1``): hands three tasks to ``helper``
  subagents one after another; each answer starts its passes count again.
- ``writer``: its system prompt is a prompt file with a layer for the ``big`` endpoint and one
  for ``default``, and it cites (``BRACKETS``): it searches the handbook, then answers citing
  the passage; its tool's description comes from the file's layer of the call's endpoint.
- ``scribe``: its system prompt is a function of the turn and the example citation.
- ``briefer``: a text prompt with ``{context}`` (a chat-turn input's context) and ``{citation}``.
- ``adder``: the ``add`` tool's result is its answer (``result_as_answer``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pydantic

from agentstream import Agent, App, Document, Passage, ToolResult, tool
from agentstream.context import BRACKETS, ContextConfig
from agentstream.declarations.inputs import ChatTurnInput
from agentstream.declarations.prompts import PromptFile
from agentstream.delegation import Delegation


class Task(pydantic.BaseModel):
    task: str = pydantic.Field(description="The task.")


ask_helper = Delegation(
    name="ask_helper", description="Hand a task to the helper subagent.", input=Task, agent="helper", max_depth=1
)


@tool(timeout_s=5)
def search(topic: str) -> ToolResult:
    """Search the handbook (the tool's own description)."""
    return ToolResult(
        text="1 passage.",
        elements=[
            Document(id=f"hb:{topic}", title="Leave policy", url="https://handbook.example/leave"),
            Passage(id=f"hb:{topic}#0", ref=f"hb:{topic}", text="Staff get 25 days of paid leave a year."),
        ],
    )


@tool(timeout_s=5)
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return f"{a} + {b} = {a + b}"


WRITER_PROMPTS = PromptFile.model_validate(
    {
        "system": "WRITER. {% block style %}Answer plainly.{% endblock %} Cite each source like {{ citation }}.",
        "tools": {"search": {"description": "Search the staff handbook (base text)."}},
        "models": [
            {
                "endpoints": ["big"],
                "blocks": {"style": "{{ super() }} Big layer: be thorough."},
                "tools": {
                    "search": {"description": "Search the handbook (big layer).", "arguments": {"topic": "One word."}}
                },
            },
            {"endpoints": ["default"], "blocks": {"style": "Default layer: be brief."}},
        ],
    }
)


def scribe_prompt(turn, citation):
    return f"SCRIBE. The turn says {turn.text!r}; cite like {citation}; {{braces}} stay."


app = App(
    agents=[
        Agent(
            name="writer",
            system_prompt=WRITER_PROMPTS,
            tools=[search],
            models=["big"],
            max_passes=2,
            context=ContextConfig(citations=BRACKETS),
        ),
        Agent(name="scribe", system_prompt=scribe_prompt, context=ContextConfig(citations=BRACKETS)),
        Agent(
            name="briefer",
            system_prompt="BRIEFER. Context: {context}. Cite like {citation}; {other} braces stay.",
            input=ChatTurnInput,
            context=ContextConfig(citations=BRACKETS),
        ),
        Agent(
            name="adder",
            system_prompt="ADDER. Use the add tool; a {placeholder} of another name stays.",
            tools=[add],
            result_as_answer=["add"],
        ),
        Agent(
            name="manager",
            system_prompt="MANAGER. Hand each task to the helper.",
            tools=[ask_helper],
            max_passes=1,
            tool_rounds_after_cap=0,
            resets_on_answer=True,
        ),
        Agent(name="helper", system_prompt="HELPER. Do the task."),
    ]
)


# --- the scripted model ------------------------------------------------------------------------


def _calls(name: str, arguments: dict[str, Any], seed: str) -> dict[str, Any]:
    call_id = f"call_{hashlib.sha256(seed.encode()).hexdigest()[:10]}"
    return {
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            ],
        },
        "finish_reason": "tool_calls",
    }


def _answer(text: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}


def rule(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    role = system.split(".", 1)[0]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if role == "MANAGER":
        if body.get("tools") and len(results) < 3:  # a task while the tools are offered
            return _calls("ask_helper", {"task": f"task {len(results) + 1}"}, seed=f"manager/{len(results)}")
        return _answer(f"Done after {len(results)} answers.")
    if role == "WRITER":
        if not results:
            return _calls("search", {"topic": "leave"}, seed=f"writer/{len(messages)}")
        return _answer("Staff get 25 days [2].")
    if role in ("SCRIBE", "BRIEFER"):
        return _answer("Noted.")
    if role == "ADDER":
        last = messages[-1]
        if last["role"] == "user":
            return _calls("add", {"a": 20, "b": 22}, seed=f"adder/{len(messages)}")
        return _answer("The model should not have been called after the tool's answer.")
    if role == "HELPER":
        task = next(m["content"] for m in messages if m["role"] == "user")
        return _answer(f"helped with {task}")
    return _answer("I am not sure.")
