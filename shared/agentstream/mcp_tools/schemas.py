"""Input schemas from MCP servers, made fit for the model endpoints (pure).

MCP servers list tools with any JSON Schema (draft 2020-12 by default); the model providers take
a subset. What several of them reject, and what this module does about it:

- ``$ref`` (with ``$defs`` / ``definitions``): Gemini's OpenAI-compatible API and several
  proxies refuse references. Local references (``#/...``) are inlined; a recursive or a remote
  reference cannot be, so the tool is refused (keyword ``$ref``).
- ``anyOf`` / ``oneOf`` / ``allOf`` / ``not`` / ``enum`` at the top: OpenAI and Anthropic want an
  object schema there; the tool is refused naming the keyword.
- a missing ``type``: OpenAI and Anthropic require ``"type": "object"`` at the top; a schema that
  describes an object (it has ``properties``, or constrains nothing) gets it, a nullable object
  (``["object", "null"]``) becomes ``object``; any other type is refused (keyword ``type``).
- ``$schema`` and ``$id`` at the top are dropped (metadata only; some endpoints refuse unknown
  keys), and an object without ``properties`` gets ``"properties": {}``.

- size: a schema over :data:`MAX_SCHEMA_BYTES` of JSON, or that has or inlines to more than
  :data:`~agentstream.declarations.tool_schemas.MAX_INLINED_NODES` values or
  :data:`~agentstream.declarations.tool_schemas.MAX_SCHEMA_DEPTH` levels, is refused (keyword
  ``inputSchema``): the work on what a server lists is bounded, whatever it lists.

A refused tool is not offered; :class:`SchemaRefused` names the tool, the keyword and why, and
the tool workers log it at startup and publish it with the server's catalog.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentstream.declarations.tool_schemas import (
    MAX_INLINED_NODES,
    MAX_SCHEMA_DEPTH,
    RecursiveSchemaError,
    SchemaTooLarge,
    UninlinableSchema,
    inline_refs,
    measure,
)
from agentstream.errors import ConfigError

_TOP_COMBINATORS = ("anyOf", "oneOf", "allOf", "not", "enum", "const")

MAX_SCHEMA_BYTES = 256 * 1024
"""The largest input schema offered, in bytes of its JSON."""


class SchemaRefused(ConfigError):
    """A tool's input schema cannot be made fit for the model endpoints.

    Attributes:
        tool: the tool's name.
        keyword: the JSON Schema keyword at fault (``$ref``, ``anyOf``, ``type``, ...).
        reason: what is wrong, for a person.
    """

    def __init__(self, tool: str, keyword: str, reason: str):
        super().__init__(f"tool {tool!r} is refused: its input schema {reason} (keyword {keyword!r})")
        self.tool = tool
        self.keyword = keyword
        self.reason = reason


def _check_size(tool: str, schema: Mapping[str, Any]) -> None:
    """Refuse a schema over the limits as given (values and depth first: JSON of any depth is safe to count)."""
    values, depth = measure(schema)
    if values > MAX_INLINED_NODES or depth > MAX_SCHEMA_DEPTH:
        raise SchemaRefused(
            tool,
            "inputSchema",
            f"has {values:,} values nested {depth} levels deep, over the limit of {MAX_INLINED_NODES:,} values "
            f"and {MAX_SCHEMA_DEPTH} levels",
        )
    size = len(json.dumps(schema, ensure_ascii=False, default=str).encode())
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(tool, "inputSchema", f"is {size:,} bytes of JSON, over the limit of {MAX_SCHEMA_BYTES:,}")


def normalise_input_schema(tool: str, schema: Any) -> dict[str, Any]:
    """A copy of ``schema`` that the model endpoints accept (see the module docstring).

    Args:
        tool: the tool's name (for the error).
        schema: the ``inputSchema`` the server listed.

    Returns:
        A new dict: references inlined, ``type: object`` at the top.

    Raises:
        SchemaRefused: the schema is not an object, is too large (as given or inlined), has a
            combinator at the top, or has a recursive or remote reference.
    """
    if not isinstance(schema, Mapping):
        raise SchemaRefused(tool, "inputSchema", f"is a {type(schema).__name__}, not a JSON object")
    _check_size(tool, schema)
    try:
        root = inline_refs(dict(schema), tool=tool)
    except SchemaTooLarge as exc:
        raise SchemaRefused(tool, "inputSchema", exc.reason) from None
    except RecursiveSchemaError as exc:
        raise SchemaRefused(tool, "$ref", f"{exc.reason}, so it cannot be inlined") from None
    except UninlinableSchema as exc:
        raise SchemaRefused(tool, "$ref", exc.reason) from None
    for meta in ("$schema", "$id"):
        root.pop(meta, None)
    for keyword in _TOP_COMBINATORS:
        if keyword in root:
            raise SchemaRefused(
                tool, keyword, f"has {keyword!r} at the top; the endpoints take one object schema there"
            )
    kind = root.get("type")
    if kind is None:
        structural = {"items", "prefixItems", "minimum", "maximum", "pattern", "minLength", "maxLength", "format"}
        if structural & set(root):
            raise SchemaRefused(tool, "type", "has no 'type' and does not describe an object")
        root = {"type": "object", **root}
    elif isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if others != ["object"]:
            raise SchemaRefused(tool, "type", f"has type {kind!r}; the endpoints take an object")
        root["type"] = "object"
    elif kind != "object":
        raise SchemaRefused(tool, "type", f"has type {kind!r}; the endpoints take an object")
    root.setdefault("properties", {})
    if not isinstance(root["properties"], Mapping):
        raise SchemaRefused(tool, "properties", "has 'properties' that is not a JSON object")
    return root
