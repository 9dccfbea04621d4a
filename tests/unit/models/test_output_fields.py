"""A model output's own data and flags (seed 003): ``attributes``, ``include_in_messages``, ``persist``."""

from __future__ import annotations

import asyncio

from agentstream.context import build_request
from agentstream.models.endpoints import ModelEndpoint
from agentstream.models.generate import Generator
from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput
from tests.unit.context.factory import Trace, make_agent


def test_the_fields_are_recorded_and_read_back():
    output = ModelOutput(
        turn_id="t", step=0, content="x", attributes={"judge": {"score": 0.5}}, include_in_messages=False, persist=False
    )
    stored = codec.decode_entry(codec.encode_entry(output))
    assert (stored.attributes, stored.include_in_messages, stored.persist) == ({"judge": {"score": 0.5}}, False, False)
    plain = codec.decode_entry(codec.encode_entry(ModelOutput(turn_id="t", step=0)))
    assert (plain.attributes, plain.include_in_messages, plain.persist) == ({}, True, True)


def test_an_output_not_included_in_messages_is_left_out_with_its_results():
    trace = Trace()
    turn = trace.user("check twice")
    hidden = ModelOutput(
        turn_id=turn,
        step=0,
        tool_calls=(ToolCall(id="c9", name="search", arguments="{}"),),
        stop_reason="tool_calls",
        include_in_messages=False,
    )
    trace.events += [hidden, ToolOutput(turn_id=turn, call_id="c9", name="search", text="hidden result")]
    trace._steps[turn] = 1
    trace.answer(turn, "seen answer")
    messages = build_request(trace.events, make_agent(), turn_id=turn, step=2).messages
    assert [type(m).__name__ for m in messages] == ["UserMessage", "AssistantMessage"]
    assert messages[1].content == "seen answer"


class _Double:
    endpoint = ModelEndpoint(id="d", provider="openai", base_url="http://x/v1", model="d")

    def __init__(self, outputs):
        self.outputs = list(outputs)

    async def complete(self, request, *, turn_id, step, deltas=None, options=None):
        return self.outputs.pop(0)

    async def aclose(self):
        return None


class _Recorder:
    def __init__(self):
        self.events = []

    async def append(self, trace_id, event):
        self.events.append((trace_id, event))


def test_a_generation_does_not_record_an_output_that_asks_not_to_be():
    kept = ModelOutput(turn_id="g", step=0, content="kept")
    private = ModelOutput(turn_id="g", step=0, content="private", persist=False)
    recorder = _Recorder()
    gen = Generator(_Double([kept, private]))
    asyncio.run(gen.generate("a", trace=recorder, trace_id="gen"))
    asyncio.run(gen.generate("b", trace=recorder, trace_id="gen"))
    assert recorder.events == [("gen", kept)]
