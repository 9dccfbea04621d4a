"""The gateway's HTTP shapes (pydantic models: they make its OpenAPI document).

The wire's own messages are not among them: the turn a client publishes is the wire's
``TurnMessage`` (validated by the wire's decoder) and the reply is the wire's ``Reply`` (encoded
by the wire's encoder); their msgspec JSON schemas are put into the document as they are. A dead
letter is :class:`agentstream.runtime.deadletters.DeadLetter` itself (a dataclass pydantic reads). One
source of truth each: a field added there is in the HTTP API too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentstream.runtime.deadletters import DeadLetter
from agentstream.wire.events import APPROVAL_REASON_MAX_CHARS, CANCEL_REASON_MAX_CHARS

ID_NOTE = (
    "At most AGENTSTREAM_MAX_ID_BYTES UTF-8 bytes (default 256), not only whitespace, no control characters: "
    "the wire's rule for ids (422 otherwise)."
)


class Problem(BaseModel):
    """An error: what was wrong, for a person."""

    detail: str


class TurnAccepted(BaseModel):
    """A turn published on the turns stream."""

    trace_id: str
    turn_id: str
    entry_id: str = Field(description="Its entry id on the turns stream.")
    reply_url: str = Field(description="Long-poll here for the reply.")
    stream_url: str = Field(description="Follow the turn here as server-sent events.")


class Pending(BaseModel):
    """The turn had not ended when the long-poll's time ran out: ask again."""

    trace_id: str
    turn_id: str
    status: Literal["running"] = "running"


class CancelIn(BaseModel):
    """A cancel request. Without ``turn_id``, the turn running now is cancelled."""

    turn_id: str = Field(default="", description=ID_NOTE)
    reason: str = Field(default="", max_length=CANCEL_REASON_MAX_CHARS)


class ApprovalIn(BaseModel):
    """An approval or a denial of a tool call that awaits one (its ``approval_awaited`` event).

    Strict, as the approvals stream's decoder is: ``"approved": "yes"`` is refused (422), never
    read as true."""

    model_config = ConfigDict(extra="forbid", strict=True)

    call_id: str = Field(min_length=1, description=ID_NOTE)
    approved: bool
    reason: str = Field(default="", max_length=APPROVAL_REASON_MAX_CHARS)
    arguments: dict[str, Any] | None = Field(
        default=None, description="Run the call with these arguments instead, where its tool allows it."
    )


class ApprovalAccepted(BaseModel):
    """An approval or denial published on the approvals stream; the trace records it once per
    call (``approval_decided``, with ``by`` the gateway key's name) and the turn goes on."""

    trace_id: str
    call_id: str
    by: str
    entry_id: str


class CancelAccepted(BaseModel):
    """A cancel request published on the cancel stream."""

    trace_id: str
    turn_id: str
    entry_id: str


class ConversationOut(BaseModel):
    """A conversation and the state of its newest turn (see ``agentstream.steps.timeline``)."""

    trace_id: str
    agent: str
    turn_id: str
    state: Literal["running", "waiting_on_tools", "ended", "failed", "cancelled"]
    text: str = ""
    answer: str = ""
    code: str = ""
    reason: str = ""
    turns: int = 0
    updated_ms: int = 0
    pending_tools: list[str] = []
    metadata: dict[str, str] = Field(default={}, description="The newest turn's metadata.")


class ConversationList(BaseModel):
    conversations: list[ConversationOut]
    next_before_ms: int | None = Field(
        default=None,
        description="Pass as before_ms (with the same filters) for the next, older page; null when none is left.",
    )


class TraceEvent(BaseModel):
    """One stored event: its entry id and the event's JSON (with its ``type`` tag)."""

    id: str
    event: dict[str, Any]


class TraceOut(BaseModel):
    trace_id: str
    root_trace_id: str
    events: list[TraceEvent]
    next_after: str | None = Field(default=None, description="Pass as after for the next page (more events).")
    children: list[str] = Field(default=[], description="Child traces (subagent runs) opened by this trace's calls.")
    state: ConversationOut | None = None


class Explanation(BaseModel):
    """One model call's exact request, rebuilt from the trace, and why each result was shortened."""

    trace_id: str
    turn_id: str
    step: int
    call: int
    made: bool
    recorded_sha256: str
    rebuilt_sha256: str
    matches: bool | None
    size_tokens: int | None
    window_tokens: int | None
    body: dict[str, Any]
    shrunk: list[str]
    endpoint: str | None = Field(default=None, description="The endpoint settings that rendered the body.")
    forked_from: str | None = Field(default=None, description="Where the trace was forked from (a fork only).")
    left_out: list[str] = Field(
        default_factory=list, description="Rolled-back turns this call's context leaves out (busy policy rollback)."
    )


class DeadLetterList(BaseModel):
    dead_letters: list[DeadLetter] = Field(description="Newest first (``agentstream.runtime.deadletters.DeadLetter``).")
    next_before: str | None = None


class AgentOut(BaseModel):
    name: str
    model: str | None = Field(description="The agent's default model endpoint; null when each turn must name one.")
    tools: list[str]


class AgentList(BaseModel):
    key: str = Field(description="The name of the API key that asked.")
    agents: list[AgentOut]


class ForkIn(BaseModel):
    """A fork of the conversation at one of its turns (docs/how-to/steer-a-conversation.md).
    Strict: ``"step": true`` is refused (422), never read as 1."""

    model_config = ConfigDict(strict=True)

    turn_id: str = Field(min_length=1, description=f"The turn to fork at. {ID_NOTE}")
    step: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Fork before this model call of the turn (0-based)."
    )
    text: str | None = Field(
        default=None, min_length=1, description="Replace the turn's input with this text (within the wire's limits)."
    )
    fork_id: str | None = Field(
        default=None,
        min_length=1,
        description=f"The fork's trace id, its idempotency key (default: <trace id>.fork-<random>). {ID_NOTE}",
    )


class ForkOut(BaseModel):
    """A fork made (``created``), or the same fork made before."""

    trace_id: str = Field(description="The fork's trace id.")
    source_trace_id: str
    source_entry_id: str = Field(description="The source's last entry the fork's history holds ('' for none).")
    turn_id: str
    step: int | None
    replaced: bool
    copied: int = Field(description="How many events were copied after the fork's first event.")
    created: bool
    turn_entry: str | None = Field(description="The turns-stream entry of the replacing turn, when one was published.")
    stream_url: str = Field(description="Follow the fork here as server-sent events.")
