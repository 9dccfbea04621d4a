"""Trimming messages to a token budget (strategy, partial, start/end on, system), never splitting a call from its results."""

from __future__ import annotations

import asyncio

import pytest

from agentstream.context import (
    AssistantMessage,
    ChatRequest,
    ModelLimits,
    SystemMessage,
    Tokens,
    ToolResultMessage,
    UserMessage,
    atrim_messages,
    trim_messages,
    trim_request,
)
from agentstream.context.trimming import units
from agentstream.wire.events import ToolCall


def count(messages) -> int:
    return len(messages)


def words(messages) -> int:
    return sum(len(getattr(m, "text", getattr(m, "content", "")).split()) for m in messages)


CONVERSATION = [
    SystemMessage(text="S"),
    UserMessage(text="one"),
    AssistantMessage(content="two"),
    UserMessage(text="three"),
    AssistantMessage(content="four"),
]


def test_under_budget_the_input_comes_back_unchanged():
    assert trim_messages(CONVERSATION, max_tokens=100, token_counter=count) == tuple(CONVERSATION)


def test_last_keeps_the_newest_and_first_keeps_the_oldest():
    assert trim_messages(CONVERSATION, max_tokens=2, token_counter=count) == tuple(CONVERSATION[3:])
    assert trim_messages(CONVERSATION, max_tokens=2, token_counter=count, strategy="first") == tuple(CONVERSATION[:2])


def test_include_system_keeps_the_leading_system_message_within_the_budget():
    assert trim_messages(CONVERSATION, max_tokens=3, token_counter=count, include_system=True) == (
        CONVERSATION[0],
        *CONVERSATION[3:],
    )


def test_start_on_and_end_on():
    kept = trim_messages(CONVERSATION, max_tokens=3, token_counter=count, start_on="user")
    assert kept == tuple(CONVERSATION[3:])
    kept = trim_messages(CONVERSATION, max_tokens=3, token_counter=count, end_on=("user",), start_on=UserMessage)
    assert kept == (CONVERSATION[1], CONVERSATION[2], CONVERSATION[3])
    kept = trim_messages(CONVERSATION, max_tokens=3, token_counter=count, strategy="first", end_on="human")
    assert kept == (CONVERSATION[0], CONVERSATION[1])


def test_allow_partial_splits_one_text_with_the_splitter():
    messages = [UserMessage(text="a\nb\nc\nd"), UserMessage(text="e f")]
    last = trim_messages(messages, max_tokens=4, token_counter=words, allow_partial=True)
    assert last == (UserMessage(text="c\nd"), UserMessage(text="e f"))
    first = trim_messages(
        messages,
        max_tokens=3,
        token_counter=words,
        strategy="first",
        allow_partial=True,
        text_splitter=lambda t: [p + " " for p in t.split()],
    )
    assert first == (UserMessage(text="a b c "),)
    assert trim_messages(messages, max_tokens=4, token_counter=words) == (UserMessage(text="e f"),)


def test_a_tool_call_and_its_results_are_one_unit():
    call = AssistantMessage(tool_calls=(ToolCall(id="c1", name="get"), ToolCall(id="c2", name="get")))
    messages = [
        UserMessage(text="go"),
        call,
        ToolResultMessage(call_id="c1", name="get", text=[1, 2].__repr__()),
        ToolResultMessage(call_id="c2", name="get", text='{"structured": true}'),
        ToolResultMessage(call_id="zz", name="get", text="orphan"),
    ]
    grouped = units(messages)
    assert [len(u) for u in grouped] == [1, 3]
    assert trim_messages(messages, max_tokens=3, token_counter=count) == tuple(messages[1:4])
    assert trim_messages(messages, max_tokens=2, token_counter=count) == ()


def test_trim_request_fits_the_window_and_starts_on_a_user_message():
    history = []
    for index in range(20):
        history += [UserMessage(text=f"q{index} " + "x" * 300), AssistantMessage(content="y" * 300)]
    request = ChatRequest(system="S", messages=tuple(history))
    limits = ModelLimits(window=Tokens(2_000))
    trimmed = trim_request(request, limits, output_reserve=500, note="Earlier messages were left out.")
    assert isinstance(trimmed.messages[0], UserMessage) and trimmed.messages[-1] == history[-1]
    assert trimmed.system.endswith("left out.")
    assert trim_request(trimmed, ModelLimits(window=Tokens(100_000)), output_reserve=500) is trimmed


# --- the seed's last gaps (issue 34): kinds refused, async counters and splitters --------------


@pytest.mark.parametrize("bad", ["generic", "humans", "", object, ["user", "chat"]])
def test_an_unknown_kind_is_refused_not_a_trim_that_keeps_nothing(bad):
    messages = [UserMessage(text="a"), AssistantMessage(content="b")]
    with pytest.raises(ValueError, match="no message kind"):
        trim_messages(messages, max_tokens=100, token_counter=count, end_on=bad)
    with pytest.raises(ValueError, match="start_on names"):
        trim_messages(messages, max_tokens=100, token_counter=count, start_on=bad)


def test_known_kinds_by_name_alias_and_class_are_taken():
    messages = [UserMessage(text="a"), AssistantMessage(content="b"), UserMessage(text="c")]
    for spec in ("ai", "assistant", AssistantMessage, ["ai"]):
        assert trim_messages(messages, max_tokens=100, token_counter=count, end_on=spec) == tuple(messages[:2])


def test_an_async_counter_or_splitter_is_awaited_by_atrim_and_named_by_the_sync_trim():
    messages = [UserMessage(text="one\ntwo\n"), AssistantMessage(content="three\nfour\nfive\n")]

    async def acount(ms) -> int:
        await asyncio.sleep(0)
        return words(ms)

    async def asplit(text: str) -> list[str]:
        await asyncio.sleep(0)
        return text.splitlines(keepends=True)

    sync = trim_messages(messages, max_tokens=4, token_counter=words, allow_partial=True)
    kept = asyncio.run(
        atrim_messages(messages, max_tokens=4, token_counter=acount, allow_partial=True, text_splitter=asplit)
    )
    assert kept == sync and kept != tuple(messages)  # the same trim, partial split included
    assert asyncio.run(atrim_messages(messages, max_tokens=4, token_counter=words, allow_partial=True)) == sync
    with pytest.raises(TypeError, match="token_counter is async; use `await atrim_messages"):
        trim_messages(messages, max_tokens=4, token_counter=acount)
    with pytest.raises(TypeError, match="text_splitter is async"):
        trim_messages(messages, max_tokens=4, token_counter=words, allow_partial=True, text_splitter=asplit)
