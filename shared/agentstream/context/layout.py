"""The XML layout of elements: how the sources and images of one event show as text.

Each element is a tag named by its type (``<document>``, ``<passage>``, ``<source>``,
``<image>``) with its number as ``id``; a citable source also carries the exact citation the
model should copy (``cite="[7]"``), so the model copies what to cite instead of choosing among
the numbers it sees. Added fields and ``properties`` keys become attributes; a source's text is
the tag's content. A part nests inside its whole when both came in the same event; otherwise it
names its whole as an attribute (``document="3"``). All text is escaped, so content never reads
as a tag. An image's bytes are never written as text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from agentstream.context.citations import CitationStyle
from agentstream.context.elements import Numbering
from agentstream.wire.events import Element, Image, Source

Layout = Callable[[Sequence[Element], Numbering, "str | None", "CitationStyle | None"], str]
"""Shows the elements of one event as text: ``(elements, numbering, tool name or None, citation style or None) -> str``."""

_BASE_FIELDS = frozenset({"id", "ref", "properties", "text"})
_HIDDEN: dict[type, frozenset[str]] = {Image: frozenset({"data"})}


def escape_text(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` (element content)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attribute(text: str) -> str:
    """Escape text for a double-quoted attribute value."""
    return escape_text(text).replace('"', "&quot;")


def tag_of(element_type: type[msgspec.Struct], tags: Mapping[type, str] | None = None) -> str:
    """The tag of an element type: from ``tags`` (nearest class), else its stored kind."""
    if tags:
        for cls in element_type.__mro__:
            if cls in tags:
                return tags[cls]
    tag = getattr(element_type.__struct_config__, "tag", None)
    return tag if isinstance(tag, str) else element_type.__name__.lower()


def _nearest(mapping: Mapping[type, Any] | None, element_type: type) -> Any:
    if not mapping:
        return None
    for cls in element_type.__mro__:
        if cls in mapping:
            return mapping[cls]
    return None


def _value_at(element: Element, path: str) -> Any:
    head, _, rest = path.partition(".")
    value: Any = getattr(element, head, None)
    for part in rest.split(".") if rest else ():
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _attribute_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def _check_paths(mapping: Mapping[type, Any] | None, what: str) -> None:
    for cls, spec in (mapping or {}).items():
        names = set(getattr(cls, "__struct_fields__", ()))
        paths = spec.keys() if isinstance(spec, Mapping) else [spec]
        for path in paths:
            if path.partition(".")[0] not in names:
                raise ValueError(f"xml layout: {what} path {path!r} does not start with a field of {cls.__name__}")


class _XmlSpec(NamedTuple):
    """The settings of one :func:`xml` layout (see its arguments)."""

    fields: Mapping[type, Mapping[str, str]] | None
    tags: Mapping[type, str] | None
    order: Mapping[type, str] | None
    cite: str | None


def xml(
    fields: Mapping[type, Mapping[str, str]] | None = None,
    tags: Mapping[type, str] | None = None,
    order: Mapping[type, str] | None = None,
    cite: str | None = "cite",
) -> Layout:
    """Make the XML layout.

    Args:
        fields: per element class, the attributes to show: path → attribute name, such as
            ``{Document: {"properties.modified": "date"}}``. Applies to subclasses. None shows
            every added field and every ``properties`` key of each class.
        tags: per element class, the tag to use instead of its stored kind.
        order: per element class, the path that orders the parts nested in one whole (such as
            ``{Passage: "properties.chunk_index"}``); parts without a value follow in arrival
            order; elements that do not nest keep arrival order.
        cite: the attribute that holds a source's citation, or None for none.

    Returns:
        The layout function.

    Raises:
        ValueError: a path in ``fields`` or ``order`` does not start with a field of its class.
    """
    _check_paths(fields, "fields")
    _check_paths(order, "order")
    spec = _XmlSpec(fields, tags, order, cite)

    def show(elements: Sequence[Element], numbering: Numbering, tool: str | None, style: CitationStyle | None) -> str:
        children, roots = nest(elements)
        return "\n".join(_render(spec, e, False, frozenset(), children, numbering, style) for e in roots)

    return show


def nest(elements: Sequence[Element]) -> tuple[dict[str, list[Element]], list[Element]]:
    """Which elements nest in which (pure).

    Returns:
        ``(children, roots)``: by whole id, the parts whose whole is among ``elements`` (in
        order), and the elements that nest in none (a whole elsewhere, or none), in order.
    """
    present = {e.id for e in elements}
    children: dict[str, list[Element]] = {}
    roots: list[Element] = []
    for element in elements:
        if element.ref is not None and element.ref in present and element.ref != element.id:
            children.setdefault(element.ref, []).append(element)
        else:
            roots.append(element)
    return children, roots


def sort_parts(parts: list[Element], order: Mapping[type, str] | None) -> list[Element]:
    """The parts of one whole in layout order (pure): those with a value at their class's
    ``order`` path by that value (by its text when values do not compare), then the rest, each
    group in arrival order."""
    keyed: list[tuple[Any, int, Element]] = []
    rest: list[tuple[Any, int, Element]] = []
    for index, part in enumerate(parts):
        path = _nearest(order, type(part))
        value = _value_at(part, path) if path else None
        (keyed if value is not None else rest).append((value, index, part))
    try:
        keyed.sort(key=lambda item: (item[0], item[1]))
    except TypeError:
        keyed.sort(key=lambda item: (str(item[0]), item[1]))
    return [p for _, _, p in keyed] + [p for _, _, p in rest]


def _render(
    spec: _XmlSpec,
    element: Element,
    nested: bool,
    seen: frozenset[str],
    children: dict[str, list[Element]],
    numbering: Numbering,
    style: CitationStyle | None,
) -> str:
    """One element's tag, with its text and its parts nested (each whole once on a path)."""
    tag = tag_of(type(element), spec.tags)
    whole_attr = None
    if not nested and element.ref is not None and element.ref != element.id:
        first = numbering.first(element.ref)
        whole_attr = tag_of(type(first), spec.tags) if first is not None else "ref"
    head = f"<{tag} {_attributes(spec, element, numbering, style, whole_attr)}"
    text = element.text if isinstance(element, Source) else ""
    inner = [escape_text(text)] if text else []
    if element.id not in seen:
        for part in sort_parts(children.get(element.id, []), spec.order):
            inner.append(_render(spec, part, True, seen | {element.id}, children, numbering, style))
    if not inner:
        return head + "/>"
    if len(inner) == 1 and text:
        return f"{head}>{inner[0]}</{tag}>"
    return head + ">\n" + "\n".join(inner) + f"\n</{tag}>"


