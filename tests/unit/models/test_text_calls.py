"""A tool call left as JSON text in ``content`` (issue 34 kind 4): recovered only when it is wholly
one call of an offered tool with valid arguments (agentstream.models.text_calls)."""

from __future__ import annotations

import json

import pytest

from agentstream.context.request import ToolDefinition
from agentstream.models.text_calls import RECOVERED, looks_like_text_call, recover, text_call
from agentstream.wire.events import ModelOutput, ToolCall

WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TOOLS = (WEATHER,)

RECOVERABLE = [
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', '{"city":"Oslo"}'),
    ('  {"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}\n', '{"city":"Oslo","days":2}'),
    (
        '{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}}',
        '{"city":"Oslo"}',
    ),
    ('[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', '{"city":"Oslo"}'),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}', '{"city":"Oslo"}'),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', '{"city":"Oslo"}'),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', '{"city":"Oslo"}'),
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]', '{"city":"Oslo"}'),
    ('<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Oslo"}}', '{"city":"Oslo"}'),
]

NOT_CALLS = [
    "The weather in Oslo is fine.",
    'Here you go: {"name": "get_weather", "arguments": {"city": "Oslo"}}',  # not the whole text
    '{"name": "get_weather", "arguments": {"city": "Oslo"}} and then more',
    '{"name": "get_forecast", "arguments": {"city": "Oslo"}}',  # a tool not offered
    '{"name": "get_weather", "arguments": {"town": "Oslo"}}',  # arguments that do not validate
    '{"name": "get_weather", "arguments": {"city": 7}}',
    '{"name": "get_weather", "arguments": "{not json"}',
    '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
    '{"name": "get_weather", "arguments": {"city": "Oslo"}, "note": "x"}',  # more than a call
    '{"city": "Oslo"}',  # an answer that is JSON, not a call
    "",
]


def output(content: str, **kw) -> ModelOutput:
    return ModelOutput(turn_id="t1", step=2, content=content, provider="openai", model="m", **kw)


@pytest.mark.parametrize(("content", "arguments"), RECOVERABLE)
def test_a_reply_that_is_wholly_one_valid_call_is_recovered_and_recorded_as_such(content, arguments):
    recovered = recover(output(content), TOOLS)
    assert recovered.tool_calls == (ToolCall(id="call_t1_2_0", name="get_weather", arguments=arguments),)
    assert recovered.content == "" and recovered.stop_reason == "tool_calls"
    assert recovered.stop_detail.startswith(RECOVERED)
    json.loads(recovered.tool_calls[0].arguments)


@pytest.mark.parametrize("content", NOT_CALLS)
def test_anything_else_stays_the_reply_it_was(content):
    kept = output(content)
    assert text_call(content, TOOLS) is None
    assert recover(kept, TOOLS) is kept


def test_nothing_is_recovered_when_no_tools_are_offered_or_the_reply_already_calls_or_was_cut():
    text = RECOVERABLE[0][0]
    assert recover(output(text), ()).tool_calls == ()
    assert recover(output(text, stop_reason="length"), TOOLS).tool_calls == ()
    real = output("", tool_calls=(ToolCall(id="c", name="get_weather", arguments="{}"),), stop_reason="tool_calls")
    assert recover(real, TOOLS) is real


def test_a_text_of_calls_is_noticed_even_when_it_cannot_be_run():
    two = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {}}]'
    assert looks_like_text_call(output(two), TOOLS)  # several calls: warned about, never run
    assert looks_like_text_call(output('{"name": "get_weather", "arguments": {"town": 1}}'), TOOLS)
    assert not looks_like_text_call(output('{"name": "get_forecast", "arguments": {}}'), TOOLS)
    assert not looks_like_text_call(output('{"city": "Oslo"}'), TOOLS)
    assert not looks_like_text_call(output("It is sunny."), TOOLS)
