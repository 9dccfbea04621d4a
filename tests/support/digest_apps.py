"""An app for the subagent-digest test (``tests.support.digest_apps:app``) and its scripted model.

``editor`` hands a note to a ``scribe`` subagent; the scribe writes it to a file with
``write_file`` (into ``AGENTSTREAM_TEST_NOTES_DIR``) and then says nothing (empty replies), so its
run ends without an answer. The editor answers with the result it got back, so a test can see
what the parent learned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic

from agentstream import Agent, App, tool
from agentstream.delegation import Delegation
from tests.support.delegation_apps import _answer, _calls, _results, _text


class Note(pydantic.BaseModel):
    note: str = pydantic.Field(description="What to write down.")


@tool(timeout_s=10, side_effects=True)
def write_file(path: str, content: str) -> str:
    """Write a file in the notes folder."""
    target = Path(os.environ["AGENTSTREAM_TEST_NOTES_DIR"]) / Path(path).name
    target.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {target.name}"


take_note = Delegation(name="take_note", description="Have the scribe write a note down.", input=Note, agent="scribe")

app = App(
    agents=[
        Agent(name="editor", system_prompt="EDITOR. Have notes written down.", tools=[take_note]),
        Agent(name="scribe", system_prompt="SCRIBE. Write the note to notes.txt.", tools=[write_file]),
    ]
)


def rule(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    who = _text(messages[0]).split(".")[0] if messages and messages[0]["role"] == "system" else ""
    last = messages[-1]
    task = _text(next(m for m in reversed(messages) if m["role"] == "user"))
    if who == "EDITOR":
        if last["role"] == "user":
            return _calls(("take_note", {"note": task}), seed=task)
        return _answer(f"The scribe came back with: {_results(messages)[0]}")
    if who == "SCRIBE":
        if last["role"] == "user":
            return _calls(("write_file", {"path": "notes.txt", "content": task}), seed=task)
        return {"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}  # nothing to say
    return _answer("I do not know this agent.")
