"""Every failure code agentstream writes, in one enumeration: a wire contract.

A turn that ends without an answer ends with :class:`~agentstream.wire.events.TurnFailed`
(``code``, ``reason``) and its reply carries the same ``code``; a compaction that could not be
made is recorded as :class:`~agentstream.wire.events.CompactionFailed` with one of its two codes.
Backends branch on these strings, so they are stable: a member's value never changes, a new
cause gets a new member (and a line in CHANGELOG.md). :class:`FailureCode` is a
:class:`~enum.StrEnum`, so a member *is* its string: stored events and replies hold the same
text as before the enumeration existed, and ``FailureCode.BUSY == "busy"``.

An app may end a turn with a code of its own (its settings function raises
``TurnDenied(reason, code=...)``), so a reader must accept any string; the JSON schemas
(``agentstream schema reply``, ``agentstream schema events``) name these codes as the known ones
(:func:`with_failure_codes`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class FailureCode(StrEnum):
    """The ``code`` of a :class:`~agentstream.wire.events.TurnFailed` (and of its reply), or of a
    :class:`~agentstream.wire.events.CompactionFailed` where said."""

    BAD_TURN = "bad_turn"
    """The turn breaks a rule of the wire, or asks for a model or a tool the agent does not allow."""
    UNKNOWN_AGENT = "unknown_agent"
    """The turn names an agent the app does not have."""
    INPUT_DENIED = "input_denied"
    """The agent's settings function refused the turn (``TurnDenied``'s default code)."""
    FORBIDDEN = "forbidden"
    """An admin command while admin commands are off; or a backend's turn (or cancel) that names
    another backend's conversation or replies stream (:mod:`agentstream.wire.backends`)."""
    CONFIG = "config"
    """The agent's settings for the turn, or its model id, are not valid."""
    BUSY = "busy"
    """Another turn of the conversation was running and the turn's policy is ``reject``."""
    CANCELLED = "cancelled"
    """Someone cancelled the turn (a cancel request, or an interrupting turn)."""
    DEADLINE = "deadline"
    """The turn, or one of its model calls, ran past its deadline."""
    MODEL_ERROR = "model_error"
    """A model call failed (no answer after the retries, a refused request, unstorable output)."""
    REFUSAL = "refusal"
    """The model refused to answer."""
    CONTENT_FILTER = "content_filter"
    """The provider's content filter stopped the reply."""
    PAUSE = "pause"
    """The provider paused the reply (continuing a paused turn is not supported)."""
    INTERRUPTED = "interrupted"
    """The reply was interrupted before it completed."""
    UNKNOWN = "unknown"
    """The model stopped for a reason agentstream does not know."""
    CUT_OFF = "cut_off"
    """The output token limit cut the reply off before any answer."""
    EMPTY_REPLY = "empty_reply"
    """The model gave empty replies, again after the retry."""
    PASSES_CAP = "passes_cap"
    """The model kept calling tools past the agent's passes cap."""
    CONTEXT = "context"
    """The context library could not build the request."""
    CONTEXT_FULL = "context_full"
    """The context does not fit the model's window even after every shrink."""
    PROMPT = "prompt"
    """The agent's system prompt could not be written (its function or template failed)."""
    COMPACTION_ERROR = "compaction_error"
    """The compaction's summary was empty or replaced nothing (also a CompactionFailed code)."""
    SUMMARY_FAILED = "summary_failed"
    """CompactionFailed only: the summary call failed; the turn goes on with history trimmed."""
    TOOLS_UNAVAILABLE = "tools_unavailable"
    """The agent's MCP servers could not list their tools."""
    TIMED_OUT = "timed_out"
    """A subagent did not finish within its deadline; the supervisor ended it."""
    DEAD_LETTER = "dead_letter"
    """A hint of the turn kept failing and went to the dead-letter stream."""
    LOST_WORK = "lost_work"
    """The watchdog found work of the turn that no worker will finish."""


CODE_HOLDERS = ("TurnFailed", "CompactionFailed", "Reply")
"""The wire types whose ``code`` field holds a :class:`FailureCode` (or an app's own code)."""


def with_failure_codes(schema: dict[str, Any]) -> dict[str, Any]:
    """Make the ``code`` of every :data:`CODE_HOLDERS` definition in ``schema`` name the known codes.

    Adds ``$defs/FailureCode`` (an ``enum`` of every :class:`FailureCode` value) and gives each
    holder's ``code`` ``anyOf: [{"$ref": "#/$defs/FailureCode"}, {"type": "string"}]``: one of the
    known codes, or an app's own. A nullable code (the reply's) keeps ``null`` allowed.

    Args:
        schema: a JSON schema (2020-12) from :func:`msgspec.json.schema`, with its ``$defs``.

    Returns:
        ``schema``, changed in place.
    """
    defs = schema.setdefault("$defs", {})
    defs["FailureCode"] = {
        "title": "FailureCode",
        "description": "the failure codes agentstream writes (agentstream.wire.failures.FailureCode)",
        "enum": [code.value for code in FailureCode],
    }
    for name in CODE_HOLDERS:
        holder = defs.get(name)
        if holder is None or "code" not in holder.get("properties", {}):
            continue
        nullable = "null" in str(holder["properties"]["code"])
        choices: list[dict[str, Any]] = [
            {"$ref": "#/$defs/FailureCode"},
            {"type": "string", "description": "an app's own code (TurnDenied(code=...))"},
        ]
        if nullable:
            choices.append({"type": "null"})
        holder["properties"]["code"] = {"anyOf": choices}
    return schema
