"""Forms and shorten functions, and the refusal of a shorten function that changes elements."""

from __future__ import annotations

import msgspec
import pytest

from agentstream.context import (
    COMPRESSED,
    FULL,
    STUBBED,
    ContextPolicy,
    Forms,
    ModelLimits,
    Tokens,
    as_recorded,
    build_context,
    cap,
    drop_text,
    first_words,
    json_cap,
    sources,
)
from agentstream.context.forms import checked
from agentstream.errors import ShortenError
from agentstream.wire.events import Document, Image, Passage, ToolOutput
from tests.unit.context.factory import Trace, make_agent

LIMITS = ModelLimits(window=Tokens(1000))


def output(**kwargs) -> ToolOutput:
    defaults = dict(turn_id="t", call_id="c", name="search", text="see the sources")
    return ToolOutput(**{**defaults, **kwargs})


def test_forms_are_ordered():
    assert STUBBED < COMPRESSED < FULL


def test_as_recorded_is_the_result_itself_and_drop_text_empties_each_source():
    result = output(
        elements=(Document(id="d", text="long"), Passage(id="p", ref="d", text="part"), Image(id="i", url="u"))
    )
    assert as_recorded(result, LIMITS) is result
    dropped = drop_text(result, LIMITS)
    assert [getattr(e, "text", None) for e in dropped.elements] == ["", "", None]
    assert dropped.text == result.text and result.elements[0].text == "long"


def test_cap_cuts_before_the_word_and_says_how_much_was_cut():
    text = "alpha beta gamma delta epsilon " * 10
    cut = cap(Tokens(5))(text, LIMITS)
    assert cut.startswith("alpha beta\n") and "more tokens not shown]" in cut
    kept = cut.split("\n")[0]
    assert len(kept) <= 15 and text.startswith(kept)
    assert cap(Tokens(500))(text, LIMITS) == text


def test_first_words_and_sources():
    assert first_words(3)("one  two\nthree four", LIMITS) == "one two three …"
    assert first_words(3)("one two", LIMITS) == "one two"
    shortened = sources(first_words(1))(output(elements=(Document(id="d", text="many words here"),)), LIMITS)
    assert shortened.elements[0].text == "one …".replace("one", "many") and shortened.text == "see the sources"


def test_json_cap_moves_cut_json_into_the_text():
    data = {"rows": list(range(200))}
    encoded = msgspec.json.encode(data).decode()
    capped = json_cap(Tokens(10))(output(text=encoded, data=data), LIMITS)
    assert capped.data is None and capped.text.startswith('{"rows":[0,1') and "not shown" in capped.text
    small = output(text="x", data={"a": 1})
    assert json_cap(Tokens(10))(small, LIMITS) is small
    with_text = json_cap(Tokens(10))(output(text="Rows:", data=data), LIMITS)
    assert with_text.text.startswith("Rows:\n{")


@pytest.mark.parametrize(
    "bad",
    [
        lambda o, limits: msgspec.structs.replace(o, elements=()),
        lambda o, limits: msgspec.structs.replace(o, elements=tuple(reversed(o.elements))),
        lambda o, limits: msgspec.structs.replace(o, elements=(*o.elements, Document(id="new"))),
        lambda o, limits: msgspec.structs.replace(o, error="changed"),
    ],
)
def test_a_shorten_function_that_changes_elements_or_the_error_is_refused(bad):
    result = output(elements=(Document(id="a", text="x"), Document(id="b", text="y")))
    with pytest.raises(ShortenError):
        checked(bad, result, LIMITS)
    assert checked(drop_text, result, LIMITS).elements[0].text == ""


def test_the_builder_refuses_a_bad_full_function():
    trace = Trace()
    turn = trace.tool_turn("q", ["r"])
    nxt = trace.user("again")
    _ = turn
    policy = ContextPolicy(tools={"search": Forms(full=lambda o, limits: msgspec.structs.replace(o, error="boom"))})
    with pytest.raises(ShortenError, match="changed the error"):
        build_context(trace.events, make_agent(window=100_000, policy=policy), turn_id=nxt, step=0)


def test_policy_picks_per_tool_forms_and_caps():
    policy = ContextPolicy(
        result_cap=Tokens(100), tools={"read": Forms(full=drop_text, cap=None), "calc": Forms(cap=Tokens(5))}
    )
    assert policy.shorten_for("read", FULL) is drop_text
    assert policy.shorten_for("search", FULL) is as_recorded
    assert policy.shorten_for("read", COMPRESSED) is drop_text
    assert policy.cap_for("read") is None
    assert policy.cap_for("calc") == Tokens(5)
    assert policy.cap_for("search") == Tokens(100)


def test_the_result_cap_cuts_a_long_result_even_under_budget():
    trace = Trace()
    trace.tool_turn("q", ["word " * 5000])
    nxt = trace.user("again")
    messages = build_context(trace.events, make_agent(window=200_000), turn_id=nxt, step=0).request.messages
    assert len(messages[2].text) < 25_000 and "more tokens not shown]" in messages[2].text


def test_the_estimate_takes_a_recorded_result_as_its_own_full_form_without_making_it(monkeypatch):
    """The default full form is the result itself, so sizing it makes no full output (the
    shortcut of the context rebuild); a tool with its own full function has it made."""
    from agentstream.context.elements import Numbering
    from agentstream.context.render import ContextConfig, Parts, ResultRenderer

    def made(self, result):
        raise AssertionError("the full form was made to be measured")

    default = ResultRenderer(ContextConfig(policy=ContextPolicy()), LIMITS, Numbering())
    assert default.tool_sizes("search").full_as_recorded
    monkeypatch.setattr(ResultRenderer, "full_output", made)
    parts = Parts()
    full, _, _ = default.estimates(output(), "r1", parts)
    assert parts.full is not None and parts.full.text == "see the sources"
    assert full > len("see the sources")

    own = ContextPolicy(tools={"search": Forms(full=first_words(3))})
    custom = ResultRenderer(ContextConfig(policy=own), LIMITS, Numbering())
    assert not custom.tool_sizes("search").full_as_recorded
    with pytest.raises(AssertionError, match="made to be measured"):
        custom.estimates(output(), "r1", Parts())
