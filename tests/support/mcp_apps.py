"""Apps whose agents take tools from the test MCP server (tests/support/mcp_servers.py).

``tests.support.mcp_apps:app`` has four agents:

- ``local``: the server over stdio (queue ``mcp-local``), started by the tool worker; a prompt
  file's texts replace the description of ``add`` and of its argument ``a``; ``slow`` and
  ``picture`` are declared with side effects, ``slow`` may run 60 s.
- ``declaring``: the stdio server's tools declared like local ones (states, a lock).
- ``hostile``: the malicious server of tests/support/mcp_hostile.py over stdio (queue ``mcp-hostile``).
- ``remote``: the same server over streamable HTTP (queue ``mcp-remote``); the URL comes from
  ``AGENTSTREAM_MCP_REMOTE_URL`` and the ``Authorization`` header from ``REMOTE_MCP_AUTH``, both
  in the tool worker's environment only.

And :func:`mcp_rule`, the scripted model's rule: a user message ``call <tool> <JSON arguments>``
makes one tool call; the answer after it quotes the tool result.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from agentstream import Agent, App, ChatTurnInput, McpServer, ToolDeclaration
from agentstream.declarations.prompts import PromptFile

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = PromptFile.model_validate(
    {
        "tools": {
            "add": {
                "description": "Add two numbers exactly (from the prompt file).",
                "arguments": {"a": "The first number."},
            }
        },
    }
).for_model("default")

local = McpServer(
    name="local",
    command=[sys.executable, "-m", "tests.support.mcp_servers", "stdio"],
    inherit_env=["MCP_TEST_DIR"],
    cwd=str(ROOT),
    timeout_s=10,
    tool_timeouts_s={"slow": 60},
    side_effects=["picture"],
    prompts=PROMPTS,
    connect_timeout_s=30,
)

hostile = McpServer(
    name="hostile",
    command=[sys.executable, "-m", "tests.support.mcp_hostile", "stdio"],
    cwd=str(ROOT),
    timeout_s=60,
    connect_timeout_s=30,
)
"""The malicious server of tests/support/mcp_hostile.py (queue ``mcp-hostile``)."""

remote = McpServer(
    name="remote",
    headers_env={"Authorization": "REMOTE_MCP_AUTH"},
    tools=["add", "picture", "slow"],
    connect_timeout_s=30,
)

app = App(
    agents=[
        Agent(name="local", system_prompt="You use the tools of the local MCP server.", tools=[local], max_passes=4),
        # the local server's tools declared like the agent's own: add off unless a turn asks for it,
        # grow locked at auto, and one the server does not list
        Agent(
            name="declaring",
            system_prompt="You use the tools of the local MCP server.",
            tools=[local],
            max_passes=4,
            input=ChatTurnInput,
            declared=[
                ToolDeclaration(name="add", default="off"),
                ToolDeclaration(name="grow", locked=True),
                ToolDeclaration(name="absent"),
            ],
        ),
        Agent(name="remote", system_prompt="You use the tools of the remote MCP server.", tools=[remote], max_passes=4),
        Agent(name="hostile", system_prompt="You use a malicious MCP server's tools.", tools=[hostile], max_passes=4),
    ]
)

_CALL = re.compile(r"call (\w+) (\{.*\})", re.S)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return json.dumps(content)


def mcp_rule(body: dict[str, Any]) -> dict[str, Any]:
    """``call <tool> <JSON>`` in the last user message → that tool call; after a result → quote it.

    The user message that carries tool results' images (a tool message holds text only) counts
    as part of the results it follows."""
    from agentstream.models.openai_format import TOOL_IMAGES_NOTE

    messages = [
        m for m in body["messages"] if not (m["role"] == "user" and _text_of(m["content"]).startswith(TOOL_IMAGES_NOTE))
    ]
    last = messages[-1]
    if last["role"] == "user":
        match = _CALL.search(_text_of(last["content"]))
        if match is None:
            return {"message": {"role": "assistant", "content": "No call asked."}, "finish_reason": "stop"}
        n = sum(1 for m in messages if m["role"] == "user")
        call = {
            "id": f"call_{n}_{match.group(1)}",
            "type": "function",
            "function": {"name": match.group(1), "arguments": match.group(2)},
        }
        return {"message": {"role": "assistant", "content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}
    results = []
    for m in reversed(messages):
        if m["role"] != "tool":
            break
        results.append(_text_of(m["content"]))
    return {
        "message": {"role": "assistant", "content": "Result: " + " | ".join(reversed(results))},
        "finish_reason": "stop",
    }
