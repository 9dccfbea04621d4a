"""The element and event types a trace may hold: the built-in ones and an app's own.

An app registers its own classes (``App(element_types=[...], event_types=[...])``); both are
frozen msgspec Structs with an explicit, stable tag:

- an element class subclasses :class:`~agentstream.wire.events.Element` (or one of its built-in
  subclasses: ``Source``, ``Document``, ``Passage``, ``Image``) and is tagged in the field
  ``kind``, such as ``class Ticket(Source, frozen=True, kw_only=True, tag="ticket")``;
- an event class is tagged in the field ``type``, such as
  ``class Handoff(msgspec.Struct, frozen=True, kw_only=True, tag="handoff")``.

Tags are checked when the app is made: each must be a string given explicitly (``tag=True``
would store the class name, and class names change while stored tags must not), and no two
types, built-in or the app's, may share one.

:func:`check_elements` validates elements a tool returned or a turn carried before they are
stored: a registered type, a non-empty id, and for an image a URL or base64 data of an image
media type within :data:`MAX_IMAGE_BYTES`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import msgspec

from agentstream.errors import ConfigError
from agentstream.wire.events import (
    Document,
    Element,
    Event,
    Image,
    Passage,
    Source,
    UnknownElement,
    UnknownEvent,
)

BUILTIN_ELEMENTS: tuple[type, ...] = (Source, Document, Passage, Image)
"""The built-in element classes (tag field ``kind``)."""

BUILTIN_EVENTS: tuple[type, ...] = get_args(Event)
"""The built-in event classes (tag field ``type``)."""

RESERVED_TAGS = frozenset({UnknownElement.__struct_config__.tag, UnknownEvent.__struct_config__.tag})
"""Tags of the placeholders for stored types this agentstream does not know (never stored)."""

MAX_IMAGE_BYTES = 5 * 1024 * 1024
"""The most bytes (decoded) one image's base64 ``data`` may hold: 5 MiB."""

IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The media types an image's base64 data may have (what both provider formats accept)."""


def tag_of(cls: type) -> str | int | None:
    """The stored tag of a msgspec Struct class (None when it has none).

    Raises:
        ConfigError: ``cls`` is not a msgspec Struct class.
    """
    if not issubclass(cls, msgspec.Struct):
        raise ConfigError(f"{cls!r} is not a msgspec Struct class")
    return cls.__struct_config__.tag


def _check_tagged(cls: Any, *, tag_field: str, what: str) -> str:
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        raise ConfigError(f"{what} {cls!r} is not a msgspec Struct class")
    config = cls.__struct_config__
    tag = config.tag
    if not isinstance(tag, str) or not tag or tag == cls.__name__:
        raise ConfigError(
            f'{what} {cls.__name__} needs an explicit string tag (such as tag="{cls.__name__.lower()}"), '
            f"not {tag!r}: the tag is what the trace stores, and it must outlive the class name"
        )
    if config.tag_field != tag_field:
        raise ConfigError(f"{what} {cls.__name__} is tagged in field {config.tag_field!r}; it must be {tag_field!r}")
    return tag


@dataclass(frozen=True)
class AppTypes:
    """The element and event types of one app, checked: built-in first, then the app's own.

    Args:
        element_types: the app's element classes (subclasses of ``Element``).
        event_types: the app's event classes.

    Raises:
        ConfigError: a class is not a msgspec Struct, is not an ``Element`` (for an element), has
            no explicit string tag, is tagged in the wrong field, or shares its tag with another
            type (built-in or the app's).
    """

    element_types: tuple[type, ...] = ()
    event_types: tuple[type, ...] = ()
    _known_elements: frozenset[type] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "element_types", tuple(dict.fromkeys(self.element_types)))
        object.__setattr__(self, "event_types", tuple(dict.fromkeys(self.event_types)))
        seen: dict[str | int | None, str] = {tag_of(c): f"the built-in element {c.__name__}" for c in BUILTIN_ELEMENTS}
        for cls in self.element_types:
            if not (isinstance(cls, type) and issubclass(cls, Element)):
                raise ConfigError(
                    f"element type {cls!r} must subclass agentstream.wire.events.Element (or Source, Document, ...)"
                )
            if cls in BUILTIN_ELEMENTS:
                continue
            tag = _check_tagged(cls, tag_field="kind", what="element type")
            _no_clash(seen, tag, f"the app's element {cls.__name__}")
        seen = {tag_of(c): f"the built-in event {c.__name__}" for c in BUILTIN_EVENTS}
        for cls in self.event_types:
            if cls in BUILTIN_EVENTS:
                continue
            tag = _check_tagged(cls, tag_field="type", what="event type")
            _no_clash(seen, tag, f"the app's event {cls.__name__}")
        known = frozenset((*BUILTIN_ELEMENTS, *self.element_types))
        object.__setattr__(self, "_known_elements", known)
        object.__setattr__(self, "element_types", tuple(c for c in self.element_types if c not in BUILTIN_ELEMENTS))
        object.__setattr__(self, "event_types", tuple(c for c in self.event_types if c not in BUILTIN_EVENTS))

    @property
    def elements(self) -> tuple[type, ...]:
        """Every element class: the built-in ones, then the app's."""
        return (*BUILTIN_ELEMENTS, *self.element_types)

    @property
    def events(self) -> tuple[type, ...]:
        """Every event class: the built-in ones, then the app's."""
        return (*BUILTIN_EVENTS, *self.event_types)

    def knows_element(self, element: object) -> bool:
        """True when the element's exact class is registered (built-in or the app's)."""
        return type(element) in self._known_elements

    def knows_event(self, event: object) -> bool:
        """True when the event's exact class is registered (built-in or the app's)."""
        return type(event) in BUILTIN_EVENTS or type(event) in self.event_types


