"""Apps for tests, loaded by services as ``tests.support.apps:app``."""

from __future__ import annotations

import ast
import operator
import os
import time

from agentstream import Agent, App, tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError(f"unsupported expression element {type(node).__name__}")


@tool(timeout_s=5)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    value = _eval(ast.parse(expression, mode="eval"))
    if os.environ.get("AGENTSTREAM_TEST_TOOL_DELAY_S"):
        time.sleep(float(os.environ["AGENTSTREAM_TEST_TOOL_DELAY_S"]))
    return f"{value:g}"


@tool(timeout_s=0.5)
async def slow(seconds: float) -> str:
    """Sleep (for timeout tests)."""
    import asyncio

    await asyncio.sleep(seconds)
    return "done"


@tool
def explode(reason: str) -> str:
    """Raise (for error tests)."""
    raise RuntimeError(reason)


app = App(
    agents=[
        Agent(name="calc", system_prompt="You are a calculator agent. Use the calculator tool.", tools=[calculator, slow, explode], max_passes=4),
    ]
)
