"""The demo app (``agentstream.demo.app:app``): one agent, ``demo``, with offline tools.

The settings suit the embedded SmolLM2-135M model (see ``MODEL_NOTES.md`` next to this file):
the first pass forces a tool call (``first_tool_choice="required"``), and with ``max_passes=2``
the second pass is the last, made with tool choice ``none``, so the model must answer from the
tool's result instead of calling tools again. Larger models work with the same settings.
"""

from __future__ import annotations

from agentstream.app import Agent, App
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

app = App(agents=[demo])

DEMO_QUESTIONS = ("What is 1234 * 5678?",)
"""Questions for which the demo's pipeline works reliably with SmolLM2-135M (MODEL_NOTES.md)."""
