"""An app for the delegation tests (``tests.support.delegation_apps:app``), and the scripted
model rule that plays every agent in it (:func:`rule`).

Agents (the rule tells them apart by the first word of the system prompt):

- ``lead`` delegates each topic of "Compare A and B" to a ``researcher`` (in parallel), then
  answers with the researchers' results in call order;
- ``researcher`` looks its topic up with the ``lookup`` tool and answers with the fact;
- ``digger`` delegates its topic one level deeper (``dig``, up to depth 2), and at the depth
  limit, where ``dig`` is withheld, looks the topic up with ``slow_lookup``;
- ``boss`` delegates to ``stuck``, whose only tool runs on a queue no test worker consumes, so
  the child hangs until the supervisor ends it at its deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from typing import Any

import pydantic

from agentstream import Agent, App, tool
from agentstream.delegation import Delegation

FACTS = {"A": "alpha is the first letter", "B": "beta is the second letter"}


class Topic(pydantic.BaseModel):
    topic: str = pydantic.Field(description="The topic to look into.")


def _seconds(name: str, default: str) -> float:
    return float(os.environ.get(name, default))


@tool(timeout_s=10)
async def lookup(topic: str) -> str:
    """Look up the fact about a topic."""
    await asyncio.sleep(_seconds(f"AGENTSTREAM_TEST_LOOKUP_{topic}_S", "0"))
    return FACTS.get(topic, f"nothing is known about {topic}")


@tool(timeout_s=120)
async def slow_lookup(topic: str) -> str:
    """Look up a topic slowly (AGENTSTREAM_TEST_SLOW_S seconds)."""
    await asyncio.sleep(_seconds("AGENTSTREAM_TEST_SLOW_S", "0"))
    return f"deep fact about {topic}"


@tool(timeout_s=10, queue="nobody")
def stall(topic: str) -> str:
    """A tool on a queue that no worker in the tests consumes."""
    return topic


research = Delegation(
    name="research",
    description="Hand one topic to a researcher subagent, which looks it up and reports the fact.",
    input=Topic,
    agent="researcher",
    max_depth=1,
    deadline_s=_seconds("AGENTSTREAM_TEST_DEADLINE_S", "120"),
)
dig = Delegation(
    name="dig",
    description="Hand a deeper part of the topic to another digger subagent.",
    input=Topic,
    agent="digger",
    max_depth=2,
    deadline_s=_seconds("AGENTSTREAM_TEST_DEADLINE_S", "120"),
)
ask_stuck = Delegation(
    name="ask_stuck",
    description="Hand the topic to the stuck subagent.",
    input=Topic,
    agent="stuck",
    deadline_s=_seconds("AGENTSTREAM_TEST_STUCK_DEADLINE_S", "2"),
)

app = App(
    agents=[
        Agent(name="lead", system_prompt="LEAD. Delegate each topic to a researcher, then compare.", tools=[research]),
        Agent(name="researcher", system_prompt="RESEARCHER. Look the topic up and report the fact.", tools=[lookup]),
        Agent(name="digger", system_prompt="DIGGER. Dig deeper, or look the topic up.", tools=[dig, slow_lookup]),
        Agent(name="boss", system_prompt="BOSS. Delegate the topic.", tools=[ask_stuck]),
        Agent(name="stuck", system_prompt="STUCK. Use the stall tool.", tools=[stall]),
    ]
)


# --- the scripted model ------------------------------------------------------------------------


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def _calls(*calls: tuple[str, dict[str, Any]], seed: str) -> dict[str, Any]:
    out = []
    for i, (name, arguments) in enumerate(calls):
        call_id = f"call_{hashlib.sha256(f'{seed}/{i}'.encode()).hexdigest()[:10]}"
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}})
    return {"message": {"role": "assistant", "content": None, "tool_calls": out}, "finish_reason": "tool_calls"}


def _answer(text: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}


def _results(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in reversed(messages):
        if m["role"] != "tool":
            break
        out.append(_text(m))
    return out[::-1]


def rule(body: dict[str, Any]) -> dict[str, Any]:
    """Play every agent of :data:`app`: each decides from its system prompt and the last message."""
    messages = body["messages"]
    system = _text(messages[0]) if messages and messages[0]["role"] == "system" else ""
    who = system.split(".")[0]
    last = messages[-1]
    task = _text(next(m for m in reversed(messages) if m["role"] == "user"))
    offered = {t["function"]["name"] for t in body.get("tools", ())}
    if who == "LEAD":
        if last["role"] == "user":
            topics = [t for t in task.replace("Compare", "").replace(" and ", " ").split() if t]
            return _calls(*(("research", {"topic": t}) for t in topics), seed=task)
        return _answer(" | ".join(_results(messages)))
    if who == "RESEARCHER":
        if last["role"] == "user":
            return _calls(("lookup", {"topic": task}), seed=task)
        return _answer(f"{task}: {_results(messages)[0]}")
    if who == "DIGGER":
        if last["role"] == "user":
            if "dig" in offered:
                return _calls(("dig", {"topic": f"{task}+"}), seed=task)
            return _calls(("slow_lookup", {"topic": task}), seed=task)
        return _answer(f"dug: {_results(messages)[0]}")
    if who == "BOSS":
        if last["role"] == "user":
            return _calls(("ask_stuck", {"topic": task}), seed=task)
        return _answer(f"The subagent reported: {_results(messages)[0]}")
    if who == "STUCK":
        return _calls(("stall", {"topic": task}), seed=task)
    return _answer("I do not know this agent.")
