"""Elements and the app's own types: registration, validation, the codec, tool returns, citations read back."""

from __future__ import annotations

import asyncio
import base64

import msgspec
import pytest

from agentstream import App, ToolResult, tool
from agentstream.app.base import invoke_tool
from agentstream.context import BRACKETS, ContextConfig, build_request
from agentstream.context.cited import read_back
from agentstream.context.elements import Numbering
from agentstream.errors import ConfigError, UnrenderedEventError
from agentstream.wire.codec import DEFAULT_CODEC, encode_entry
from agentstream.wire.events import (
    Document,
    Image,
    ModelOutput,
    Passage,
    Source,
    ToolCall,
    ToolOutput,
    TurnInput,
    UnknownElement,
    UnknownEvent,
)
from agentstream.wire.registry import MAX_IMAGE_BYTES, AppTypes, check_elements
from tests.support.element_apps import Note, Ticket, app, plain_app

# --- registration ------------------------------------------------------------------------------


def test_app_types_need_an_explicit_tag_in_the_right_field_and_no_clash():
    class NoTag(Source, frozen=True, kw_only=True):
        pass

    class ByName(Source, frozen=True, kw_only=True, tag=True):
        pass

    class Clash(Source, frozen=True, kw_only=True, tag="passage"):
        pass

    class Event1(msgspec.Struct, frozen=True, tag="turn_ended"):
        pass

    class WrongField(msgspec.Struct, frozen=True, tag="x", tag_field="kind"):
        pass

    class Reserved(msgspec.Struct, frozen=True, tag="unknown_event"):
        pass

    with pytest.raises(ConfigError, match="uses the tag 'source', which the built-in element Source already has"):
        AppTypes(element_types=(NoTag,))  # a subclass without a tag of its own has its base's
    with pytest.raises(ConfigError, match="explicit string tag"):
        AppTypes(element_types=(ByName,))
    with pytest.raises(ConfigError, match="'passage', which the built-in element Passage already has"):
        AppTypes(element_types=(Clash,))
    with pytest.raises(ConfigError, match="built-in event TurnEnded"):
        AppTypes(event_types=(Event1,))
    with pytest.raises(ConfigError, match="tagged in field 'kind'; it must be 'type'"):
        AppTypes(event_types=(WrongField,))
    with pytest.raises(ConfigError, match="reserves"):
        AppTypes(event_types=(Reserved,))
    with pytest.raises(ConfigError, match="must subclass agentstream.wire.events.Element"):
        AppTypes(element_types=(Note,))

    class Twin(msgspec.Struct, frozen=True, kw_only=True, tag="note"):
        turn_id: str

    with pytest.raises(ConfigError, match="the app's event Note already has"):
        App(agents=[], event_types=[Note, Twin])


# --- validation ------------------------------------------------------------------------------


def test_check_elements_names_what_is_wrong_and_where():
    class Stray(Source, frozen=True, kw_only=True, tag="stray"):
        pass

    good = base64.b64encode(b"\x89PNG....").decode()
    check_elements(
        [Document(id="d", text="x"), Image(id="i", media_type="image/png", data=good), Ticket(id="t")], app.types
    )
    cases = [
        ([Stray(id="s")], "element 0 is a Stray, which the app does not register"),
        ([Ticket(id="t")], "Ticket, which the app does not register"),  # not registered in the default types
        ([Source(id=" ")], "its id is empty"),
        ([Image(id="i")], "exactly one of url or data"),
        ([Image(id="i", url="https://x/y.png", data=good, media_type="image/png")], "exactly one of url or data"),
        ([Image(id="i", url="file:///etc/passwd")], "must be http"),
        ([Image(id="i", data="%%%not base64", media_type="image/png")], "not valid base64"),
        ([Image(id="i", data=good, media_type="text/html")], "media_type must be one of"),
        (
            [Image(id="i", data=base64.b64encode(b"0" * (MAX_IMAGE_BYTES + 10)).decode(), media_type="image/png")],
            "over the limit",
        ),
        (
            [Source(id="a"), Source(id="b", properties={"x": object()})],
            "element 1 \\(id 'b'\\): it cannot be stored as JSON",
        ),
    ]
    for elements, message in cases:
        with pytest.raises(ValueError, match=message):
            check_elements(elements, where="here")


# --- the codec -------------------------------------------------------------------------------


def test_the_apps_codec_reads_its_elements_and_events_and_other_readers_get_placeholders():
    result = ToolOutput(
        turn_id="t1",
        call_id="c1",
        name="ticket",
        text="",
        elements=(Ticket(id="T-1", text="broken", status="open"), Passage(id="p", text="x")),
    )
    note = Note(turn_id="t1", text="hello")
    for event in (result, note):
        fields = encode_entry(event)
        assert app.codec.decode_entry(fields) == event
    plain = DEFAULT_CODEC.decode_entry(encode_entry(result))
    assert isinstance(plain, ToolOutput) and plain.elements[1] == Passage(id="p", text="x")
    assert plain.elements[0] == UnknownElement(
        id="T-1", stored_kind="ticket", raw=msgspec.to_builtins(Ticket(id="T-1", text="broken", status="open"))
    )
    assert DEFAULT_CODEC.decode_entry(encode_entry(note)) == UnknownEvent(
        stored_type="note", turn_id="t1", raw=msgspec.to_builtins(note)
    )
    # a registered kind whose fields are wrong is an error, never a placeholder
    with pytest.raises(Exception, match="entry"):
        app.codec.decode(
            b'{"type":"tool_result","turn_id":"t","call_id":"c","name":"n","text":"","elements":[{"kind":"ticket","id":3}]}'
        )


