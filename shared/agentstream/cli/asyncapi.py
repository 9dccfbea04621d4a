"""The AsyncAPI 3.0 document of agentstream's public channels, made with FastStream's AsyncAPI
support (``faststream.specification.AsyncAPI``), printed by ``agentstream schema asyncapi``.

The public channels are the Redis streams a backend in any language (or a FastStream app with
its own broker) writes or reads:

========================================  ==========  ==============================================
stream                                    field       who writes it
========================================  ==========  ==============================================
``<ns>:turns``                            ``turn``    backends: a turn (the agent loop consumes it)
``<ns>:replies`` (or a turn's reply_to)   ``reply``   the agent loop, when a turn ends
``<ns>:cancel``                           ``cancel``  backends: stop a conversation's running turn
``<ns>:backends:<b>:turns``, ``:cancel``,  as above  backend ``b`` (AGENTSTREAM_BACKENDS), confined
``:approvals``
``<ns>:approvals``                        approval    backends: approve or deny a tool call that waits
``<ns>:errors``                           ``error``   the services: an entry they could not read
``<ns>:trace:{<trace id>}``               ``e``, v    the services: every event of a conversation
``<ns>:trace:{<trace id>}:deltas``        ``d``       the agent loop: the reply's pieces as written
========================================  ==========  ==============================================

Each entry's field holds JSON text; its JSON schema (from the msgspec types the services decode
with) is in ``components.schemas`` and named by the field's ``contentSchema``. FastStream's own
envelope is not used anywhere: agentstream's wire is plain JSON fields, so a backend needs no
FastStream to speak it (a FastStream app publishes with ``broker.publish(..., stream=...)`` of
a dict of fields, see ``tests/e2e/test_faststream_backend.py``). The document is built from an
unconnected broker: nothing is sent.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, Field

from agentstream.wire.deltas import Delta
from agentstream.wire.events import ApprovalMessage, CancelMessage, Event, Reply, TurnMessage
from agentstream.wire.keys import AGENT_LOOP_GROUP, Keys

_CONTENT = "x-agentstream-content-schema"  # replaced by contentSchema after generation (see _link)


def _json_field(schema_name: str, description: str) -> Any:
    """A string field that holds the JSON of ``schema_name`` (use as ``Annotated[str, _json_field(...)]``)."""
    return Field(
        description=description, json_schema_extra={"contentMediaType": "application/json", _CONTENT: schema_name}
    )


class TurnEntry(BaseModel):
    """An entry of the turns stream."""

    turn: Annotated[
        str, _json_field("TurnMessage", "The turn as JSON (see TurnMessage); a turn published twice runs once.")
    ]


class ReplyEntry(BaseModel):
    """An entry of the replies stream (or a turn's reply_to); at-least-once: dedupe by turn_id."""

    reply: Annotated[str, _json_field("Reply", "The reply as JSON (see Reply).")]


class CancelEntry(BaseModel):
    """An entry of the cancel stream."""

    cancel: Annotated[str, _json_field("CancelMessage", "The cancel request as JSON (see CancelMessage).")]


class ApprovalEntry(BaseModel):
    """An entry of the approvals stream."""

    approval: Annotated[
        str,
        _json_field(
            "ApprovalMessage", "The approval or denial as JSON (see ApprovalMessage); recorded once per call id."
        ),
    ]


class ErrorEntry(BaseModel):
    """An entry of the errors stream: a message the services could not read, reported instead of stalling."""

    error: Annotated[str, Field(description="What was wrong with it, for a person.")]
    payload: Annotated[str, Field(description="The entry's payload as it was received (capped).")] = ""


class TraceEntry(BaseModel):
    """An entry of a trace: one event of the conversation, appended once."""

    v: Annotated[str, Field(description="The trace schema version the event was written with.")]
    e: Annotated[str, _json_field("Event", "The event as JSON, tagged by its `type` field (see Event).")]


class DeltaEntry(BaseModel):
    """An entry of a trace's delta stream: one piece of a model reply as it is written (short-lived)."""

    d: Annotated[
        str, _json_field("Delta", "The piece as JSON (see Delta); drop pieces of an attempt that a later one replaced.")
    ]


def _schemas() -> dict[str, Any]:
    (_, components) = msgspec.json.schema_components(
        [TurnMessage, Reply, CancelMessage, ApprovalMessage, Event, Delta], ref_template="#/components/schemas/{name}"
    )
    # the tagged union of events, by name, as the trace entries reference it
    event_refs = msgspec.json.schema_components([Event], ref_template="#/components/schemas/{name}")[0][0]
    components["Event"] = {"description": "An event of a trace (the union of every event type).", **event_refs}
    return components


def _link(node: Any) -> Any:
    """Turn each placeholder into ``contentSchema: {$ref: ...}`` (pydantic refuses refs it does not
    own), and each OpenAPI-style discriminator object (msgspec's) into AsyncAPI's: the property name."""
    if isinstance(node, dict):
        out = {k: _link(v) for k, v in node.items() if k != _CONTENT}
        if isinstance(out.get("discriminator"), dict):
            out["discriminator"] = out["discriminator"]["propertyName"]
        if _CONTENT in node:
            out["contentSchema"] = {"$ref": f"#/components/schemas/{node[_CONTENT]}"}
        return out
    if isinstance(node, list):
        return [_link(v) for v in node]
    return node


def asyncapi_document(keys: Keys | None = None, *, server: str = "redis://localhost:6379") -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document (a dict) of the public channels under ``keys``' namespace.

    Args:
        keys: the key names (default namespace ``agentstream``).
        server: the Redis URL shown as the document's server (credentials never belong here).
    """
    from importlib.metadata import PackageNotFoundError, version

    from faststream.redis import RedisBroker, StreamSub
    from faststream.specification import AsyncAPI

    keys = keys or Keys()
    broker = RedisBroker(server, description="The Redis of the agentstream services (REDIS_URL).")

    @broker.subscriber(
        stream=StreamSub(keys.turns, group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.turns,
        description="Turns in: XADD a `turn` field of JSON (TurnMessage). The agent loop consumes it in consumer group "
        f"`{AGENT_LOOP_GROUP}`; a malformed turn gets a failed reply (code bad_turn) or an entry on {keys.errors}. "
        "With AGENTSTREAM_PARTITIONS = N above 1 this is partition 0: a turn goes to its trace's partition, "
        f"`{keys.turns}:p<k>` with k = CRC-32(UTF-8 trace id) mod N (0: this stream); see `agentstream partition`.",
    )
    async def turns(entry: TurnEntry) -> None:  # pragma: no cover - a description, never run
        ...

    @broker.subscriber(
        stream=StreamSub(keys.cancel, group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.cancel,
        description="Cancel requests in: XADD a `cancel` field of JSON (CancelMessage); the running turn of the trace "
        "ends with turn_failed code cancelled.",
    )
    async def cancels(entry: CancelEntry) -> None:  # pragma: no cover
        ...

    @broker.subscriber(
        stream=StreamSub(keys.backend_turns("{backend}"), group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.backend_turns("{backend}"),
        description="Turns in from one backend named in AGENTSTREAM_BACKENDS (the parameter `backend`), partitioned as "
        f"{keys.turns}: as that stream, but a turn may name only trace ids that begin with `<backend>:` and the reply "
        f"streams {keys.backend_replies('{backend}')} and {keys.backend_replies('{backend}')}:* (without reply_to it is "
        f"answered on {keys.backend_replies('{backend}')}); any other fails with code forbidden on that stream. "
        "A Redis ACL lets only that backend write it (docs/how-to/acls.md).",
    )
    async def backend_turns(entry: TurnEntry) -> None:  # pragma: no cover
        ...

    @broker.subscriber(
        stream=StreamSub(keys.backend_cancel("{backend}"), group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.backend_cancel("{backend}"),
        description="Cancel requests in from one backend named in AGENTSTREAM_BACKENDS: only of its own "
        "conversations (trace ids that begin with `<backend>:`; any other is refused, reported on "
        f"{keys.errors}); the cancel's `by` is the backend's name, whatever the message says.",
    )
    async def backend_cancels(entry: CancelEntry) -> None:  # pragma: no cover
        ...

    @broker.subscriber(
        stream=StreamSub(keys.approvals, group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.approvals,
        description="Approvals and denials in: XADD an `approval` field of JSON (ApprovalMessage) for a tool call the "
        "trace records as awaiting one (event approval_awaited). The first decision of a call is appended to the "
        "trace (approval_decided) and wakes the turn; an approved call runs once, a denied one gets an error result "
        f"the model sees. `by` is the publisher's word on this stream. A message that cannot be read, or is refused (no such "
        "call awaiting approval, its turn ended, edited arguments the tool does not allow or that do not match its "
        f"schema), is reported on {keys.errors}; a second decision of a decided call changes nothing and is not reported.",
    )
    async def approvals(entry: ApprovalEntry) -> None:  # pragma: no cover
        ...

    @broker.subscriber(
        stream=StreamSub(keys.backend_approvals("{backend}"), group=AGENT_LOOP_GROUP, consumer="agent-loop"),
        title=keys.backend_approvals("{backend}"),
        description="Approvals and denials in from one backend named in AGENTSTREAM_BACKENDS: as the shared "
        f"{keys.approvals}, but only of its own conversations' calls (trace ids that begin with `<backend>:`; any other "
        f"is refused, reported on {keys.errors}); the decision's `by` is `<backend>/<by>` (or the backend's name "
        "without one): the backend it came from cannot be forged.",
    )
    async def backend_approvals(entry: ApprovalEntry) -> None:  # pragma: no cover
        ...

    broker.publisher(
        stream=keys.replies,
        title=keys.replies,
        schema=ReplyEntry,
        description="Replies out, one per ended turn (status ended with answer, or failed with code and reason); "
        "at-least-once: dedupe by turn_id. A turn's reply_to names another reply stream of yours.",
    )
    broker.publisher(
        stream=keys.errors,
        title=keys.errors,
        schema=ErrorEntry,
        description="Entries the services could not read (no trace or turn id to reply to), reported instead of stalling.",
    )
    broker.publisher(
        stream=keys.trace("trace_id"),
        title=keys.trace("trace_id"),
        schema=TraceEntry,
        description="The trace of one conversation: every event, appended once, never trimmed by the runtime. "
        "Follow it with XREAD from the last id you read.",
    )
    broker.publisher(
        stream=keys.deltas("trace_id"),
        title=keys.deltas("trace_id"),
        schema=DeltaEntry,
        description="The pieces of each model reply as it is written (capped with MAXLEN ~, expiring).",
    )
    try:
        ours = version("agentstream")
    except PackageNotFoundError:
        ours = "0.0.0"
    spec = AsyncAPI(
        broker,
        title="agentstream",
        version=ours,
        description="LLM agents as services over Redis Streams: the public channels of the wire format.",
        schema_version="3.0.0",
    ).to_specification()
    document = _link(json.loads(spec.to_json()))
    document.setdefault("components", {}).setdefault("schemas", {}).update(_link(_schemas()))
    for channel in document.get("channels", {}).values():
        if "{trace_id}" in channel.get("address", ""):
            # the hash tag of the trace's keys is the AsyncAPI channel parameter
            channel["parameters"] = {"trace_id": {"description": "The conversation's trace id (the turn's trace_id)."}}
    return document
