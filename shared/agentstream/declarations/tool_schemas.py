"""Tool schemas as strict endpoints take them: every local ``$ref`` replaced by what it names.

pydantic writes a tool whose arguments nest a model as a schema with ``$defs`` and ``$ref``
(JSON Schema 2020-12, section 8.2.3.1). Some OpenAI-compatible endpoints refuse those keywords
(Gemini's among them: its function declarations take an OpenAPI 3.0 subset without ``$ref``), so
an endpoint with ``inline_tool_schemas: true`` gets each schema with its references inlined and
no ``$defs``. A recursive model (a tree, a linked list) has no finite inlined form: it is refused
at startup (:func:`agentstream.models.endpoints.check_agents`), naming the tool. MCP tools'
schemas are always inlined, with the same function (:mod:`agentstream.mcp_tools.schemas`).

The work is bounded, whatever the schema: a schema whose references each name the next definition
twice inlines to 2^depth nodes (2 KB of an MCP server's listing made a gigabyte), so inlining
stops past :data:`MAX_INLINED_NODES` nodes or :data:`MAX_SCHEMA_DEPTH` levels and refuses the
schema (:class:`SchemaTooLarge`), as it refuses a recursive one. Nothing is copied more than once.

Pure: no I/O; the same schema always gives the same bytes, so fingerprints are reproducible.
"""

from __future__ import annotations

import copy
from typing import Any

from agentstream.errors import ConfigError

DEFS_KEYS = ("$defs", "definitions")
"""Where local definitions live (``definitions``: drafts before 2019-09)."""

MAX_INLINED_NODES = 20_000
"""The most JSON values (objects, arrays, scalars) a schema may have, inlined or as given."""
MAX_SCHEMA_DEPTH = 64
"""The deepest nesting of objects and arrays a schema may have, inlined or as given."""


class UninlinableSchema(ConfigError):
    """A schema's references cannot be inlined.

    Attributes:
        tool: the tool's name.
        reason: what is wrong, for a person ("is recursive (...)", "refers to ..., outside the
            schema", ...), to follow "its schema".
    """

    def __init__(self, tool: str, reason: str, message: str | None = None):
        super().__init__(message or f"tool {tool!r}: its argument schema {reason}")
        self.tool = tool
        self.reason = reason


class RecursiveSchemaError(UninlinableSchema):
    """A schema refers to itself (directly or through other definitions)."""


class SchemaTooLarge(UninlinableSchema):
    """A schema has, or inlines to, more than ``max_nodes`` values or ``max_depth`` levels."""


class _Budget:
    """What inlining may still produce (values), and its limits, for the error's reason."""

    def __init__(self, tool: str, max_nodes: int, max_depth: int) -> None:
        self.tool = tool
        self.left = max_nodes
        self.max_nodes = max_nodes
        self.max_depth = max_depth

    def spend(self, depth: int) -> None:
        self.left -= 1
        if self.left < 0:
            raise SchemaTooLarge(
                self.tool,
                f"has or inlines to more than {self.max_nodes:,} values (its $refs multiply what they name)",
            )
        if depth > self.max_depth:
            raise SchemaTooLarge(self.tool, f"is nested more than {self.max_depth} levels deep, inlined or as given")


def has_refs(node: Any) -> bool:
    """Whether a ``$ref`` occurs anywhere in ``node`` (without recursion: any depth is safe)."""
    todo = [node]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if "$ref" in item:
                return True
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return False


def measure(node: Any) -> tuple[int, int]:
    """``(values, depth)`` of a JSON value: how many values (objects, arrays, scalars, keys not
    counted) and the deepest nesting of objects and arrays (0 for a scalar); without recursion."""
    count = deepest = 0
    todo: list[tuple[Any, int]] = [(node, 0)]
    while todo:
        item, depth = todo.pop()
        count += 1
        if isinstance(item, dict):
            deepest = max(deepest, depth + 1)
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth + 1)
            todo.extend((v, depth + 1) for v in item)
    return count, deepest


