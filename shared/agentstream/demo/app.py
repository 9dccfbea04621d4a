"""The demo app (``agentstream.demo.app:app``): one agent, ``demo``, with offline tools.

The settings suit the embedded SmolLM2-135M model (measurements in ``MODEL_NOTES.md`` next to
this file):

- ``demo`` has the calculator only. With the two Python-docs tools listed as well, SmolLM2-135M
  called a ``python_docs_*`` tool for 20 of 20 arithmetic questions (the calculator was never
  chosen); with the calculator alone it calls it every time, with right arguments for 11 of 14
  questions. The docs tools stay in the app (``extra_tools``), so tool workers serve them; give
  them to an agent whose model can choose between tools (see :data:`DOCS_TOOLS`).
- ``first_tool_choice="required"``: the first pass must call the tool.
- ``max_passes=2``: the second pass is the last, made with tool choice ``none``, so the model
  answers from the tool's result instead of calling the tool again (with ``auto`` after a
  result, the local server can loop on tool calls for minutes).

Two more agents show the delegation and compaction services:

- ``manager`` does nothing itself: it hands the question to a ``demo`` subagent (the
  ``ask_assistant`` delegation, which runs on a child trace of its own) and answers from its
  result: ``agentstream run --agent manager "What is 1234 * 5678?"``.
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
from agentstream.prompts import load_prompt_file

PROMPTS = load_prompt_file("demo.yaml").for_model("default")
"""The demo agent's texts for the ``default`` endpoint, from the shipped ``prompts/demo.yaml``."""

SYSTEM_PROMPT = PROMPTS.system()
"""Chosen by measurement: SmolLM2-135M's arguments and answers change with every word of it."""

DOCS_TOOLS = (python_docs_search, python_docs_read)
"""Search and read the Python documentation; for agents on models larger than SmolLM2-135M."""

demo = Agent(
    name="demo",
    system_prompt=SYSTEM_PROMPT,
    tools=PROMPTS.described([calculator]),
    max_passes=2,
    tool_choice="auto",
    first_tool_choice="required",
    max_output_tokens=256,
    temperature=0.0,
)



class Task(pydantic.BaseModel):
    """What the manager hands to its subagent."""

    task: str = pydantic.Field(description="The user's question, copied word for word.")


ask_assistant = Delegation(
    name="ask_assistant",
    description="Hand an arithmetic question to the assistant subagent, which has a calculator, and get its "
    "answer back.",
    input=Task,
    agent="demo",
    task_text=lambda task: task.task if task.task.rstrip().endswith("?") else f"What is {task.task}?",
    max_depth=1,
    deadline_s=240.0,
)

manager = Agent(
    name="manager",
    system_prompt=(
        "You are a helpful assistant. Use the ask_assistant tool for arithmetic. "
        "After you get the tool's result, answer the user's question briefly using that result."
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

app = App(agents=[demo, manager, notes], extra_tools=DOCS_TOOLS)

DEMO_QUESTIONS = ("What is 365 * 24?", "What is 17 + 25?", "What is 7 * 8 - 6?", "What is 12 * 12?", "What is 250 + 175?")
"""Questions for which question → calculator call → result → answer works with SmolLM2-135M at
temperature 0 (the answer contains the right number; MODEL_NOTES.md)."""
