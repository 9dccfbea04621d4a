"""Apps whose tools return elements and the app's own events, loaded as ``tests.support.element_apps:app``.

With :func:`element_rule`, a scripted model that runs the plan in the user's message
(``do: search(leave) remember(x)``) and then answers citing what the tool results showed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import msgspec

from agentstream import Agent, App, ToolResult, current_call, tool
from agentstream.context import BRACKETS, ContextConfig, ContextPolicy, ModelLimits, Tokens, UserMessage
from agentstream.wire.events import Document, Image, Passage, Source


class Ticket(Source, frozen=True, kw_only=True, tag="ticket"):
    """The app's own element: a support ticket the model may cite."""

    status: str = ""


class Note(msgspec.Struct, frozen=True, kw_only=True, tag="note"):
    """The app's own event: a note a tool records, which the model reads as a user message."""

    turn_id: str
    text: str
    author: str = "tool"


def render_note(event: Note, show: Any) -> list[UserMessage]:
    return [UserMessage(text=f"[note from {event.author}] {event.text}")]


PAGES = {
    "leave": ("Leave policy", ["Staff get 25 days of paid leave a year.", "Unused leave carries over up to 5 days."]),
    "travel": ("Travel policy", ["Book trains for trips under 500 km.", "Economy class on flights under 6 hours."]),
}


def topic_page(topic: str) -> tuple[str, list[str]]:
    if topic in PAGES:
        return PAGES[topic]
    return f"Page {topic}", [
        f"Fact one about {topic}: it is rule {topic}-1. " + "x" * 300,
        f"Fact two about {topic}: it is rule {topic}-2. " + "y" * 300,
    ]


@tool
def search(query: str) -> ToolResult:
    """Search the handbook; returns the page and its passages as sources."""
    title, passages = topic_page(query)
    doc = f"hb:{query}"
    return ToolResult(
        text=f"{len(passages)} passages found for {query!r}.",
        elements=[Document(id=doc, title=title, url=f"https://handbook.example/{query}")]
        + [Passage(id=f"{doc}#{i}", ref=doc, text=text, properties={"chunk": i}) for i, text in enumerate(passages)],
    )


@tool
def ticket(key: str) -> Ticket:
    """Look a support ticket up."""
    return Ticket(id=f"T-{key}", text=f"Ticket {key}: the printer on floor 2 is broken.", status="open")


@tool
def remember(text: str) -> ToolResult:
    """Record a note in the conversation."""
    return ToolResult(text="Noted.", events=[Note(turn_id=current_call().turn_id, text=text)])


@tool
def picture(name: str) -> Image:
    """Show a picture by name."""
    return Image(id=f"img:{name}", url=f"https://img.example/{name}.png")


@tool
def bad_element(name: str) -> ToolResult:
    """Returns an element of a class the app does not register (for the error path)."""

    class Stray(Source, frozen=True, kw_only=True, tag="stray"):
        pass

    return ToolResult(elements=[Stray(id=name, text="x")])


@tool
def huge_image(name: str) -> Image:
    """Returns an image over the size limit (for the error path)."""
    import base64

    return Image(id=name, media_type="image/png", data=base64.b64encode(b"\0" * (6 * 1024 * 1024)).decode())


READER_PROMPT = "You answer from the handbook. Cite each source you use by copying its cite attribute, such as [1]."

TOOLS = [search, ticket, remember, picture, bad_element, huge_image]

app = App(
    agents=[
        Agent(
            name="reader",
            system_prompt=READER_PROMPT,
            tools=TOOLS,
            max_passes=4,
            context=ContextConfig(citations=BRACKETS, renderers={Note: render_note}),
        ),
        Agent(
            name="viewer",
            system_prompt="You describe images.",
            max_passes=2,
            context=ContextConfig(policy=ContextPolicy(max_images=1)),
        ),
        Agent(
            name="long",
            system_prompt=READER_PROMPT,
            tools=[search],
            max_passes=4,
            model_limits=ModelLimits(window=Tokens(4000), characters_per_token=3.0),
            context=ContextConfig(citations=BRACKETS, policy=ContextPolicy(output_reserve=Tokens(200), min_gain=None)),
        ),
    ],
    element_types=[Ticket],
    event_types=[Note],
)

# the same app without its own types: what a reader of an older or other version sees
plain_app = App(
    agents=[
        Agent(
            name="reader",
            system_prompt=READER_PROMPT,
            tools=[search],
            max_passes=4,
            context=ContextConfig(citations=BRACKETS),
        )
    ]
)

_PLAN = re.compile(r"(\w+)\(([^)]*)\)")
_ARGUMENT = {
    "search": "query",
    "ticket": "key",
    "remember": "text",
    "picture": "name",
    "bad_element": "name",
    "huge_image": "name",
}
_CITE = re.compile(r'cite="(\[\d+\])"')


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def element_rule(body: dict[str, Any]) -> dict[str, Any]:
    """Run the plan of the last user message (``do: search(leave)``), then answer citing the
    first and the last source the results showed (``cite`` attributes); ``cite: none`` answers
    without citing; a message without a plan gets a plain answer."""
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and "do:" in _text(m["content"])]
    last = messages[-1]
    if last["role"] == "user" and "do:" in _text(last["content"]):
        text = _text(last["content"]).split("do:", 1)[1]
        digest = hashlib.sha256(_text(last["content"]).encode()).hexdigest()[:10]
        calls = [
            {
                "id": f"call_{digest}_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": json.dumps(
                        ({"results": [arg]} if arg.startswith("r") else {"elements": [int(arg)]})
                        if name == "reopen"
                        else {_ARGUMENT.get(name, "query"): arg}
                    ),
                },
            }
            for i, (name, arg) in enumerate(_PLAN.findall(text.split("cite:")[0]))
        ]
        return {"message": {"role": "assistant", "content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}
    if not users or last["role"] not in ("tool", "user"):
        return {"message": {"role": "assistant", "content": "I read your message."}, "finish_reason": "stop"}
    start = users[-1]
    shown = " ".join(_text(m.get("content")) for m in messages[start + 1 :] if m["role"] in ("tool", "user"))
    cites = _CITE.findall(shown)
    request = _text(messages[start]["content"])
    if not cites or "cite: none" in request:
        return {"message": {"role": "assistant", "content": "Nothing to cite."}, "finish_reason": "stop"}
    wanted = re.search(r"cite: (\d+)", request)
    first = cites[int(wanted.group(1)) % len(cites)] if wanted else cites[1 if len(cites) > 1 else 0]
    answer = f"The handbook says so {first}. It agrees with the rest {cites[-1]}."
    return {"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
