"""Citation styles and the XML layout of elements."""

from __future__ import annotations

import pytest

from agentstream.context import BRACKETS, FULLWIDTH, Numbering, xml
from agentstream.wire.events import Document, Image, Passage, Source


def numbered(*elements) -> Numbering:
    numbering = Numbering()
    numbering.add(elements, "search")
    return numbering


def test_styles_write_their_own_form_and_read_every_form():
    assert BRACKETS.cite(4) == "[4]" and BRACKETS.cite_all([4, 5]) == "[4][5]"
    assert FULLWIDTH.cite(4) == "【4】" and FULLWIDTH.cite_all([4, 5]) == "【4】【5】"
    text = "See [4, 5] and [6;7], also 【8】 and 【9†source】, again [4], not [x] or [ ]."
    for style in (BRACKETS, FULLWIDTH):
        assert style.read(text) == [4, 5, 6, 7, 8, 9]
    assert BRACKETS.resolve("[2] and [9]", {1: "a", 2: "b"}) == ["b"]


def test_sources_carry_their_number_and_exact_citation():
    doc = Document(id="https://x/doc", title="Guide", url="https://x/doc", properties={"modified": "2024-01-02"})
    text = xml()([doc], numbered(doc), "search", FULLWIDTH)
    assert text == '<document id="1" cite="【1】" title="Guide" url="https://x/doc" modified="2024-01-02"/>'
    assert "cite=" not in xml()([doc], numbered(doc), "search", None)
    assert "cite=" not in xml(cite=None)([doc], numbered(doc), "search", BRACKETS)


def test_fields_tags_and_order_are_configurable():
    doc = Document(id="d", title="T", properties={"modified": "2024", "secret": "s"})
    p1 = Passage(id="p1", ref="d", text="second", properties={"chunk_index": 2})
    p2 = Passage(id="p2", ref="d", text="first", properties={"chunk_index": 1})
    p3 = Passage(id="p3", ref="d", text="unordered")
    layout = xml(
        fields={Document: {"properties.modified": "date"}},
        tags={Passage: "chunk"},
        order={Passage: "properties.chunk_index"},
    )
    text = layout([doc, p1, p2, p3], numbered(doc, p1, p2, p3), "search", BRACKETS)
    assert text.splitlines() == [
        '<document id="1" cite="[1]" date="2024">',
        '<chunk id="3" cite="[3]" chunk_index="1">first</chunk>',
        '<chunk id="2" cite="[2]" chunk_index="2">second</chunk>',
        '<chunk id="4" cite="[4]">unordered</chunk>',
        "</document>",
    ]
    with pytest.raises(ValueError):
        xml(fields={Document: {"nope.x": "y"}})
    with pytest.raises(ValueError):
        xml(order={Passage: "missing"})


def test_a_part_without_its_whole_names_it_and_reserved_names_get_a_prefix():
    doc = Document(id="d", title="T")
    part = Passage(id="p", ref="d", text="t", properties={"id": "own", "document": "x", "cite": "c"})
    numbering = numbered(doc, part)
    assert xml()([part], numbering, "search", BRACKETS) == (
        '<passage id="2" cite="[2]" document="1" data-id="own" data-document="x" data-cite="c">t</passage>'
    )
    stray = Passage(id="q", ref="unknown-doc", text="t")
    assert 'ref="unknown-doc"' in xml()([stray], numbered(stray), None, None)


def test_text_is_escaped_and_image_bytes_are_never_written():
    source = Source(id="s", text='<script>alert("x") & more</script>', properties={"note": 'say "hi" <b>'})
    image = Image(id="i", media_type="image/png", data="AAAA" * 100)
    text = xml()([source, image], numbered(source, image), None, BRACKETS)
    assert "<script>" not in text and "&lt;script&gt;" in text and "&quot;hi&quot;" in text
    assert "AAAA" not in text and '<image id="2" media_type="image/png"/>' in text


def test_numbering_is_append_only_and_remembers_the_first_record():
    numbering = Numbering()
    numbering.add([Source(id="a", text="1")], "t1")
    numbering.add([Source(id="b"), Source(id="a", text="2")], "t2")
    assert numbering.number("a") == 1 and numbering.number("b") == 2 and numbering.element_id(2) == "b"
    assert numbering.first("a").text == "1" and numbering.tool_of("a") == "t1" and len(numbering) == 2
