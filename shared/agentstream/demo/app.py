"""The demo app (``agentstream.demo.app:app``): one agent, ``demo``, with offline tools.

The settings suit the embedded SmolLM2-135M model (measurements in ``MODEL_NOTES.md`` next to
this file):

- ``demo`` has the calculator only. With the two Python-docs tools listed as well, SmolLM2-135M
  called a ``python_docs_*`` tool for 20 of 20 arithmetic questions (the calculator was never
  chosen); with the calculator alone it calls it every time, with right arguments for 11 of 14
  questions. The docs tools stay in the app (``extra_tools``), so tool workers serve them; give
  them to an agent whose model can choose between tools (see :data:`DOCS_TOOLS`).
- ``first_tool_choice="required"``: the first pass must call the tool.
- ``max_passes=1, tool_rounds_after_cap=0``: one call with tools, then the next call is made
  without tools, so the model answers from the tool's result instead of calling the tool again
  (with ``auto`` after a result, the local server can loop on tool calls for minutes).
- ``result_as_answer=["calculator"]``: the calculator's result is the answer, exactly. Asked to
  restate a result, SmolLM2-135M changes it (2**20 / 7 = 149796.571… came back as "1497",
  7006652 as "70,665"); the model's part is to choose the tool and write its arguments.
- its system prompt is the prompt file ``prompts/demo.yaml`` itself: each call reads the layer
  of the endpoint it goes to (a turn may name another model), checked when the app loads.

Two more agents show the delegation and compaction services:

- ``manager`` does nothing itself: it hands the question to a ``demo`` subagent (the
  ``ask_assistant`` delegation, which runs on a child trace of its own), whose answer is its
  answer (``result_as_answer``): ``agentstream run --agent manager "What is 1234 * 5678?"``.
- ``notes`` chats without tools and compacts at a deliberately tiny size (120 tokens), so from its
  second turn on each turn starts with a summary of the earlier ones written by the compaction
  service: ``agentstream run --agent notes --turns 2 "Tell me one thing about Python."``.

And one shows sources and citations: ``docs`` searches the Python documentation that ships with
Python (:mod:`agentstream.demo.docs`: passages of the reference topics and the standard
library's docstrings, as sources). The model writes the search (SmolLM2-135M rewrites the
question in its own words, often naming the function it has in mind); the best passage is the
answer (``result_as_answer``: asked to restate or cite a passage, the 135M model wrote a tool
call as its answer), with the passages it rests on as numbered sources:
``agentstream run --agent docs "How do I round a number?"``.
"""

from __future__ import annotations

import pydantic

from agentstream.context import BRACKETS, Compact, ContextConfig, ContextPolicy, ModelLimits, Tokens, turns
from agentstream.declarations.agents import Agent
from agentstream.declarations.apps import App
from agentstream.declarations.prompts import PROMPT_VARIABLES, load_prompt_file
from agentstream.delegation import Delegation
from agentstream.demo.docs import docs_search
from agentstream.demo.tools import calculator, python_docs_read, python_docs_search

PROMPT_FILE = load_prompt_file("demo.yaml", variables=PROMPT_VARIABLES)
"""The demo agent's prompt file, the shipped ``prompts/demo.yaml`` (a layer per endpoint group)."""

PROMPTS = PROMPT_FILE.for_model("default")
"""The demo agent's texts for the ``default`` endpoint."""

DOCS_TOOLS = (python_docs_search, python_docs_read)
"""Search and read the Python documentation; for agents on models larger than SmolLM2-135M."""

demo = Agent(
    name="demo",
    system_prompt=PROMPT_FILE,
    tools=[calculator],
    result_as_answer=["calculator"],
    max_passes=1,
    tool_rounds_after_cap=0,
    tool_choice="auto",
    first_tool_choice="required",
    max_output_tokens=256,
    temperature=0.0,
)

SYSTEM_PROMPT = demo.system_text(None)
"""What the ``default`` endpoint reads. Chosen by measurement: SmolLM2-135M's arguments and
answers change with every word of it."""


NOTES_COMPACT_AT = 120
"""The ``notes`` agent's compaction threshold, in estimated tokens (prompt plus its 64-token output
reserve): its system prompt and a first question come to 106, a second question alone adds 17."""


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
    result_as_answer=["ask_assistant"],
    max_passes=1,
    tool_rounds_after_cap=0,
    first_tool_choice="required",
    max_output_tokens=256,
    temperature=0.0,
)

notes = Agent(
    name="notes",
    system_prompt="You are a friendly assistant. Answer in two or three short sentences.",
    max_output_tokens=64,
    temperature=0.0,
    context=ContextConfig(
        policy=ContextPolicy(
            output_reserve=Tokens(64),
            # a tiny threshold: the first turn alone stays under it, a second turn is over it, so
            # every turn after the first starts with a summary of the ones before it
            compact=Compact(where=turns[:-1], when=Tokens(NOTES_COMPACT_AT), summary_output=Tokens(96)),
        )
    ),
    model_limits=ModelLimits(window=Tokens(1500)),
)

docs = Agent(
    name="docs",
    system_prompt="You answer questions about Python from its documentation. Use the docs_search tool with the user's question.",
    tools=[docs_search],
    result_as_answer=["docs_search"],
    max_passes=1,
    tool_rounds_after_cap=0,
    first_tool_choice="required",
    max_output_tokens=96,
    temperature=0.0,
    context=ContextConfig(citations=BRACKETS),
)

app = App(agents=[demo, manager, notes, docs], extra_tools=DOCS_TOOLS)

DEMO_QUESTIONS = (
    "What is 365 * 24?",
    "What is 17 + 25?",
    "What is 7 * 8 - 6?",
    "What is 12 * 12?",
    "What is 250 + 175?",
)
"""Questions for which question → calculator call → result → answer works with SmolLM2-135M at
temperature 0 (the answer contains the right number; MODEL_NOTES.md)."""
