"""The decisions of the XML layout, each a pure function: which elements nest in which, the
order of a whole's parts, and the fields an element shows (:mod:`agentstream.context.layout`)."""

from __future__ import annotations

import pytest

from agentstream.context.layout import field_pairs, nest, sort_parts
from agentstream.wire.events import Document, Image, Passage, Source

DOC = Document(id="d", title="Guide", url="https://x/d")
P1 = Passage(id="p1", ref="d", text="one", properties={"chunk": 2})
P2 = Passage(id="p2", ref="d", text="two", properties={"chunk": 1})
P3 = Passage(id="p3", ref="d", text="three")
STRAY = Passage(id="s", ref="elsewhere", text="stray")
SELF = Passage(id="me", ref="me", text="its own whole")


@pytest.mark.parametrize(
    ("case", "elements", "children", "roots"),
    [
        ("nothing", [], {}, []),
        ("a part nests in its whole shown beside it", [DOC, P1], {"d": [P1]}, [DOC]),
        ("parts keep their order under the whole", [P2, DOC, P1], {"d": [P2, P1]}, [DOC]),
        ("a part whose whole is elsewhere is a root", [STRAY], {}, [STRAY]),
        ("a part that names itself is a root", [SELF], {}, [SELF]),
        ("a part without its whole is a root", [P1, P2], {}, [P1, P2]),
    ],
)
def test_which_elements_nest(case, elements, children, roots) -> None:
    assert nest(elements) == (children, roots), case


@pytest.mark.parametrize(
    ("case", "parts", "order", "expected"),
    [
        ("no order: arrival order", [P1, P2, P3], None, [P1, P2, P3]),
        ("by the order path's value", [P1, P2], {Passage: "properties.chunk"}, [P2, P1]),
        ("parts without a value follow", [P3, P1, P2], {Passage: "properties.chunk"}, [P2, P1, P3]),
        ("an order of another class: arrival order", [P1, P2], {Document: "title"}, [P1, P2]),
        (
            "values that do not compare: by their text",
            [Passage(id="a", properties={"chunk": "b"}), Passage(id="b", properties={"chunk": 1})],
            {Passage: "properties.chunk"},
            [Passage(id="b", properties={"chunk": 1}), Passage(id="a", properties={"chunk": "b"})],
        ),
        (
            "equal values: arrival order",
            [Passage(id="a", properties={"chunk": 1}), Passage(id="b", properties={"chunk": 1})],
            {Passage: "properties.chunk"},
            [Passage(id="a", properties={"chunk": 1}), Passage(id="b", properties={"chunk": 1})],
        ),
    ],
)
def test_the_order_of_a_wholes_parts(case, parts, order, expected) -> None:
    assert sort_parts(parts, order) == expected, case


@pytest.mark.parametrize(
    ("case", "element", "fields", "expected"),
    [
        ("every added field, then the properties", DOC, None, [("title", "Guide"), ("url", "https://x/d")]),
        ("properties after the fields", P1, None, [("chunk", 2)]),
        (
            "an image's bytes never show",
            Image(id="i", media_type="image/png", url="u", data="AAAA"),
            None,
            [("media_type", "image/png"), ("url", "u")],
        ),
        ("the fields chosen for the class", DOC, {Document: {"url": "href"}}, [("href", "https://x/d")]),
        ("a chosen path that holds nothing", P3, {Passage: {"properties.chunk": "n"}}, [("n", None)]),
        ("chosen for a base class: applies to its subclasses", P1, {Source: {"text": "t"}}, [("t", "one")]),
    ],
)
def test_the_fields_an_element_shows(case, element, fields, expected) -> None:
    assert field_pairs(element, fields) == expected, case