def inline_refs(
    schema: dict[str, Any],
    *,
    tool: str,
    max_nodes: int = MAX_INLINED_NODES,
    max_depth: int = MAX_SCHEMA_DEPTH,
) -> dict[str, Any]:
    """A copy of ``schema`` with every local ``$ref`` (a JSON pointer into the schema, such as
    ``#/$defs/Name``) replaced by what it names, and no top-level ``$defs``/``definitions``.

    Keywords beside a ``$ref`` (a ``description``, a ``default``) are kept and win over the
    referenced schema's. A schema without references comes back equal (a copy, less its unused
    definitions).

    Args:
        schema: a tool's parameters schema (as :attr:`agentstream.declarations.tools.Tool.parameters`).
        tool: the tool's name, for the error.
        max_nodes: the most values the schema may have, as given and inlined.
        max_depth: the deepest nesting of objects and arrays, as given and inlined.

    Raises:
        SchemaTooLarge: the schema, as given or inlined, is over ``max_nodes`` or ``max_depth``
            (checked as it grows: the work stops there).
        RecursiveSchemaError: a reference leads back to itself; the reason names the chain.
        UninlinableSchema: a reference outside the schema, to something it does not define, or
            to something that is not a schema object.
    """
    nodes, depth = measure(schema)
    if nodes > max_nodes or depth > max_depth:
        what = f"{nodes:,} values" if nodes > max_nodes else f"{depth} levels of nesting"
        raise SchemaTooLarge(tool, f"has {what}, over the limit of {max_nodes:,} values and {max_depth} levels")
    root = copy.deepcopy(schema)
    if has_refs(root):
        root = _inline(tool, root, root, (), _Budget(tool, max_nodes, max_depth), 0)
    for key in DEFS_KEYS:
        root.pop(key, None)
    return root


def _resolve(tool: str, root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        raise UninlinableSchema(tool, f"refers to {ref!r}, outside the schema; only local references can be inlined")
    node: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")  # JSON pointer escapes (RFC 6901)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise UninlinableSchema(tool, f"refers to {ref!r}, which it does not define")
    return node


def _inline(tool: str, node: Any, root: dict[str, Any], seen: tuple[str, ...], budget: _Budget, depth: int) -> Any:
    """``node`` with every ``$ref`` replaced (``seen``: the references being inlined, outermost
    first); each value made is paid from ``budget``. It builds new objects and arrays and never
    changes ``node``, so what a reference names is not copied first."""
    budget.spend(depth)
    if isinstance(node, list):
        return [_inline(tool, item, root, seen, budget, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in seen:
            loop = " -> ".join((*seen[seen.index(ref) :], ref))
            raise RecursiveSchemaError(tool, f"is recursive ({loop})")
        target = _inline(tool, _resolve(tool, root, ref), root, (*seen, ref), budget, depth)
        if not isinstance(target, dict):
            raise UninlinableSchema(tool, f"refers to {ref!r}, which is not a schema object")
        siblings = {k: _inline(tool, v, root, seen, budget, depth + 1) for k, v in node.items() if k != "$ref"}
        merged = {k: v for k, v in target.items() if k not in DEFS_KEYS}
        merged.update(siblings)
        return merged
    return {k: (v if k in DEFS_KEYS else _inline(tool, v, root, seen, budget, depth + 1)) for k, v in node.items()}


def check_inlinable(tool: str, schema: dict[str, Any]) -> None:
    """Raise when ``schema`` cannot be inlined (see :func:`inline_refs`): a startup check.

    Raises:
        UninlinableSchema: the message names the tool, what is wrong, and the two ways out.
    """
    try:
        inline_refs(schema, tool=tool)
    except UninlinableSchema as exc:
        raise type(exc)(
            tool,
            exc.reason,
            f"tool {tool!r}: its argument schema {exc.reason}, so it cannot be sent to an endpoint with "
            "inline_tool_schemas: make its model non-recursive (or local), or turn inline_tool_schemas off "
            "for that endpoint",
        ) from None
