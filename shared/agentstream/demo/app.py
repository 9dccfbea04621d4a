"""The demo app (``agentstream.demo.app:app``): agents on offline tools.

- ``demo`` answers with a calculator and the Python docs. The settings suit the embedded
  SmolLM2-135M model (see ``MODEL_NOTES.md`` next to this file): the first pass forces a tool
  call (``first_tool_choice="required"``), and with ``max_passes=2`` the second pass is the
  last, made with tool choice ``none``, so the model must answer from the tool's result instead
  of calling tools again. Larger models work with the same settings.
- ``manager`` does nothing itself: it hands the question to an ``arithmetic`` subagent (the
  ``ask_assistant`` delegation, which runs on a child trace of its own; the subagent has only
  the calculator) and answers from its result:
  ``agentstream run --agent manager "What is 1234 * 5678?"``.
- ``notes`` chats without tools in a deliberately small window (1 500 tokens), and summarises
  every turn but the running one when its context passes 40 % of it, so a short conversation
  already compacts: ``agentstream run --agent notes --turns 6 "Tell me one thing about Python."``.
"""

from __future__ import annotations

import pydantic

from agentstream.app import Agent, App
from agentstream.context import Compact, ContextConfig, ContextPolicy, ModelLimits, Share, Tokens, turns
from agentstream.delegation import Delegation
from agentstream.demo.tools import calculator, python_docs_read, python_docs_search

SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Use the calculator tool for arithmetic and the "
    "python_docs_search and python_docs_read tools for questions about Python. "
    "After you get a tool result, answer the user's question briefly using that result."
)

demo = Agent(
    name="demo",
    system_prompt=SYSTEM_PROMPT,
    tools=[calculator, python_docs_search, python_docs_read],
    max_passes=2,
    tool_choice="auto",
    first_tool_choice="required",
    max_output_tokens=256,
    temperature=0.0,
)



class Task(pydantic.BaseModel):
    """What the manager hands to the assistant."""

    task: str = pydantic.Field(description="The user's question, copied word for word.")


ask_assistant = Delegation(
    name="ask_assistant",
    description="Hand an arithmetic question to the assistant subagent, which has a calculator, and get its "
    "answer back.",
    input=Task,
    agent="arithmetic",
    task_text=lambda task: task.task if task.task.rstrip().endswith("?") else f"What is {task.task}?",
    max_depth=1,
    deadline_s=240.0,
)

arithmetic = Agent(
    name="arithmetic",
    system_prompt=(
        "You are a helpful assistant with tools. Use the calculator tool for arithmetic. "
        "After you get a tool result, answer the user's question briefly using that result."
    ),
    tools=[calculator],
    max_passes=2,
    first_tool_choice="required",
    max_output_tokens=128,
    temperature=0.0,
)

manager = Agent(
    name="manager",
    system_prompt=(
        "You are a helpful assistant with tools. Use the ask_assistant tool for arithmetic. "
        "After you get a tool result, answer the user's question briefly using that result."
    ),
    tools=[ask_assistant],
    max_passes=2,
    first_tool_choice="required",
    max_output_tokens=256,
    temperature=0.0,
)

notes = Agent(
    name="notes",
    system_prompt="You are a friendly assistant. Answer in two or three short sentences.",
    max_output_tokens=128,
    temperature=0.0,
    context=ContextConfig(
        policy=ContextPolicy(
            output_reserve=Tokens(256),
            compact=Compact(where=turns[:-1], when=Share(0.4), summary_output=Tokens(256)),
        )
    ),
    model_limits=ModelLimits(window=Tokens(1500)),
)

app = App(agents=[demo, arithmetic, manager, notes])

DEMO_QUESTIONS = ("What is 1234 * 5678?",)
"""Questions for which the demo's pipeline works reliably with SmolLM2-135M (MODEL_NOTES.md)."""