def _no_clash(seen: dict[str | int | None, str], tag: str, who: str) -> None:
    if tag in RESERVED_TAGS:
        raise ConfigError(f"{who} uses the tag {tag!r}, which agentstream reserves for stored types it does not know")
    other = seen.get(tag)
    if other is not None:
        raise ConfigError(f"{who} uses the tag {tag!r}, which {other} already has; give one of them another tag")
    seen[tag] = who


NO_APP_TYPES = AppTypes()
"""The types of an app that registers none of its own."""


def check_elements(
    elements: Iterable[object],
    types: AppTypes = NO_APP_TYPES,
    *,
    where: str = "elements",
    max_image_bytes: int = MAX_IMAGE_BYTES,
) -> None:
    """Refuse elements that cannot be stored or shown.

    Args:
        elements: the elements, in order.
        types: the registered types.
        where: what holds them, for the message (``"the result of tool 'search'"``).
        max_image_bytes: the most bytes one image's decoded base64 data may hold.

    Raises:
        ValueError: the message names the element by position and id, and what is wrong: an
            unregistered class, an empty id, an image without a URL or data, with both, with data
            that is not base64, not of an image media type (:data:`IMAGE_MEDIA_TYPES`), or over
            the size limit; or properties that are not JSON-compatible.
    """
    for index, element in enumerate(elements):
        at = f"{where}, element {index}"
        if not types.knows_element(element):
            names = ", ".join(c.__name__ for c in types.elements)
            raise ValueError(
                f"{at} is a {type(element).__name__}, which the app does not register as an element type "
                f"(registered: {names}; add yours to App(element_types=...))"
            )
        assert isinstance(element, Element)
        if not isinstance(element.id, str) or not element.id.strip():
            raise ValueError(f"{at}: its id is empty; give each element a stable id (a URL, a document key)")
        at = f"{at} (id {element.id!r})"
        try:
            msgspec.json.encode(element)
        except (TypeError, msgspec.EncodeError) as exc:
            raise ValueError(f"{at}: it cannot be stored as JSON ({exc}); properties must be JSON-compatible") from None
        if isinstance(element, Image):
            check_image(element, at, max_image_bytes=max_image_bytes)


def check_image(image: Image, at: str, *, max_image_bytes: int = MAX_IMAGE_BYTES) -> None:
    """Refuse an image without a URL or data, with both, or with bad or oversized base64 data.

    Raises:
        ValueError: what is wrong, with ``at`` naming the image.
    """
    if bool(image.url) == bool(image.data):
        raise ValueError(f"{at}: an image needs exactly one of url or data (base64)")
    if image.url:
        if not image.url.startswith(("https://", "http://")):
            raise ValueError(
                f"{at}: the image url must be http(s) (give base64 in data instead), got {image.url[:40]!r}"
            )
        return
    if image.media_type not in IMAGE_MEDIA_TYPES:
        raise ValueError(
            f"{at}: media_type must be one of {sorted(IMAGE_MEDIA_TYPES)} for base64 data, got {image.media_type!r}"
        )
    # decoded size from the length first, so an oversized image is refused without decoding it
    approx = len(image.data) * 3 // 4
    if approx > max_image_bytes + 3:
        raise ValueError(f"{at}: the image holds about {approx} bytes, over the limit of {max_image_bytes}")
    try:
        raw = base64.b64decode(image.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{at}: data is not valid base64") from None
    if len(raw) > max_image_bytes:
        raise ValueError(f"{at}: the image holds {len(raw)} bytes, over the limit of {max_image_bytes}")


def element_union(types: AppTypes) -> Any:
    """The union type of every registered element class (for decoding)."""
    classes: Sequence[type] = types.elements
    union: Any = classes[0]
    for cls in classes[1:]:
        union = union | cls
    return union


def event_union(types: AppTypes) -> Any:
    """The union type of every registered event class (for decoding)."""
    union: Any = Event
    for cls in types.event_types:
        union = union | cls
    return union
