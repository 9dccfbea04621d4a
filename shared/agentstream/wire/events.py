"""The events of a trace, and the turn message that other backends publish.

Every step of a conversation is one event in that conversation's trace (a Redis stream; see
:mod:`agentstream.runtime.store`). Events are frozen msgspec Structs in one tagged union. Each class has
an explicit, stable ``tag`` (class names may change, stored tags never do) and follows msgspec's
schema-evolution rules: a new field always has a default, and a field's type never changes.

The stored record is versioned: :data:`TRACE_SCHEMA_VERSION` is written beside every entry; a
reader accepts every version up to its own and refuses a newer one (see :mod:`agentstream.wire.codec`).

Event types (tag → meaning):

- ``turn_input``: a user's turn entered the trace (text and metadata).
- ``task_input``: the first event of a child trace: a task delegated by a parent's tool call
  (a turn input that also names the parent trace and call, the depth and the root trace).
- ``model_output``: one model call's answer: content, reasoning, complete tool calls, provider
  and model, opaque replay blocks, why it stopped, token usage and the sha256 of the request body.
- ``tool_result``: the result of one tool call (text, structured data, or an error). The first
  result of a call answers it; one that arrives after it (a tool that finished after its call
  was cancelled or given up) is kept with ``late`` set and never enters a context. A call that
  repeats an earlier successful call of its turn, for a tool whose repeats are off, is not run:
  its result is the earlier one again, with ``repeat_of`` naming the earlier call.
- ``tool_started``: a tool with side effects is about to run (written before it runs, so a
  re-delivery after a crash knows the outcome is unknown instead of running it again).
- ``cancel_requested``: someone asked to stop a turn; the agent loop ends it as cancelled.
- ``turn_ended``: the turn's final answer.
- ``turn_failed``: the turn ended without an answer; ``reason`` is written for a person to act on.
- ``compaction``: a summary that replaces the turns before ``kept_from_turn`` in every later
  model call's context (the replaced events stay in the trace).
- ``compaction_failed``: a compaction that was due could not be made (the summary call failed,
  or the summary was empty or would replace nothing); recorded in its place.
- ``forked_from``: the first event of a conversation forked from another one: which trace, up to
  which of its entries, from which turn; the source's events up to there follow it, copied.
- ``tools_offered``: the tools from MCP servers that an agent's model calls offer from here on
  (names, descriptions and input schemas as offered), recorded when they change, so a request
  is rebuilt from the trace alone.
- ``approval_awaited``: a tool call that needs a person's approval waits for it (until ``due_ms``);
  nothing waits in memory meanwhile.
- ``approval_decided``: a person approved or denied a call (or its timeout denied it); once per call.

Elements (tag field ``kind``) are the typed things that inputs and tool results carry: sources
the model can cite (``source``, ``document``, ``passage``) and images (``image``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from agentstream.errors import ModelStopError

TRACE_SCHEMA_VERSION = 3
"""Version of the stored trace format written by this agentstream (the ``v`` field of each entry).

It goes up when a reader of the previous version would misread a trace this version writes:
a new event type (an older reader takes it for an unknown type, and rebuilds requests without
it), or a field whose meaning changes. Every version up to this one is read; a trace may mix
versions (each entry carries its own). History:

- ``1``: every event type above but ``tools_offered``.
- ``2``: ``tools_offered`` (the tools from MCP servers an agent offers from here on: a request is
  rebuilt from the trace alone only with it). Entries of version 1 read unchanged.
- ``3``: a turn input's ``rolls_back`` (the turn it rolls back: that turn's events are left out of
  the contexts of every other turn from there on; an older reader would show them),
  ``forked_from`` (the first event of a conversation forked from another), the events
  ``approval_awaited`` and ``approval_decided`` (tool calls that wait for a person) and the turn
  input's ``approval``. Entries of versions 1 and 2 read unchanged.
"""

TRACE_SCHEMA_VERSIONS_READ: tuple[int, ...] = (1, 2, 3)
"""The versions this agentstream reads (every one up to :data:`TRACE_SCHEMA_VERSION`)."""

StopReason = Literal[
    "stop",  # the model finished its answer
    "tool_calls",  # the model asked for tools
    "length",  # cut off by the output token limit
    "content_filter",  # stopped by the provider's filter
    "refusal",  # the model refused
    "pause",  # the provider paused a long turn (may be continued)
    "interrupted",  # the stream broke before the reply completed
    "unknown",  # a finish reason this agentstream does not know
]

NORMAL_STOPS: frozenset[str] = frozenset({"stop", "tool_calls"})


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One complete tool call, as the model wrote it.

    Attributes:
        id: the call id the provider gave (or one agentstream made when it gave none).
        name: the tool name the model wrote (may be a tool the agent does not have).
        arguments: the raw argument text, exactly as received; never parsed for replay.
    """

    id: str
    name: str
    arguments: str = ""


