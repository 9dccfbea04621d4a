"""An app for the compaction tests (``tests.support.compaction_apps:app``), and the scripted
model rule that plays it (:func:`rule`).

The agent ``chatty`` has a small window (4 000 tokens) and compacts every turn but the running
one when its context passes 70 % of it; each user message of the tests is about 2 000
characters, so a conversation compacts about every four turns. The rule answers a summary call
(its last message is the compaction instructions) with a summary that names the turns it read
and folds in the earlier summary it was shown; any other call gets ``Noted <turn label>``.
A turn whose text holds ``FAIL-SUMMARIES`` makes every summary call fail (HTTP 500).
"""

from __future__ import annotations

import re
from typing import Any

from agentstream import Agent, App
from agentstream.context import Compact, ContextConfig, ContextPolicy, ModelLimits, Share, Tokens, turns
from agentstream.context.policy import DEFAULT_INSTRUCTIONS

WINDOW_TOKENS = 4_000

chatty = Agent(
    name="chatty",
    system_prompt="CHATTY. Note what the user says.",
    max_output_tokens=100,
    context=ContextConfig(
        policy=ContextPolicy(
            shrink=(),
            output_reserve=Tokens(256),
            result_cap=None,
            compact=Compact(where=turns[:-1], when=Share(0.7), summary_output=Tokens(256)),
        )
    ),
    model_limits=ModelLimits(window=Tokens(WINDOW_TOKENS)),
)

app = App(agents=[chatty])

_LABEL = re.compile(r"^(turn \d+):")
_PREVIOUS = re.compile(r"<conversation_summary>.*?(SUMMARY\[.*\])\s*</conversation_summary>", re.DOTALL)


def turn_text(n: int, size: int = 2_000, extra: str = "") -> str:
    """The user message of turn ``n``: its label, then filler up to ``size`` characters."""
    head = f"turn {n}: {extra}".rstrip() + " "
    return head + ("lorem ipsum " * (size // 12 + 1))[: max(0, size - len(head))]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def rule(body: dict[str, Any]) -> dict[str, Any]:
    """Answer summary calls with a folding summary, and other calls with ``Noted <turn label>``."""
    messages = body["messages"]
    system = _text(messages[0]) if messages and messages[0]["role"] == "system" else ""
    last = _text(messages[-1])
    users = [_text(m) for m in messages if m["role"] == "user"]
    if last.startswith(DEFAULT_INSTRUCTIONS[:40]):
        if any("FAIL-SUMMARIES" in u for u in users):
            return {"status": 500, "body": {"error": {"message": "the summary model is down"}}}
        labels = [m.group(1) for u in users[:-1] if (m := _LABEL.match(u))]
        previous = _PREVIOUS.search(system)
        folded = f"{previous.group(1)} + " if previous else ""
        return {
            "message": {"role": "assistant", "content": f"SUMMARY[{folded}{', '.join(labels)}]"},
            "finish_reason": "stop",
        }
    label = _LABEL.match(users[-1]) if users else None
    return {
        "message": {"role": "assistant", "content": f"Noted {label.group(1) if label else 'that'}."},
        "finish_reason": "stop",
    }
