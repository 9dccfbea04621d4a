"""Whole provider request bodies against stored snapshots (syrupy).

Each case is a trace (events as the agent loop records them) built into a request by the real
context library, then into a body by :func:`agentstream.models.formats.request_body` for one
endpoint: OpenAI-compatible and Anthropic, streamed and not. The body is compared whole with its
snapshot file in ``__snapshots__/test_request_snapshots/``, so a change in any field, or in the
order of the fields, shows in the diff, not only in the fields a test happens to name.

A deliberate change of the bodies: ``python -m pytest tests/unit/models/test_request_snapshots.py
--snapshot-update``, then read the diff of the snapshot files before committing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from agentstream import Agent, tool
from agentstream.context import ALWAYS, ContextConfig, ContextPolicy, ModelLimits, Tokens, build_request
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint, Quirks
from agentstream.wire import codec
from agentstream.wire.events import (
    Image,
    ModelOutput,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnInput,
    Usage,
)
from tests.support import anthropic_api

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


class RequestBody(SingleFileSnapshotExtension):
    """A request body as indented JSON, its fields in the order they are sent (not sorted)."""

    _write_mode = WriteMode.TEXT
    file_extension = "json"

    def serialize(self, data: Any, **_: Any) -> str:
        return json.dumps(json.loads(data), indent=2, ensure_ascii=False) + "\n"


@pytest.fixture
def snapshot_body(snapshot):
    return snapshot.use_extension(RequestBody)


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """The weather in a city now."""
    return city


@tool
def take_photo(camera: str) -> str:
    """A photo from a camera."""
    return camera


def agent(model: str) -> Agent:
    return Agent(
        name="a",
        system_prompt="You are a careful assistant. Answer briefly.",
        tools=[get_weather, take_photo],
        model=model,
        max_output_tokens=256,
        context=ContextConfig(policy=ContextPolicy(reasoning=ALWAYS)),
        model_limits=ModelLimits(window=Tokens(100_000)),
    )


ENDPOINTS: dict[str, ModelEndpoint] = {
    "openai": ModelEndpoint(id="gpt", provider="openai", base_url="http://x/v1", model="gpt-test", stream=False),
    "openai_stream": ModelEndpoint(id="gpt", provider="openai", base_url="http://x/v1", model="gpt-test"),
    "llamacpp_stream": ModelEndpoint(
        id="local",
        provider="openai",
        base_url="http://x/v1",
        model="gpt-test",
        quirks=Quirks(tool_call_content="empty", reasoning_field="reasoning", stream_usage=False),
    ),
    "anthropic": ModelEndpoint(
        id="claude", provider="anthropic", base_url="http://x", model="claude-test", stream=False
    ),
    "anthropic_thinking_stream": ModelEndpoint(
        id="claude", provider="anthropic", base_url="http://x", model="claude-test", thinking_budget_tokens=1024
    ),
}


def _output(endpoint: ModelEndpoint, turn: str, step: int, **fields: Any) -> ModelOutput:
    return ModelOutput(
        turn_id=turn,
        step=step,
        provider=endpoint.provider,
        model=endpoint.model,
        usage=Usage(prompt_tokens=100, completion_tokens=20, total_tokens=120),
        **fields,
    )


def plain_question(endpoint: ModelEndpoint) -> tuple[list[Any], str, int]:
    """One user message, nothing before it."""
    return [TurnInput(turn_id="t1", agent="a", text="Hello, who are you?")], "t1", 0


def tool_round(endpoint: ModelEndpoint) -> tuple[list[Any], str, int]:
    """A finished turn, then a turn with two parallel calls (one result an error) and their results."""
    thinking = (
        {"reasoning": "The user wants Oslo and Bergen; two calls."}
        if endpoint.provider == "openai"
        else {"replay_blocks": (anthropic_api.thinking(endpoint.model, "Two cities: two calls.\n"),)}
    )
    events = [
        TurnInput(turn_id="t1", agent="a", text="Hi"),
        _output(endpoint, "t1", 0, content="Hello! How can I help?"),
        TurnEnded(turn_id="t1", answer="Hello! How can I help?"),
        TurnInput(turn_id="t2", agent="a", text="Weather in Oslo and Bergen, in kelvin?"),
        _output(
            endpoint,
            "t2",
            0,
            content="Checking both.",
            tool_calls=(
                ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo", "unit": "kelvin"}'),
                ToolCall(id="call_2", name="get_weather", arguments='{"city":"Bergen","unit":"kelvin"}'),
            ),
            stop_reason="tool_calls",
            **thinking,
        ),
        ToolOutput(turn_id="t2", call_id="call_2", name="get_weather", text="the station is offline", error="failed"),
        ToolOutput(turn_id="t2", call_id="call_1", name="get_weather", text="271.2 K, snow"),
    ]
    return events, "t2", 1


def images(endpoint: ModelEndpoint) -> tuple[list[Any], str, int]:
    """Images in the user's message (inline data and a URL) and in a tool result."""
    events = [
        TurnInput(
            turn_id="t1",
            agent="a",
            text="What is in these pictures, and what does the porch camera see?",
            elements=(
                Image(id="img1", media_type="image/png", data=PNG),
                Image(id="img2", media_type="image/jpeg", url="https://example.com/cat.jpg"),
            ),
        ),
        _output(
            endpoint,
            "t1",
            0,
            tool_calls=(ToolCall(id="call_1", name="take_photo", arguments='{"camera": "porch"}'),),
            stop_reason="tool_calls",
        ),
        ToolOutput(
            turn_id="t1",
            call_id="call_1",
            name="take_photo",
            text="one photo",
            elements=(Image(id="img3", media_type="image/png", data=PNG),),
        ),
    ]
    return events, "t1", 1


def empty_result(endpoint: ModelEndpoint) -> tuple[list[Any], str, int]:
    """A tool result with no text (sent as a placeholder where a format needs content)."""
    events = [
        TurnInput(turn_id="t1", agent="a", text="Take a photo, quietly."),
        _output(
            endpoint,
            "t1",
            0,
            tool_calls=(ToolCall(id="call_1", name="take_photo", arguments='{"camera": "hall"}'),),
            stop_reason="tool_calls",
        ),
        ToolOutput(turn_id="t1", call_id="call_1", name="take_photo", text=""),
    ]
    return events, "t1", 1


TRACES: dict[str, Callable[[ModelEndpoint], tuple[list[Any], str, int]]] = {
    "plain_question": plain_question,
    "tool_round": tool_round,
    "images": images,
    "empty_result": empty_result,
}


def body_of(trace: str, endpoint_name: str) -> bytes:
    endpoint = ENDPOINTS[endpoint_name]
    events, turn, step = TRACES[trace](endpoint)
    # the trace goes through the codec as the store keeps it, then through the context library
    stored = [codec.decode_entry(codec.encode_entry(e)) for e in events]
    request = build_request(stored, agent(endpoint.id), turn_id=turn, step=step)
    return formats.request_body(request, endpoint)


@pytest.mark.parametrize("endpoint_name", list(ENDPOINTS))
@pytest.mark.parametrize("trace", list(TRACES))
def test_the_whole_request_body_is_the_stored_snapshot(trace, endpoint_name, snapshot_body):
    body = body_of(trace, endpoint_name)
    # the snapshot is the body's JSON in its own field order; it holds every byte of the body
    assert msgspec.json.encode(json.loads(body)) == body
    assert body == snapshot_body
