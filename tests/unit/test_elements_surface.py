"""The published trace schema, image caps on both provider formats, the docs demo tool, and the README's examples."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import jsonschema
import pytest

from agentstream.app.base import invoke_tool
from agentstream.context import ContextConfig, ContextPolicy, build_request
from agentstream.declarations.agents import Agent
from agentstream.models import anthropic_format, openai_format
from agentstream.wire import codec
from agentstream.wire.events import (
    TRACE_SCHEMA_VERSION,
    CitedSource,
    Document,
    Image,
    ModelOutput,
    Passage,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnInput,
)
from agentstream.wire.registry import NO_APP_TYPES
from agentstream.wire.schemas import trace_events_schema
from tests.support import docs
from tests.support.element_apps import Note, Ticket, app

ROOT = Path(__file__).resolve().parents[2]


def test_the_events_schema_covers_every_stored_type_and_the_apps_at_the_trace_version():
    schema = trace_events_schema(app.types)
    assert schema["x-agentstream-trace-schema-version"] == TRACE_SCHEMA_VERSION
    assert schema["x-agentstream-events"]["note"] == "Note" and schema["x-agentstream-elements"]["ticket"] == "Ticket"
    stored = [
        TurnInput(
            turn_id="t", agent="a", text="x", elements=(Document(id="d", title="D"), Image(id="i", url="https://i"))
        ),
        ToolOutput(
            turn_id="t",
            call_id="c",
            name="n",
            text="",
            elements=(Ticket(id="T", status="open"), Passage(id="p", ref="d")),
        ),
        ModelOutput(turn_id="t", step=0, tool_calls=(ToolCall(id="c", name="n"),)),
        TurnEnded(turn_id="t", answer="a", citations=(CitedSource(number=1, id="p", spans=((0, 1),)),)),
        Note(turn_id="t", text="n"),
    ]
    for event in stored:
        jsonschema.validate(json.loads(codec.encode(event)), schema)
    for wrong in (
        {"type": "tool_result", "turn_id": 1},
        {"type": "nope"},
        {
            "type": "tool_result",
            "turn_id": "t",
            "call_id": "c",
            "name": "n",
            "text": "",
            "elements": [{"kind": "video", "id": "v"}],
        },
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    plain = trace_events_schema(NO_APP_TYPES)
    assert "note" not in plain["x-agentstream-events"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(codec.encode(Note(turn_id="t", text="n"))), plain)


def _images_request(max_images):
    agent = Agent(
        name="v", system_prompt="s", tools=(), context=ContextConfig(policy=ContextPolicy(max_images=max_images))
    )
    img = [Image(id=f"i{n}", url=f"https://img.example/{n}.png") for n in range(4)]
    call = ModelOutput(
        turn_id="t", step=0, tool_calls=(ToolCall(id="c1", name="look", arguments="{}"),), stop_reason="tool_calls"
    )
    events = [
        TurnInput(turn_id="t", agent="v", text="look", elements=(img[0], img[1])),
        call,
        ToolOutput(turn_id="t", call_id="c1", name="look", text="seen", elements=(img[2], img[3])),
    ]
    return build_request(events, agent, turn_id="t", step=1)


def test_max_images_keeps_the_newest_images_on_both_formats_and_notes_the_older_ones():
    request = _images_request(3)
    openai = json.loads(openai_format.request_body(request, model="m"))
    sent = [
        part["image_url"]["url"]
        for m in openai["messages"]
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part["type"] == "image_url"
    ]
    assert sent == ["https://img.example/1.png", "https://img.example/2.png", "https://img.example/3.png"]
    assert "[1 older image left out: the request holds at most 3]" in json.dumps(openai)
    anthropic = json.loads(anthropic_format.request_body(request, model="m"))
    blocks = [b for m in anthropic["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
    nested = [
        b
        for block in blocks
        if block.get("type") == "tool_result"
        for b in block.get("content", [])
        if isinstance(b, dict)
    ]
    urls = [b["source"]["url"] for b in [*blocks, *nested] if b.get("type") == "image"]
    assert urls == ["https://img.example/1.png", "https://img.example/2.png", "https://img.example/3.png"]
    assert "older image left out" in json.dumps(anthropic)
    none = json.loads(openai_format.request_body(_images_request(0), model="m"))
    assert "image_url" not in json.dumps(none) and "[2 older images left out" in json.dumps(none)


def test_the_docs_tool_returns_passages_of_the_documentation_on_disk_as_sources():
    from agentstream.demo.docs import corpus, docs_search

    result = asyncio.run(invoke_tool(docs_search, json.dumps({"question": "How do I read a file line by line?"})))
    assert result.error is None and result.elements
    documents = [e for e in result.elements if isinstance(e, Document)]
    passages = [e for e in result.elements if isinstance(e, Passage)]
    assert documents and len(passages) == len(documents)
    names = {entry.name: entry for entry in corpus()}
    for document, passage in zip(documents, passages, strict=True):
        entry = names[document.id.removeprefix("pydoc:")]
        assert passage.ref == document.id and passage.text in entry.paragraphs  # real text, as on disk
        assert document.properties["location"] == f"python -m pydoc {entry.name}"
        assert "line" in passage.text.lower()
    assert result.text == passages[0].text  # the best passage is the result's text: the docs agent's answer
    topic = asyncio.run(invoke_tool(docs_search, json.dumps({"question": "What does the with statement do?"})))
    assert topic.elements[0].id == "pydoc:with" and topic.elements[0].title == 'The "with" statement'


def test_the_docs_search_follows_a_name_the_query_writes_as_code():
    from agentstream.demo.docs import named_in, search

    # how SmolLM2-135M rewrote questions: the function it names beats the words around it
    assert named_in("using `os.path.join()` or str.split() and `sorted`") == {"os.path.join", "str.split", "sorted"}
    assert search("How to join paths using `os.path.join()` in Python 3", 1)[0][0].name == "os.path.join"
    assert search("How to sort a list of lists using Python's built-in `sorted`", 1)[0][0].name == "sorted"
    assert search("How do I round a number?", 1)[0][0].name == "round"  # the README's question, as asked


def _readme_blocks():
    text = docs.page("tutorials/tools-and-mcp.md")
    return [
        block
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        if "element_types" in block or "ToolResult" in block
    ]


def test_the_readmes_element_and_app_type_examples_run():
    from agentstream import App

    blocks = _readme_blocks()
    assert len(blocks) >= 2
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        assert isinstance(namespace["app"], App)
    tools = namespace["app"].tools
    ticket = asyncio.run(invoke_tool(tools["ticket"], '{"key": "7"}'))
    assert ticket.elements[0].id == "T-7"