def _attributes(
    spec: _XmlSpec, element: Element, numbering: Numbering, style: CitationStyle | None, whole_attr: str | None
) -> str:
    """An element's attributes: its number as ``id``, its citation, its whole, then its fields."""
    number = numbering.number(element.id)
    shown_id = str(number) if number is not None else element.id
    reserved = {"id"}
    parts = [f'id="{escape_attribute(shown_id)}"']
    cite = spec.cite
    if cite and style is not None and isinstance(element, Source) and number is not None:
        parts.append(f'{cite}="{escape_attribute(style.cite(number))}"')
        reserved.add(cite)
    if whole_attr is not None and element.ref is not None:
        ref_number = numbering.number(element.ref)
        value = str(ref_number) if ref_number is not None else element.ref
        parts.append(f'{whole_attr}="{escape_attribute(value)}"')
        reserved.add(whole_attr)
    for name, value in field_pairs(element, spec.fields):
        if value is None or value == "":
            continue
        if name in reserved:
            name = f"data-{name}"
        parts.append(f'{name}="{escape_attribute(_attribute_text(value))}"')
    return " ".join(parts)


def field_pairs(element: Element, fields: Mapping[type, Mapping[str, str]] | None) -> list[tuple[str, Any]]:
    """The (attribute name, value) pairs an element's fields show, before empty ones are left
    out (pure): those ``fields`` chooses for its class (nearest); else every added field but the
    hidden ones (an image's bytes), then its ``properties``."""
    chosen = _nearest(fields, type(element))
    if chosen is not None:
        return [(name, _value_at(element, path)) for path, name in chosen.items()]
    hidden = _nearest(_HIDDEN, type(element)) or frozenset()
    pairs = [
        (name, getattr(element, name))
        for name in element.__struct_fields__
        if name not in _BASE_FIELDS and name not in hidden
    ]
    pairs.extend(element.properties.items())
    return pairs


DEFAULT_LAYOUT = xml()
"""The default layout: :func:`xml` with every field, the ``cite`` attribute, stored kinds as tags."""
