"""Element numbering: the numbers under which the model sees the elements of a trace.

The model never sees an element's real id: each element gets a number, in the order elements
first appear in the trace (inputs and tool results), and keeps it for the whole trace. So a
selection of events, a shrink or a compaction never renumbers anything, and a citation ``[7]``
means the same element in every later call.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentstream.errors import UnrenderedEventError
from agentstream.wire.events import AnyElement, Element, Image, Source, ToolOutput, TurnInput, UnknownElement


class Numbering:
    """Element id → number (1, 2, …), in order of first appearance; append-only.

    Also remembers, for each id, the element first recorded under it and the tool that recorded
    it (None for an input), which the reopen tool and the layout's references need.
    """

    __slots__ = ("_numbers", "_ids", "_first", "_tool")

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}
        # by number - 1: the id, the element first recorded under it, the tool that recorded it
        self._ids: list[str] = []
        self._first: list[AnyElement] = []
        self._tool: list[str | None] = []

    def copy(self) -> Numbering:
        """An independent copy."""
        other = Numbering()
        other._numbers = dict(self._numbers)
        other._ids = list(self._ids)
        other._first = list(self._first)
        other._tool = list(self._tool)
        return other

    def add(self, elements: Iterable[AnyElement | UnknownElement], tool: str | None) -> None:
        """Number the elements not numbered yet (in the order given).

        Raises:
            UnrenderedEventError: an element is an :class:`~agentstream.wire.events.UnknownElement`
                (a stored kind the app does not register): it cannot be shown, nor skipped.
        """
        numbers = self._numbers
        for element in elements:
            if isinstance(element, UnknownElement):
                where = f"a result of tool {tool!r}" if tool else "an input"
                raise UnrenderedEventError(
                    f"{where} holds an element of kind {element.stored_kind!r} (id {element.id!r}), which this app "
                    "does not register: add its class to App(element_types=...)"
                )
            element_id = element.id
            if element_id not in numbers:
                numbers[element_id] = len(numbers) + 1
                self._ids.append(element_id)
                self._first.append(element)
                self._tool.append(tool)

    def add_event(self, event: object) -> None:
        """Number the elements of an input or a tool result; other events carry none."""
        if isinstance(event, TurnInput):
            if event.elements:
                self.add(event.elements, None)
        elif isinstance(event, ToolOutput):
            if event.elements:
                self.add(event.elements, event.name)

    def number(self, element_id: str) -> int | None:
        """The number of an element id, or None when it was never recorded."""
        return self._numbers.get(element_id)

    def element_id(self, number: int) -> str | None:
        """The element id under a number, or None."""
        ids = self._ids
        if type(number) is int:
            return ids[number - 1] if 0 < number <= len(ids) else None
        try:  # any number equal to an int (True, 2.0) names that element, as a dict key would
            if 0 < number <= len(ids) and number == int(number):
                return ids[int(number) - 1]
        except (TypeError, ValueError, OverflowError):
            pass
        return None

    @property
    def ids(self) -> dict[int, str]:
        """Number → element id (a copy)."""
        return dict(enumerate(self._ids, 1))

    def first(self, element_id: str) -> AnyElement | None:
        """The element as first recorded under this id, or None."""
        number = self._numbers.get(element_id)
        return self._first[number - 1] if number is not None else None

    def tool_of(self, element_id: str) -> str | None:
        """The tool whose result first recorded the element (None for an input or unknown)."""
        number = self._numbers.get(element_id)
        return self._tool[number - 1] if number is not None else None

    def __len__(self) -> int:
        return len(self._numbers)


def is_citable(element: Element) -> bool:
    """True for sources (text the model may cite); images and other elements are not."""
    return isinstance(element, Source)


def images_of(elements: Iterable[Element]) -> tuple[Image, ...]:
    """The images among elements, in order."""
    return tuple(e for e in elements if isinstance(e, Image))
