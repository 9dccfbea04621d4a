"""The fallback trim after a failed summary (issue 11 item 8, field case C04): the trimmed request
always holds the system prompt and the running turn whole — its newest user input and every call
made since, each paired with its result — or the turn fails context_full with the sizes. Pure."""

from __future__ import annotations

import pytest

from agentstream.context import AssistantMessage, ChatRequest, ModelLimits, Tokens, ToolResultMessage, UserMessage
from agentstream.context.trimming import trim_request
from agentstream.errors import ContextFullError
from agentstream.wire.events import ToolCall


def call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="query", arguments="{}")


def conversation(result_chars: int = 3_000, user_chars: int = 2_000) -> ChatRequest:
    messages = (
        UserMessage(text="old question " + "o" * 3_000),
        AssistantMessage(content="old answer " + "a" * 1_000),
        UserMessage(text="Analyze metrics for asset X " + "q" * user_chars),  # the running turn
        AssistantMessage(tool_calls=(call("call_1"), call("call_2"))),
        ToolResultMessage(call_id="call_1", name="query", text="errors " + "e" * result_chars),
        ToolResultMessage(call_id="call_2", name="query", text="latency " + "l" * result_chars),
        AssistantMessage(tool_calls=(call("call_3"),)),
        ToolResultMessage(call_id="call_3", name="query", text="more " + "m" * result_chars),
    )
    return ChatRequest(system="You analyse metrics.", messages=messages)


def assert_running_turn_whole(request: ChatRequest, trimmed: ChatRequest) -> None:
    running = request.messages[2:]
    assert trimmed.messages[-len(running) :] == running, "the running turn is not kept whole"
    assert isinstance(trimmed.messages[0], UserMessage) and trimmed.system.startswith(request.system)
    calls = [c.id for m in trimmed.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    results = [m.call_id for m in trimmed.messages if isinstance(m, ToolResultMessage)]
    assert calls == results == ["call_1", "call_2", "call_3"]


@pytest.mark.parametrize("window", range(3_000, 8_001, 250))
def test_every_trim_keeps_the_running_turn_whole_or_fails_with_the_sizes(window):
    request = conversation()
    limits = ModelLimits(window=Tokens(window))
    try:
        trimmed = trim_request(request, limits, output_reserve=256, note="Earlier messages were left out.")
    except ContextFullError as exc:
        message = str(exc)
        assert (
            f"window of {window} tokens" in message
            and "output reserve 256" in message
            and "3 tool result(s)" in message
        )
        assert "needs about" in message and "Nothing was sent" in message
        return
    if trimmed is not request:
        assert_running_turn_whole(request, trimmed)
        assert "left out" in trimmed.system


def test_a_running_turn_that_cannot_fit_fails_instead_of_sending_the_system_prompt_alone():
    request = conversation(result_chars=6_000)
    with pytest.raises(
        ContextFullError, match=r"needs about \d+ tokens, the system prompt \d+, the tool definitions 0"
    ):
        trim_request(request, ModelLimits(window=Tokens(4_000)), output_reserve=256)


def test_the_running_turn_is_kept_and_the_older_history_goes_first():
    request = conversation(result_chars=1_000)
    trimmed = trim_request(request, ModelLimits(window=Tokens(2_500)), output_reserve=256)
    assert_running_turn_whole(request, trimmed)
    assert trimmed.messages[0].text.startswith("Analyze metrics")  # the old turn went


def test_under_budget_the_request_is_unchanged():
    request = conversation(result_chars=10, user_chars=10)
    assert trim_request(request, ModelLimits(window=Tokens(100_000)), output_reserve=256) is request