def test_the_builder_refuses_a_stored_type_the_app_does_not_know_instead_of_skipping_it():
    agent = plain_app.agent("reader")
    call = ModelOutput(
        turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="search", arguments="{}"),), stop_reason="tool_calls"
    )
    start = [TurnInput(turn_id="t1", agent="reader", text="hi"), call]
    unknown_event = DEFAULT_CODEC.decode_entry(encode_entry(Note(turn_id="t1", text="x")))
    with pytest.raises(UnrenderedEventError, match="type 'note', which this app does not register"):
        build_request([*start, unknown_event], agent, turn_id="t1", step=1)
    result = DEFAULT_CODEC.decode_entry(
        encode_entry(ToolOutput(turn_id="t1", call_id="c1", name="search", text="", elements=(Ticket(id="T"),)))
    )
    with pytest.raises(UnrenderedEventError, match="element of kind 'ticket'"):
        build_request([*start, result], agent, turn_id="t1", step=1)


# --- what tools return -------------------------------------------------------------------------


def test_a_tool_returns_elements_alone_a_list_of_them_or_a_tool_result():
    @tool
    def one() -> Source:
        "One."
        return Source(id="s", text="x")

    @tool
    def many() -> list:
        "Many."
        return [Document(id="d"), Passage(id="d#1", ref="d", text="p")]

    @tool
    def full() -> ToolResult:
        "Full."
        return ToolResult(
            text="t",
            data={"n": 1},
            elements=[Image(id="i", url="https://x/i.png")],
            events=[Note(turn_id="t", text="n")],
        )

    assert asyncio.run(invoke_tool(one, "")).elements == (Source(id="s", text="x"),)
    assert asyncio.run(invoke_tool(many, "")).elements == (Document(id="d"), Passage(id="d#1", ref="d", text="p"))
    value = asyncio.run(invoke_tool(full, ""))
    assert (value.text, value.data, len(value.elements), len(value.events)) == ("t", {"n": 1}, 1, 1)
    assert asyncio.run(invoke_tool(tool(lambda: []), "")).data == []  # an empty list stays data


# --- citations read back -----------------------------------------------------------------------


def numbered(*elements):
    numbering = Numbering()
    numbering.add(elements, "search")
    return numbering


def test_every_citation_form_resolves_to_the_sources_under_those_numbers():
    doc = Document(id="d", title="Doc", url="https://d")
    numbering = numbered(
        doc,
        Passage(id="d#1", ref="d", text="a"),
        Source(id="s", text="b", properties={"title": "S"}),
        Image(id="img", url="https://i"),
    )
    for answer in (
        "A [2]. B [3].",
        "A [2, 3].",
        "A [2;3].",
        "A 【2】【3】.",
        "A 【2†source】 【3†source】.",
        "A [2][3].",
    ):
        text, cited = read_back(answer, numbering, BRACKETS)
        assert [c.id for c in cited] == ["d#1", "s"], answer
        assert "[" not in text and "【" not in text, answer
    text, cited = read_back("Leave is 25 days [2]. Carry over 5 [3]. Unknown [9], image [4], word [x].", numbering)
    assert text == "Leave is 25 days. Carry over 5. Unknown [9], image [4], word [x]."
    first, second = cited
    assert (first.number, first.title, first.url, first.whole, first.kind) == (2, "Doc", "https://d", "d", "passage")
    assert (second.title, second.url) == ("S", "")
    assert [text[slice(*span)] for span in first.spans] == ["Leave is 25 days"]
    assert [text[slice(*span)] for span in second.spans] == ["Carry over 5"]
    text, (cited_1, cited_2) = read_back("X holds [2], and Y too [3].", numbering)
    assert (
        text == "X holds, and Y too."
        and text[slice(*cited_1.spans[0])] == "X holds"
        and text[slice(*cited_2.spans[0])] == "and Y too"
    )


def test_an_agent_that_cites_ends_its_turn_with_the_answer_without_marks_and_the_sources():
    from agentstream.steps.decision import EndTurn, decide

    agent = app.agent("reader")
    call = ModelOutput(
        turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="search", arguments="{}"),), stop_reason="tool_calls"
    )
    result = ToolOutput(
        turn_id="t1",
        call_id="c1",
        name="search",
        text="",
        elements=(Document(id="d", title="D"), Passage(id="d#0", ref="d", text="p")),
    )
    answer = ModelOutput(turn_id="t1", step=1, content="It is so [2].")
    decision = decide([TurnInput(turn_id="t1", agent="reader", text="q"), call, result, answer], app.agent)
    assert isinstance(decision, EndTurn) and decision.answer == "It is so."
    assert [(c.number, c.id, c.title) for c in decision.citations] == [(2, "d#0", "D")]
    assert agent.context is not None and isinstance(agent.context, ContextConfig)
