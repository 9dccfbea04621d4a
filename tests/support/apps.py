"""Apps for tests, loaded by services as ``tests.support.apps:app``."""

from __future__ import annotations

import ast
import operator
import os
import time

from agentstream import Agent, App, tool
from tests.support.redis_server import sync_client

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


# --- tools for the delivery tests: effects are counted in Redis per call ---------------------

_redis_client = None


def _redis():
    global _redis_client
    if _redis_client is None:
        _redis_client = sync_client(os.environ["REDIS_URL"])
    return _redis_client


def effects_key(namespace: str) -> str:
    """The hash where test tools count their effects: ``<trace>/<call>/<tool>`` → runs."""
    return f"{namespace}:test:effects"


def _count_effect(tool_name: str) -> None:
    from agentstream import current_call

    call = current_call()
    _redis().hincrby(effects_key(os.environ["AGENTSTREAM_NAMESPACE"]), f"{call.trace_id}/{call.call_id}/{tool_name}", 1)


def runs_key(namespace: str) -> str:
    """The list where the delivery tools log each run's start and end:
    ``<trace>/<call>|<tool>|<phase>|<pid>|<unix ms>``."""
    return f"{namespace}:test:runs"


def _log_run(tool_name: str, phase: str) -> None:
    from agentstream import current_call

    call = current_call()
    _redis().rpush(
        runs_key(os.environ["AGENTSTREAM_NAMESPACE"]),
        f"{call.trace_id}/{call.call_id}|{tool_name}|{phase}|{os.getpid()}|{time.time() * 1000.0:.0f}",
    )


def _pause(name: str, key: str = "") -> None:
    """Sleep AGENTSTREAM_TEST_<NAME>_S seconds when set (or the seconds after an ``@`` in
    ``key``: ``record(c1t2@2.5)``), checking the call's cancel flag."""
    from agentstream import current_call

    seconds = float(os.environ.get(f"AGENTSTREAM_TEST_{name.upper()}_S", "0") or 0)
    if "@" in key:
        seconds = float(key.rsplit("@", 1)[1])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if current_call().cancelled:
            _count_effect(f"{name}-saw-cancel")
            return
        time.sleep(0.02)


@tool(timeout_s=30)
async def work(ms: int) -> str:
    """Work for ``ms`` milliseconds (async), counting the run."""
    import asyncio

    _count_effect("work")
    _log_run("work", "start")
    await asyncio.sleep(ms / 1000.0)
    _log_run("work", "end")
    return f"worked {ms} ms"


@tool(timeout_s=30, side_effects=True)
def record(key: str) -> str:
    """Record ``key`` somewhere (a side effect, counted), after AGENTSTREAM_TEST_RECORD_S seconds."""
    _log_run("record", "start")
    _pause("record", key)
    _count_effect("record")
    _log_run("record", "end")
    return f"recorded {key}"


@tool(timeout_s=30, side_effects=True, retry_safe=True)
def upsert(key: str) -> str:
    """Write ``key`` idempotently (side effects, safe to retry), after AGENTSTREAM_TEST_UPSERT_S seconds."""
    _log_run("upsert", "start")
    _pause("upsert", key)
    _count_effect("upsert")
    _log_run("upsert", "end")
    return f"upserted {key}"


@tool(timeout_s=30)
def crash(key: str) -> str:
    """Kill the worker process that runs it (a poison job)."""
    _count_effect("crash")
    os._exit(17)


@tool(timeout_s=60)
def sleepy(key: str) -> str:
    """A sync tool that sleeps AGENTSTREAM_TEST_SLEEPY_S seconds, ignoring cancels, then answers."""
    _count_effect("sleepy")
    time.sleep(float(os.environ.get("AGENTSTREAM_TEST_SLEEPY_S", "0") or 0))
    return f"slept for {key}"


app = App(
    agents=[
        Agent(
            name="calc",
            system_prompt="You are a calculator agent. Use the calculator tool.",
            tools=[calculator, slow, explode],
            max_passes=4,
        ),
        Agent(
            name="plan",
            system_prompt="You run the plan in the user's message with tools.",
            tools=[work, record, upsert, crash, sleepy],
            max_passes=4,
        ),
    ]
)
