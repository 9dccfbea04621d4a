"""The published JSON schemas of the trace: every stored event and element, built-in and an app's.

A backend that follows a trace with ``XREAD`` reads entries with two fields, ``v`` (the trace
schema version, :data:`~agentstream.wire.events.TRACE_SCHEMA_VERSION`) and ``e`` (one event's JSON);
:func:`trace_events_schema` is the JSON Schema (draft 2020-12) of ``e`` at that version, printed
by ``agentstream schema events [--app mod:app]``. Events are tagged by their ``type`` field and
elements by their ``kind`` field; the ``elements`` of inputs and tool results may hold any element
of the schema, the app's included. New fields only ever come with defaults (msgspec's
schema-evolution rules), so a reader of version N reads every entry of version N.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentstream.wire.events import TRACE_SCHEMA_VERSION
from agentstream.wire.failures import with_failure_codes
from agentstream.wire.registry import NO_APP_TYPES, AppTypes, element_union, event_union, tag_of

_HOLDERS = ("TurnInput", "TaskInput", "ToolOutput")


def trace_events_schema(types: AppTypes = NO_APP_TYPES) -> dict[str, Any]:
    """The JSON Schema (2020-12) of a trace entry's event, for the built-in types and ``types``.

    Returns:
        A schema whose root accepts any stored event (``anyOf`` over the event definitions in
        ``$defs``), with ``x-agentstream-trace-schema-version``, and the tags of every event and
        element type under ``x-agentstream-events`` and ``x-agentstream-elements``
        (tag → definition name).
    """
    events = event_union(types)
    elements = element_union(types)
    (event_ref, element_ref), defs = msgspec.json.schema_components([events, elements], ref_template="#/$defs/{name}")
    element_refs = element_ref.get("anyOf", [element_ref])
    for name in _HOLDERS:
        holder = defs.get(name)
        if holder is not None and "elements" in holder.get("properties", {}):
            holder["properties"]["elements"]["items"] = {"anyOf": element_refs}
    return with_failure_codes(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"urn:agentstream:trace-events:v{TRACE_SCHEMA_VERSION}",
            "title": f"agentstream trace event, schema version {TRACE_SCHEMA_VERSION}",
            "description": (
                "The JSON in the field `e` of an entry of a trace stream (`agentstream:trace:{<trace id>}`); the "
                f"field `v` holds the schema version ({TRACE_SCHEMA_VERSION}). Events are tagged by `type`, "
                "elements by `kind`."
            ),
            "x-agentstream-trace-schema-version": TRACE_SCHEMA_VERSION,
            "x-agentstream-events": {tag_of(cls): cls.__name__ for cls in types.events},
            "x-agentstream-elements": {tag_of(cls): cls.__name__ for cls in types.elements},
            "anyOf": event_ref.get("anyOf", [event_ref]),
            "$defs": defs,
        }
    )