class Element(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the elements that inputs and tool results carry (never stored itself).

    Attributes:
        id: the element's real id (a URL, a document key, ...). The context shows it to the
            model only as a number (see :mod:`agentstream.context.elements`).
        ref: the id of the whole this element is part of (a passage's document), or None.
        properties: extra attributes, shown by the XML layout (JSON-compatible values).
    """

    id: str
    ref: str | None = None
    properties: dict[str, Any] = {}


class Source(Element, frozen=True, kw_only=True, tag="source"):
    """Text the model may cite; ``text`` is its content."""

    text: str = ""


class Document(Source, frozen=True, kw_only=True, tag="document"):
    """A whole document (a citable source), with an optional title and URL."""

    title: str = ""
    url: str = ""


class Passage(Source, frozen=True, kw_only=True, tag="passage"):
    """A part of a document (``ref`` names the document)."""


class Image(Element, frozen=True, kw_only=True, tag="image"):
    """An image: a URL or base64 ``data`` of ``media_type``. Not citable."""

    media_type: str = ""
    url: str = ""
    data: str = ""


AnyElement = Source | Document | Passage | Image
"""The union of every built-in element type (an app adds its own: see :mod:`agentstream.wire.registry`)."""


class UnknownElement(Element, frozen=True, kw_only=True, tag="unknown_element"):
    """Stands in, when a trace is read, for a stored element of a kind this app does not register.

    Never stored. A context that would show one fails with
    :class:`~agentstream.errors.UnrenderedEventError`; ``agentstream trace show`` shows it raw.

    Attributes:
        stored_kind: the ``kind`` tag it was stored with.
        raw: the element as stored (JSON-compatible).
    """

    stored_kind: str = ""
    raw: dict[str, Any] = {}


class UnknownEvent(msgspec.Struct, frozen=True, kw_only=True, tag="unknown_event"):
    """Stands in, when a trace is read, for a stored event of a type this app does not register.

    Never stored. The context builder refuses it with
    :class:`~agentstream.errors.UnrenderedEventError` (nothing is skipped silently);
    ``agentstream trace show`` shows it raw.

    Attributes:
        stored_type: the ``type`` tag it was stored with.
        raw: the event as stored (JSON-compatible).
        turn_id: its ``turn_id`` field, when it had one.
    """

    stored_type: str
    raw: dict[str, Any] = {}
    turn_id: str = ""


class CitedSource(msgspec.Struct, frozen=True, kw_only=True):
    """A source that an answer cites, read back from its citation marks.

    Attributes:
        number: the number the model saw the source under (``[3]`` cites 3).
        id: the source's real id (a URL, a document key).
        kind: the element's stored kind (``passage``, ``document``, ...).
        title: the source's title, or its whole's (a passage's document) when it has none.
        url: the source's URL, or its whole's when it has none.
        whole: the id of the whole the source is part of (a passage's document), or None.
        spans: each part of the answer (without marks) that cites it, as ``[start, end)``
            character offsets, in order.
    """

    number: int
    id: str
    kind: str = ""
    title: str = ""
    url: str = ""
    whole: str | None = None
    spans: tuple[tuple[int, int], ...] = ()


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token usage reported by the provider for one call (tokens; None when not reported)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class TurnInput(msgspec.Struct, frozen=True, kw_only=True, tag="turn_input"):
    """A user's turn, appended once per ``turn_id``.

    Attributes:
        turn_id: the publisher's id for this turn; the idempotency key of the append.
        agent: the name of the agent that answers the turn.
        text: the user's message.
        metadata: string pairs carried through to the reply (the publisher's own ids, say).
        reply_to: the stream the answer is published on (default: the replies stream).
        elements: sources and images that come with the message, shown before its text.
        model: the model endpoint id the whole turn runs on (its agent's ``model`` or one of its
            ``models``), or None for the agent's own; in a child trace, the delegation's model.
        input: the turn's payload as published in the turn message's ``input`` (any JSON value,
            parsed by the agent's input type each time a context shows it), or None when the
            payload is ``text`` (see :mod:`agentstream.declarations.inputs`).
        tools: the state of each declared tool on this turn (``off``, ``auto``, ``required``), as
            resolved when the turn entered the trace, or None (every tool at its declaration's
            default: turns recorded before tool states, and delegated tasks).
        instructions: what the turn adds after its message for the tools it requires, in
            declaration order, as resolved when it entered the trace.
        rolls_back: the id of the turn this one rolls back (busy policy ``rollback``: the turn
            that was running when this one was admitted), or None. From this input on, the
            events of that turn are left out of the context of every other turn's model calls
            (see :mod:`agentstream.context.builder`); its own calls, and the requests recorded
            before, keep them. Not part of the turn's digest (a re-delivery of the message that
            brought the turn is the same turn).
        approval: the tools whose calls in this turn wait for a person's approval, besides those
            the app says need it (``"*"``: every tool), from the turn message's ``approval``.
    """

    turn_id: str
    agent: str
    text: str
    metadata: dict[str, str] = {}
    reply_to: str | None = None
    elements: tuple[AnyElement, ...] = ()
    model: str | None = None
    input: Any = None
    tools: dict[str, str] | None = None
    instructions: tuple[str, ...] = ()
    rolls_back: str | None = None
    approval: tuple[str, ...] = ()


class TaskInput(TurnInput, frozen=True, kw_only=True, tag="task_input"):
    """The first event of a child trace: a task that a parent's model delegated.

    It is a turn input (the child's agent answers it like any turn, on the child's own
    config), plus where its result goes back to. Depth and root travel here, in the record, so
    every service that reads the child knows them without asking the parent.

    Attributes:
        call_id: the id of the parent's tool call whose result the child's result becomes.
        parent_trace_id: the trace of the parent run.
        parent_turn_id: the parent's turn that made the call.
        root_trace_id: the trace at the top of the delegation tree.
        depth: 1 for a child of a root trace, 2 for a grandchild, and so on.
        delegation: the name of the delegation tool that was called.
        arguments: the call's arguments as parsed (JSON-compatible; element fields hold the
            elements' real ids).
        expects: the JSON Schema that the child's result must fit, or None for any result.
        model: (a turn input's field) the model endpoint id the child runs on, or None for its
            agent's own model.
        lineage: the digests of the tasks of this child and its ancestors, oldest first (see
            :func:`agentstream.delegation.task_digest`): an identical task delegated to the same
            agent further down is refused.
        deadline_s: the longest the child may run, in seconds; then a supervisor ends it.
    """

    call_id: str = ""
    parent_trace_id: str = ""
    parent_turn_id: str = ""
    root_trace_id: str = ""
    depth: int = 1
    delegation: str = ""
    arguments: Any = None
    expects: dict[str, Any] | None = None
    lineage: tuple[str, ...] = ()
    deadline_s: float = 0.0


class ModelOutput(msgspec.Struct, frozen=True, kw_only=True, tag="model_output"):
    """One model call's answer.

    Attributes:
        turn_id: the turn this call belongs to.
        step: 0-based index of the model call within the turn; with ``turn_id`` it is the
            idempotency key of the append.
        content: the answer text; may be empty when the model only calls tools.
        reasoning: reasoning text the provider returned, or None.
        tool_calls: the complete tool calls, in the order the model wrote them.
        provider: the provider kind that answered (``openai``, ``anthropic``, ...).
        model: the provider's model name.
        replay_blocks: opaque provider blocks (reasoning signatures and the like) that go back
            unchanged, and only to the same provider and model.
        stop_reason: why the model stopped (see :data:`StopReason`).
        stop_detail: the provider's own finish reason or refusal text, when it says more.
        usage: token usage as the provider reported it.
        request_sha256: hex sha256 of the exact request body this answered.
        latency_ms: wall time of the call in milliseconds.
        attempt_id: the id of the HTTP attempt whose reply this is; the token deltas of that
            attempt on the trace's delta stream carry the same id (see :mod:`agentstream.runtime.deltas`).
        endpoint: the model endpoint id (configuration) that was called, e.g. ``default``.
        prompt_digest: the digest of the prompt file texts the call read (its endpoint's
            layer; :attr:`agentstream.declarations.prompts.Prompts.digest`), or ``""`` when the agent's
            system prompt is not a prompt file. A rebuild whose digest differs names the
            prompt file as what changed.
        attributes: the caller's own data about the output (JSON-compatible), recorded with it
            and never sent to a model. The agent loop records ``window_miss`` here (the server's
            figures) on a call it sent again, smaller, after a window miss, so a rebuild of the
            call applies the same correction.
        include_in_messages: False leaves the output out of the messages of later calls (the
            context builder skips it, and so the results of its calls); it is still recorded.
        persist: False asks code that records outputs by itself not to record this one (a
            generation given a trace, :mod:`agentstream.models.generate`); the agent loop
            records every output it continues a turn with, whatever this says.
    """

    turn_id: str
    step: int
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    provider: str = ""
    model: str = ""
    replay_blocks: tuple[dict[str, Any], ...] = ()
    stop_reason: str = "stop"
    stop_detail: str | None = None
    usage: Usage = Usage()
    request_sha256: str = ""
    latency_ms: float = 0.0
    attempt_id: str = ""
    endpoint: str = ""
    prompt_digest: str = ""
    attributes: dict[str, Any] = {}
    include_in_messages: bool = True
    persist: bool = True

    @property
    def stopped_normally(self) -> bool:
        """True when the model finished or asked for tools."""
        return self.stop_reason in NORMAL_STOPS

    def raise_for_stop(self) -> ModelOutput:
        """Return this output, or raise when the model did not finish normally.

        The counterpart of ``response.raise_for_status()`` for scripts that call a model and
        want an exception instead of inspecting ``stop_reason``. It does nothing for an output
        that finished or asked for tools. The runtime never calls it for you: the agent loop
        reads ``stop_reason`` and decides (see :func:`agentstream.steps.decision.decide`).

        Raises:
            ModelStopError: the reply was refused, filtered, cut off by the token limit, paused,
                interrupted, or ended for a reason agentstream does not know; the error carries
                ``stop_reason``, ``detail``, ``turn_id`` and ``step``.
        """
        if self.stop_reason in NORMAL_STOPS:
            return self
        detail = f" ({self.stop_detail})" if self.stop_detail else ""
        source = f" from {self.provider}/{self.model}" if self.provider or self.model else ""
        raise ModelStopError(
            f"model call {self.step} of turn {self.turn_id!r}{source} did not finish normally: "
            f"{self.stop_reason}{detail}",
            stop_reason=self.stop_reason,
            detail=self.stop_detail,
            turn_id=self.turn_id,
            step=self.step,
        )


class ToolOutput(msgspec.Struct, frozen=True, kw_only=True, tag="tool_result"):
    """The result of one tool call, appended once per ``call_id``.

    Attributes:
        turn_id: the turn of the call.
        call_id: the id of the tool call this answers.
        name: the tool's name as called.
        text: what the model is shown.
        data: the tool's structured return value (JSON-compatible), when it had one.
        error: a short error message when the call failed; ``text`` then explains it to the model.
        duration_ms: wall time the tool ran, in milliseconds.
        elements: sources and images the result carries (numbered in the context, citable).
        late: True when the call already had a result (a cancelled, outcome-unknown or
            dead-letter one) when this one arrived; recorded for the record, never shown.
        repeat_of: the id of an earlier call of the turn, identical to this one, whose result
            this is again: the tool's repeats are off, so this call did not run (see
            ``Agent.repeats``); None for a call that ran.
    """

    turn_id: str
    call_id: str
    name: str
    text: str
    data: Any = None
    error: str | None = None
    duration_ms: float = 0.0
    elements: tuple[AnyElement, ...] = ()
    late: bool = False
    repeat_of: str | None = None


class TurnEnded(msgspec.Struct, frozen=True, kw_only=True, tag="turn_ended"):
    """The turn finished with an answer.

    Attributes:
        turn_id: the turn.
        answer: the final answer. For an agent that cites (``ContextConfig.citations``), the
            answer without the citation marks that resolved to sources; the model's own text,
            marks and all, stays in its ``model_output``.
        citations: the sources the answer cites, each with the parts of ``answer`` that cite it.
        answer_call: the id of the tool call whose result is the answer (a tool the agent
            names in ``result_as_answer``), or None when the model wrote it. A later turn's
            context shows such an answer as the assistant's message after that result.
    """

    turn_id: str
    answer: str
    citations: tuple[CitedSource, ...] = ()
    answer_call: str | None = None


class TurnFailed(msgspec.Struct, frozen=True, kw_only=True, tag="turn_failed"):
    """The turn ended without an answer.

    Attributes:
        turn_id: the failed turn.
        code: a stable machine-readable cause: one of
            :class:`~agentstream.wire.failures.FailureCode` (``bad_turn``, ``model_error``, ...,
            every one listed there), or an app's own code (``TurnDenied(code=...)``).
        reason: what went wrong and what to do, for a person.
    """

    turn_id: str
    code: str
    reason: str


class Compaction(msgspec.Struct, frozen=True, kw_only=True, tag="compaction"):
    """A summary that replaces the earlier turns of the conversation in later contexts.

    From this event on, the context of a model call shows ``summary`` in the system message and
    leaves out every turn before ``kept_from_turn`` (in turn order). The kept part always starts
    on a turn's input, so a tool call is never separated from its results, and the running turn
    is never replaced. A later compaction folds this summary into its own.

    Attributes:
        turn_id: the turn that was running when the summary was made.
        summary: the summary text the model wrote.
        kept_from_turn: the id of the first turn shown in full after the summary.
        replaced_turns: how many turns the summary replaces (those of earlier summaries included).
        provider: the provider kind that wrote the summary.
        model: the provider's model name.
        usage: token usage of the summary call.
    """

    turn_id: str = ""
    summary: str = ""
    kept_from_turn: str = ""
    replaced_turns: int = 0
    provider: str = ""
    model: str = ""
    usage: Usage = Usage()


class ToolStarted(msgspec.Struct, frozen=True, kw_only=True, tag="tool_started"):
    """A call of a tool with side effects is about to run (appended once per ``call_id``).

    Attributes:
        turn_id: the turn of the call.
        call_id: the tool call.
        name: the tool's name.
        worker: the consumer name of the tool worker that runs it.
        job: ``<stream>/<entry id>`` of the tool job that runs it.
    """

    turn_id: str
    call_id: str
    name: str
    worker: str = ""
    job: str = ""


class CancelRequested(msgspec.Struct, frozen=True, kw_only=True, tag="cancel_requested"):
    """Someone asked to stop a turn (appended once per ``turn_id``).

    The agent loop then gives every call of the turn without a result a synthetic cancelled
    result and ends the turn with :class:`TurnFailed` code ``cancelled``.

    Attributes:
        turn_id: the turn to stop (running or still queued).
        by: who asked (``user``, ``interrupt``, an operator's name, ...).
        reason: why, for a person.
    """

    turn_id: str
    by: str = "user"
    reason: str = ""


class ApprovalAwaited(msgspec.Struct, frozen=True, kw_only=True, tag="approval_awaited"):
    """A tool call waits for a person's approval before it runs (appended once per ``call_id``).

    Nothing waits in memory: the turn's lease is given back, and an
    :class:`ApprovalDecided` (from the approvals stream, the gateway or the CLI), or the timeout,
    wakes the turn.

    Attributes:
        turn_id: the turn of the call.
        call_id: the tool call (its arguments are in the model output that made it).
        name: the tool's name.
        due_ms: when the call is denied if nobody decided (Unix milliseconds).
        editable: whether an approval may replace the call's arguments.
        why: what asks for the approval (the tool, the agent, the turn), for a person.
        parameters: when ``editable``, the JSON schema of the tool's arguments (its
            ``parameters``), so whoever takes a decision (the agent loop, the gateway) checks an
            edit against it without loading the app; None otherwise.
    """

    turn_id: str
    call_id: str
    name: str
    due_ms: int = 0
    editable: bool = False
    why: str = ""
    parameters: dict[str, Any] | None = None


class ApprovalDecided(msgspec.Struct, frozen=True, kw_only=True, tag="approval_decided"):
    """A person's decision on a call that awaited approval, or its timeout (once per ``call_id``:
    whatever arrives twice, the first decision stands).

    Attributes:
        turn_id: the turn of the call.
        call_id: the tool call.
        name: the tool's name.
        approved: True: the call runs (once); False: it gets an error result the model sees.
        by: who decided, as the transport knows them (the gateway's key name; on the approvals
            stream, the message's ``by``; ``timeout`` when nobody decided in time).
        reason: why, for a person (shown to the model in a denial's result).
        arguments: the arguments the call runs with instead of the model's (JSON object text),
            when the approver edited them; None runs the call as the model made it.
        timed_out: nobody decided before the call's ``due_ms``.
    """

    turn_id: str
    call_id: str
    name: str
    approved: bool
    by: str = ""
    reason: str = ""
    arguments: str | None = None
    timed_out: bool = False


class CompactionFailed(msgspec.Struct, frozen=True, kw_only=True, tag="compaction_failed"):
    """A compaction that was due could not be made; recorded in its place (once per compaction).

    A compaction is named by its running turn and the first turn it keeps; the trace holds one
    outcome per name, this or the Compaction. Never shown to a model.

    Attributes:
        turn_id: the running turn.
        kept_from_turn: the first turn the summary would have kept.
        code: a :class:`~agentstream.wire.failures.FailureCode`. ``summary_failed``: the summary call
            failed (the model erred, refused or was not configured), so the turn goes on with the
            oldest history trimmed instead;
            ``compaction_error``: the summary was empty or would replace nothing, so the turn
            ends with this reason.
        reason: what went wrong, for a person.
    """

    turn_id: str
    kept_from_turn: str
    code: str
    reason: str


class OfferedTool(msgspec.Struct, frozen=True, kw_only=True):
    """A tool from an MCP server as the model is offered it.

    Attributes:
        name: the tool's name (as the server lists it).
        description: what the model reads about it (the server's, or a prompt file's).
        parameters: the JSON schema of its arguments, normalised for the endpoints (see
            :mod:`agentstream.mcp_tools.schemas`).
        server: the MCP server's name in the app.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}
    server: str = ""


class ToolsOffered(msgspec.Struct, frozen=True, kw_only=True, tag="tools_offered"):
    """The tools from MCP servers that the model calls of ``agent`` offer from here on.

    Recorded by the agent loop before a model call whose MCP tools differ from the last ones
    recorded for the agent (once per turn, step and ``digest``); the context library offers the
    agent's own tools followed by these, so every request is rebuilt from the trace alone, even
    after the server's list changed.

    Attributes:
        turn_id: the turn of the call that first offered them.
        step: that call's step.
        agent: the agent whose calls offer them.
        tools: the tools, in the order offered.
        digest: 16 hex characters of the sha256 of ``tools`` (canonical JSON).
    """

    turn_id: str
    step: int
    agent: str
    tools: tuple[OfferedTool, ...] = ()
    digest: str = ""


class ForkedFrom(msgspec.Struct, frozen=True, kw_only=True, tag="forked_from"):
    """The first event of a conversation forked from another (appended once, with the copied
    history, in one step; see :mod:`agentstream.runtime.forks`).

    The events after it, up to its ``copied`` count, are the source's events up to the fork
    point, copied as they were stored (each model call among them rebuilds byte for byte from
    this trace); then the fork goes on as a conversation of its own. Never shown to a model.

    Attributes:
        source_trace_id: the trace it was forked from.
        source_entry_id: the source's last entry the fork's history holds (its stream entry id),
            or ``""`` when it holds none (forked before the source's first turn).
        turn_id: the source turn the fork was made at.
        step: the model call of that turn the fork was made before (its history holds the turn up
            to that call, and the fork's agent loop calls the model again), or None: the whole
            turn, or none of it when ``replaced``.
        replaced: the history ends before ``turn_id``, whose input is replaced by a new turn
            published to the fork (with the same turn id).
        copied: how many events were copied after this one.
        fork_id: the fork's idempotency key (its trace id): a fork asked again is the same fork.
        by: who forked it (``cli``, ``gateway:<key name>``, ...).
    """

    source_trace_id: str
    source_entry_id: str = ""
    turn_id: str = ""
    step: int | None = None
    replaced: bool = False
    copied: int = 0
    fork_id: str = ""
    by: str = ""


Event = (
    TurnInput
    | TaskInput
    | ModelOutput
    | ToolOutput
    | TurnEnded
    | TurnFailed
    | Compaction
    | CompactionFailed
    | ToolStarted
    | CancelRequested
    | ToolsOffered
    | ForkedFrom
    | ApprovalAwaited
    | ApprovalDecided
)
"""The union of every event type that a trace holds."""

TERMINAL_EVENTS = (TurnEnded, TurnFailed)


BusyPolicy = Literal["queue", "reject", "interrupt", "rollback"]
"""What a turn published on a busy conversation does to its running turn (see :class:`TurnMessage`)."""

BUSY_POLICIES: tuple[str, ...] = ("queue", "reject", "interrupt", "rollback")
"""Every :data:`BusyPolicy`, the default (``queue``) first."""


NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
"""A string of at least one character (the turn message's ids, agent and text; still a ``str``)."""


# omit_defaults: a field left at its default is not written, so a turn that uses no field newer than
# an older agent loop (busy_policy, approval) reads there too, during a rolling update
class TurnMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The turn message other backends publish on the turns stream.

    Publish it as a JSON object in the field ``turn`` of a stream entry::

        XADD agentstream:turns * turn '{"trace_id":"c1","turn_id":"t1","agent":"demo","text":"Hi"}'

    Attributes:
        trace_id: the conversation's id; every turn with the same id shares one trace.
        turn_id: the publisher's id for the turn, unique within its trace; a turn published twice
            is answered once. Replies are at-least-once: dedupe them by ``(trace_id, turn_id)``.
        agent: the name of the agent to answer with.
        text: the user's message (not empty, not only whitespace); give it or ``input``.
        metadata: string pairs echoed on the reply. A W3C ``traceparent`` (and ``tracestate``)
            here makes the services' OpenTelemetry spans part of the publisher's trace.
        reply_to: the stream to publish the answer on; defaults to ``agentstream:replies``.
        elements: documents and images that come with the message, shown to the model before
            its text: ``{"kind": "document", "id": "...", "title": "...", "text": "..."}``,
            ``{"kind": "image", "id": "...", "url": "https://..."}`` or ``{"kind": "image",
            "id": "...", "media_type": "image/png", "data": "<base64>"}`` (see
            :func:`agentstream.wire.registry.check_elements` for the limits).
        model: the model endpoint id to run the whole turn on: the agent's own (``Agent.model``)
            or one it allows (``Agent.models``); None for the agent's own. Any other is refused
            (a failed reply, code ``bad_turn``).

        input: the turn's typed input instead of ``text``: any JSON value that the agent's input
            type parses (``Agent(input=ChatTurnInput)`` takes ``{"text": "...", "tools":
            {"search": "off"}, "context": "..."}``; see :mod:`agentstream.declarations.inputs`). A turn whose
            input does not parse is refused (code ``bad_turn``, naming the field).
        busy_policy: what this turn does when its conversation is busy with a running turn:
            ``queue`` (wait behind it), ``reject`` (fail at once, code ``busy``), ``interrupt``
            (cancel the running turn, keep its work in the history) or ``rollback`` (cancel it
            and leave its events out of every later context, as if it had not been sent); None
            for the process's ``AGENTSTREAM_BUSY_POLICY``. Any other value is refused (code
            ``bad_turn``). See :data:`BUSY_POLICIES` and ``docs/how-to/steer-a-conversation.md``.
        approval: tool names whose calls in this turn wait for a person's approval, besides
            those the app says need it; ``["*"]`` for every tool (see the how-to "Tool calls that
            wait for a person"). At most 64 names of at most 128 characters.

    Unknown fields are refused (a failed reply, code ``bad_turn``, naming the field): a misspelt
    field fails instead of being dropped.
    """

    @property
    def payload(self) -> Any:
        """What the agent's input type parses: ``input`` when given, else ``text``."""
        return self.input if self.input is not None else self.text

    trace_id: NonEmptyStr
    turn_id: NonEmptyStr
    agent: NonEmptyStr
    text: NonEmptyStr | None = None
    metadata: dict[str, str] = {}
    reply_to: str | None = None
    elements: tuple[AnyElement, ...] = ()
    model: NonEmptyStr | None = None
    input: Any = None
    busy_policy: BusyPolicy | None = None
    approval: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]], msgspec.Meta(max_length=64)
    ] = []


class Reply(msgspec.Struct, kw_only=True):
    """What the agent loop publishes (field ``reply``) when a turn ends.

    At-least-once: a backend dedupes replies by ``(trace_id, turn_id)`` (a turn id is unique
    within its trace only).

    ``status`` is ``ended`` (``answer`` set) or ``failed`` (``code`` and ``reason`` set; ``code`` is
    one of :class:`~agentstream.wire.failures.FailureCode`, or an app's own).
    ``stop_reason`` is the stop reason of the turn's last model output when it was not a normal
    stop (``length``: the answer was cut off by the output token limit), else None.
    ``citations`` are the sources an ended turn's answer cites (see :class:`TurnEnded`).
    """

    trace_id: str
    turn_id: str
    status: Literal["ended", "failed"]
    answer: str | None = None
    code: str | None = None
    reason: str | None = None
    metadata: dict[str, str] = {}
    stop_reason: str | None = None
    citations: tuple[CitedSource, ...] = ()


class ToolJob(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A hint on a tool queue: run this call of this trace (the trace holds the truth).

    ``trace_context`` is the OpenTelemetry context of the step that published the job (W3C
    ``traceparent``/``tracestate``; empty without tracing): the tool call's span is its child
    (see :mod:`agentstream.ops.tracing`).

    ``wake_to`` is the agent-loop consumer that published the job, which holds the trace's fold:
    the wake-up of its result goes to that consumer's own wake-up stream while it is alive, else
    to the partition's shared one (:mod:`agentstream.steps.wake_routes`). Empty (a job of an
    older agent loop, or a consumer name that may not name a stream): the shared one. A hint like
    the job: a name that no live agent loop registered reaches only the shared stream.
    """

    trace_id: str
    turn_id: str
    call_id: str
    name: str
    arguments: str
    trace_context: dict[str, str] = {}
    wake_to: str = ""


class Wake(msgspec.Struct, frozen=True, kw_only=True):
    """A hint on the wake-up stream: something was appended to this trace; decide the next step."""

    trace_id: str
    reason: str = ""


CANCEL_BY_MAX_CHARS = 256
"""The longest ``by`` of a cancel request a client may publish (characters); longer is refused."""
CANCEL_REASON_MAX_CHARS = 2000
"""The longest ``reason`` of a cancel request a client may publish (characters); longer is
refused, on the cancel stream and at the gateway: the reason is stored in the trace and echoed on
the cancelled turn's reply."""


class CancelMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """A cancel request, published as JSON in the field ``cancel`` on the cancel stream::

        XADD agentstream:cancel * cancel '{"trace_id":"c1","by":"user","reason":"changed my mind"}'

    Attributes:
        trace_id: the conversation.
        turn_id: the turn to stop; empty means the turn running now (the oldest without an end).
        by: who asks (shown in the cancelled results and the turn's failure reason).
        reason: why, for a person.
    """

    trace_id: str
    turn_id: str = ""
    by: Annotated[str, msgspec.Meta(max_length=CANCEL_BY_MAX_CHARS)] = "user"
    reason: Annotated[str, msgspec.Meta(max_length=CANCEL_REASON_MAX_CHARS)] = ""


APPROVAL_BY_MAX_CHARS = CANCEL_BY_MAX_CHARS
"""The longest ``by`` of an approval message (characters); longer is refused."""
APPROVAL_REASON_MAX_CHARS = CANCEL_REASON_MAX_CHARS
"""The longest ``reason`` of an approval message (characters); longer is refused."""
APPROVAL_ARGUMENTS_MAX_CHARS = 64 * 1024
"""The longest edited ``arguments`` of an approval message (characters); longer is refused."""


class ApprovalMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An approval or a denial of a tool call that awaits one, published as JSON in the field
    ``approval`` on the approvals stream::

        XADD agentstream:approvals * approval '{"trace_id":"c1","call_id":"call_0","approved":true,"by":"ana"}'

    The agent loop appends it to the trace once per call (an :class:`ApprovalDecided`; a second
    message for the call changes nothing) and wakes the turn. A message for a call the trace does
    not hold, or that does not await approval, or with arguments the tool does not let a person
    edit, is refused (an entry on the errors stream says why).

    Attributes:
        trace_id: the conversation.
        call_id: the tool call (``call_id`` of the trace's ``approval_awaited`` event).
        approved: True to run the call, False to deny it (the model sees an error result).
        by: who decides. On this stream the publisher says it (any backend that may XADD here is
            trusted with it, as with turns and cancels); the gateway sets it to its key's name.
        reason: why, for a person; a denial's reason is shown to the model.
        arguments: the arguments to run the call with instead of the model's (a JSON object, as
            text), only where the tool allows it; None (the default) runs the call as made.
    """

    trace_id: NonEmptyStr
    call_id: NonEmptyStr
    approved: bool
    by: Annotated[str, msgspec.Meta(max_length=APPROVAL_BY_MAX_CHARS)] = ""
    reason: Annotated[str, msgspec.Meta(max_length=APPROVAL_REASON_MAX_CHARS)] = ""
    arguments: Annotated[str, msgspec.Meta(max_length=APPROVAL_ARGUMENTS_MAX_CHARS)] | None = None
