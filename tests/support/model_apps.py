"""Apps for the model-adapter tests (issue 5), loaded in process as ``tests.support.model_apps:app``.

Agents name model endpoints by id: ``default`` (OPENAI_*), and the ids of the models file a test
writes (``claude-a``, ``claude-b``, ``deepseek``).
"""

from __future__ import annotations

import ast
import operator

from agentstream import Agent, App, tool
from agentstream.context import CURRENT_TURN, ContextConfig, ContextPolicy

REPLAY_REASONING = ContextConfig(policy=ContextPolicy(reasoning=CURRENT_TURN))
"""The context keeps the running turn's reasoning, which is sent back: the one switch (C10)."""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
RUNS: list[str] = []
"""Every tool run in this process, by name (the tests check what was never run)."""


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


@tool(timeout_s=5)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    RUNS.append("calculator")
    return f"{_eval(ast.parse(expression, mode='eval')):g}"


@tool(timeout_s=5)
def get_time() -> str:
    """The current time (fixed, for tests)."""
    RUNS.append("get_time")
    return "12:00"


@tool(timeout_s=5)
def write_file(path: str, content: str) -> str:
    """Write a file (pretend)."""
    RUNS.append("write_file")
    return f"wrote {len(content)} characters to {path}"


@tool(timeout_s=5)
def lookup(q: str) -> str:
    """Look something up."""
    RUNS.append("lookup")
    return f"{q}=42"


TOOLS = [calculator, get_time, write_file]

app = App(
    agents=[
        Agent(name="calc", system_prompt="You calculate.", tools=TOOLS, max_passes=4, max_output_tokens=300),
        Agent(name="gpt", system_prompt="You help.", tools=[lookup], max_passes=3),
        Agent(
            name="claude-a",
            system_prompt="You help.",
            model="claude-a",
            tools=[lookup],
            max_passes=3,
            max_output_tokens=1024,
        ),
        Agent(
            name="claude-b",
            system_prompt="You help.",
            model="claude-b",
            tools=[lookup],
            max_passes=3,
            max_output_tokens=1024,
        ),
        Agent(
            name="deep",
            system_prompt="You help.",
            model="deepseek",
            tools=[lookup],
            max_passes=3,
            context=REPLAY_REASONING,
        ),
        Agent(name="deep-plain", system_prompt="You help.", model="deepseek", tools=[lookup], max_passes=3),
    ]
)
