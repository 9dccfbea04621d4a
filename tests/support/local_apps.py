"""An app for runs against the real local model (SmolLM2-135M on llama.cpp): one agent with one tool.

With one tool, tool choice ``required`` goes to llama.cpp as that tool forced by name (the
endpoint's quirks), which the server can also stream; the second pass offers no tools, so the
model answers in text, streamed token by token.
"""

from __future__ import annotations

from agentstream import Agent, App
from agentstream.demo.tools import calculator

local = Agent(
    name="local",
    system_prompt="You are a helpful assistant. Use the calculator tool for arithmetic, then answer briefly.",
    tools=[calculator],
    max_passes=1,
    tool_rounds_after_cap=0,
    first_tool_choice="required",
    max_output_tokens=96,
)

app = App(agents=[local])
