"""Every error agentstream raises, under one base class, and its signals, under another.

Three families, kept apart (as pydantic-ai keeps them): misuse found at startup
(:class:`ConfigError`), failures of a run (the rest of :class:`AgentStreamError`), and signals
raised on purpose for a caller to act on (:class:`AgentStreamSignal`). An ``except
AgentStreamError`` meant for failures never swallows a signal meant for the consumer or the tool
runner. The failure codes a failed turn carries are :class:`agentstream.wire.failures.FailureCode`.

The tree (``tests/unit/test_errors.py`` checks that it names every public exception class of
the package, read from the source and imported, each under its real base)::

    AgentStreamError
    ├── ConfigError              misuse found at startup: a bad app path, an unknown model id,
    │   │                        a missing setting (also a ValueError). Fix it and restart.
    │   ├── PromptFileError      a prompt file that does not fit its agent (also a ValueError;
    │   │                        agentstream.declarations.prompts)
    │   ├── SchemaRefused        an MCP tool's schema cannot be offered to the endpoint
    │   │                        (agentstream.mcp_tools.schemas)
    │   └── UninlinableSchema    a tool's argument schema cannot be inlined
    │       │                    (agentstream.declarations.tool_schemas)
    │       ├── RecursiveSchemaError  the schema refers to itself
    │       └── SchemaTooLarge   it has, or inlines to, too many values or levels
    ├── TraceError               the stored record cannot be used as it is
    │   ├── SchemaVersionError   an entry was written by a newer agentstream than this one
    │   ├── EventDecodeError     an entry is not a valid event (names the trace and entry id)
    │   └── StaleLeaseError      an append was fenced off: another worker holds the trace now
    ├── ServiceFailed            a consumer of a service process stopped with an error: the
    │                            process exits non-zero, so an orchestrator restarts it
    ├── TurnRejected             a published turn breaks a rule of the wire (the reason names
    │                            the field or the limit; see agentstream.wire.checks)
    ├── ForkRefused              a fork cannot be made as asked: no such trace or turn, a turn
    │                            not ended, a fork id taken (agentstream.steps.forking)
    ├── ToolError                a tool call could not produce a result
    │   ├── ToolArgumentsError   the arguments are not JSON or do not validate
    │   ├── UnknownToolError     the model named a tool the agent does not have
    │   └── ToolTimeoutError     the tool ran past its timeout
    ├── ContextError             the context library could not build a request
    │   ├── PromptError          an agent's system prompt could not be written for a turn
    │   ├── UnrenderedEventError an event type that no renderer knows
    │   ├── ContextFullError     the context cannot fit the model's window
    │   ├── ShortenError         a shorten function added, removed or reordered elements,
    │   │                        or changed a result's error
    │   └── CompactionError      a summary that is empty or replaces nothing
    ├── ModelError               a model call failed
    │   ├── ModelConfigError     wrong key, model or URL (HTTP 401/403/404): not retried
    │   ├── ModelUnanswered      no answer after the retries (network, timeout, 408/409/429/5xx)
    │   │   ├── ModelInputRejected  the server refused this request's input (HTTP 400/413/422):
    │   │   │   │                   sending the same body again cannot help
    │   │   │   └── ContextWindowExceeded  the server said the request is over the model's window
    │   │   └── ModelDeadlineExceeded  the call as a whole ran past its deadline
    │   ├── InvalidModelOutput   the reply cannot be used (refused, cut off, empty, malformed)
    │   └── ModelStopError       a stored model output did not finish normally (raised on
    │                            purpose by ``ModelOutput.raise_for_stop``)
    └── LocalModelError          the local model server could not be started
                                 (agentstream.cli.localmodel)

    AgentStreamSignal            raised on purpose for the caller to act on; not a failure
    ├── Deferred                 a handler's signal: not now, hand me this work-stream entry
    │                            again after a delay (the consumer does; no delivery counted)
    ├── TurnDenied               an agent refuses a turn, raised by its settings function, or
    │                            for tool states it does not allow (agentstream.declarations.inputs): the
    │                            turn fails with the signal's code, no model is called
    └── ToolCancelled            the call's turn was cancelled (a tool raises it to stop early;
                                 the tool runner records a cancelled result)

    (outside both trees, never seen by a user of the library:)

    Retryable                    one attempt of a model call failed, another may not
                                 (agentstream.models.http; caught by its retry loop)
    AssertionError
    ├── UnexpectedModelCall      a model double got a call it was not written for
    │                            (agentstream.testing)
    └── RealModelCallBlocked     a test bed's service tried a real model call

    (outside both trees, of another library's family, each handled where it is raised:)

    RuntimeError
    └── McpListingError          an MCP server's tool listing could not be taken in: its
                                 session ends (agentstream.mcp_tools.host)
    BrokenResourceError          anyio's
    └── MessageTooLarge          an MCP server sent a message over the limit: its session ends
                                 (agentstream.mcp_tools.transports)
    DecodeError                  msgspec's, as the wire's decoders raise it
    ├── MissingField             a work stream entry without the field of its message
    │                            (agentstream.wire.codec)
    └── DoubledField             a work stream entry that gives a field more than once

Errors say what happened, to what (trace id, call id, stream) and what to do next. Third-party
errors are converted at the boundary into the most specific of these (``raise ... from exc``).
"""

from __future__ import annotations


class AgentStreamError(Exception):
    """Base class of every agentstream error (not of its signals: :class:`AgentStreamSignal`)."""


class AgentStreamSignal(Exception):
    """Base class of the signals agentstream code raises on purpose: not failures.

    A signal asks its catcher to act (defer the entry, fail the turn with a code, record a
    cancelled result); each is caught by name where it is meant to be, so an ``except
    AgentStreamError`` written for failures lets it through.
    """


class ConfigError(AgentStreamError, ValueError):
    """The configuration is wrong; raised at startup, before any work is taken.

    Also a ``ValueError``: a bad setting is a bad value, and callers that catch ``ValueError`` for
    one (as the seed's callers do) catch it.
    """


class TraceError(AgentStreamError):
    """A stored trace cannot be read or written as asked."""


class SchemaVersionError(TraceError):
    """A trace entry carries a schema version newer than this agentstream can read."""


class EventDecodeError(TraceError):
    """A trace entry does not decode into a known event."""


class StaleLeaseError(TraceError):
    """An append carried a fencing token that is no longer the trace's current lease."""


class ServiceFailed(AgentStreamError):
    """A consumer (or listener) of a service process stopped with an error, or stopped by itself.

    Raised by :func:`agentstream.runtime.runner.run_consumers` after the others drained; the cause is
    chained. ``agentstream serve`` exits non-zero on it.
    """


REASON_MAX_CHARS = 2000
"""The longest reason a refusal of a client's message carries (characters)."""


def bounded_reason(reason: str, max_chars: int = REASON_MAX_CHARS) -> str:
    """``reason`` when it has at most ``max_chars`` characters, else its first ``max_chars``
    followed by ``…`` and its full length: a refusal that quotes a sender's field (an unknown
    field's name, a model's) stays small wherever it is stored or sent."""
    if len(reason) <= max_chars:
        return reason
    return f"{reason[:max_chars]}… (cut: {len(reason):,} characters in all)"


class TurnRejected(AgentStreamError):
    """A published turn message breaks a rule of the wire; ``reason`` says what and where.

    Attributes:
        reason: what was wrong: the field (msgspec's path, ``$.turn_id``), or the limit with its
            setting and the actual size; at most :data:`REASON_MAX_CHARS` characters (a longer
            one is cut, saying how long it was: a reason may quote what the sender wrote, and it
            is stored in the trace, sent on the reply and logged).
        code: the failure reply's code, ``bad_turn``.
        limit: the setting whose limit the turn passed (``AGENTSTREAM_MAX_TURN_BYTES``), or None.
        trace_id, turn_id: the turn's ids when they could be read (None: the refusal has no
            trace and goes to the errors stream).
        reply_to: the turn's reply stream when it passed the reply-stream check, else None
            (the failure reply goes to the default replies stream).
        metadata: the turn's metadata when it could be read within its limit (echoed on the
            failure reply), else empty.
    """

    def __init__(
        self,
        reason: str,
        *,
        trace_id: str | None = None,
        turn_id: str | None = None,
        reply_to: str | None = None,
        metadata: dict[str, str] | None = None,
        limit: str | None = None,
        code: str = "bad_turn",
    ):
        reason = bounded_reason(reason)
        super().__init__(reason)
        self.reason = reason
        self.trace_id = trace_id
        self.turn_id = turn_id
        self.reply_to = reply_to
        self.metadata = dict(metadata or {})
        self.limit = limit
        self.code = code


class ForkRefused(AgentStreamError):
    """A fork of a conversation cannot be made as asked; the message says what and what to do.

    Attributes:
        kind: ``not_found`` (no such trace, turn or model call), ``conflict`` (the fork id names a
            trace that exists, or a fork of another point; a turn not ended yet) or ``invalid``
            (a request that cannot be a fork: a delegated task's trace, a replaced input with a
            model call, a fork id that cannot name a trace) or ``too_large`` (the replacing text
            is over the wire's size limit, which the message names).
    """

    def __init__(self, message: str, *, kind: str = "invalid"):
        super().__init__(message)
        self.kind = kind


class TurnDenied(AgentStreamSignal):
    """An agent refuses a turn: its settings function says no, or the turn asks of a tool what
    the agent does not allow. The turn fails with ``code`` and ``reason``; no model is called.

    Raise it from a settings function (``Agent(settings=...)``) to refuse a turn for a reason of
    the app's own (a user over quota, a model the user may not use).

    Attributes:
        reason: what was refused and why, for the person who sent the turn.
        code: the failed reply's code (default ``input_denied``).
    """

    def __init__(self, reason: str, *, code: str = "input_denied"):
        super().__init__(reason)
        self.reason = reason
        self.code = code


class Deferred(AgentStreamSignal):
    """Raised by a work-stream handler on purpose: not now; hand me this entry again after ``delay_s``.

    The entry stays pending on the consumer (its claim renewed) and the deferral does not
    count as a delivery. The agent loop defers a hint while another worker holds the trace.
    """

    def __init__(self, delay_s: float, reason: str = ""):
        super().__init__(reason or f"deferred for {delay_s:.2f} s")
        self.delay_s = delay_s
        self.reason = reason


class ToolError(AgentStreamError):
    """A tool call could not produce a result; the message is shown to the model."""


class ToolArgumentsError(ToolError):
    """The tool call's arguments are not a JSON object or do not match the tool's schema."""


class UnknownToolError(ToolError):
    """The model called a tool that the agent does not have."""


class ToolTimeoutError(ToolError):
    """The tool ran longer than its timeout."""


class ToolCancelled(AgentStreamSignal):
    """The call's turn was cancelled; raised by :meth:`agentstream.declarations.tool_context.CallContext.raise_if_cancelled`."""


class ContextError(AgentStreamError):
    """The context library could not build a model request from the trace."""


class PromptError(ContextError):
    """An agent's system prompt could not be written for a turn: its prompt function raised or
    returned something else than a text, or its prompt file's template failed to render. The
    turn fails with code ``prompt``."""


class UnrenderedEventError(ContextError):
    """An event type reached the builder that no renderer handles."""


class ContextFullError(ContextError):
    """The context does not fit the model's window even after every shrink."""


class ShortenError(ContextError):
    """A shorten function of the context policy changed a result's elements or its error.

    Handles and citations find elements by id, and the model reacts to the error, so a shorten
    function may change text and data only. Fix the function named in the message.
    """


class CompactionError(ContextError):
    """A compaction would replace nothing, or its summary is empty."""


class ModelError(AgentStreamError):
    """A model call failed."""


class ModelConfigError(ModelError):
    """The endpoint refused the key, the model or the URL (HTTP 401, 403, 404).

    Attributes:
        status_code: the HTTP status, when the endpoint answered.
    """

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class ModelUnanswered(ModelError):
    """The endpoint gave no answer after the retries, or refused this input (HTTP 400/413/422).

    Attributes:
        status_code: the last HTTP status, or None for a network error or a timeout.
    """

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class ModelDeadlineExceeded(ModelUnanswered):
    """A model call ran past its deadline as a whole (connect to last byte, retries included).

    Attributes:
        deadline_s: the deadline that passed, in seconds.
    """

    def __init__(self, message: str, *, deadline_s: float):
        super().__init__(message)
        self.deadline_s = deadline_s


class ModelInputRejected(ModelUnanswered):
    """The endpoint refused this request's input (HTTP 400, 413 or 422); not retried.

    Too long a context, a malformed history or a field the server does not accept: the same
    body would be refused again, so the caller must change the request (shorten the context,
    fix the endpoint's quirks) instead of retrying.
    """


class ContextWindowExceeded(ModelInputRejected):
    """The endpoint said the request does not fit the model's context window (a window miss).

    Raised instead of a plain :class:`ModelInputRejected` when the server's answer says so in any
    of the known wordings (:func:`agentstream.models.overflow.window_miss`): OpenAI's
    ``context_length_exceeded``, vLLM's, llama.cpp server's, Ollama's, LM Studio's, LiteLLM's
    ``ContextWindowExceededError`` and Anthropic's ``prompt is too long``. Not retried as is:
    the caller shrinks the request (:func:`agentstream.context.limits.learn_from_miss` says by
    how much) and sends a smaller one.

    Attributes:
        prompt_tokens: the prompt's size in tokens as the server counted it, when it said.
        window_tokens: the model's window in tokens as the server stated it, when it said.
        over_by_tokens: by how many tokens the request is over, when the server said only that.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        prompt_tokens: int | None = None,
        window_tokens: int | None = None,
        over_by_tokens: int | None = None,
    ):
        super().__init__(message, status_code=status_code)
        self.prompt_tokens = prompt_tokens
        self.window_tokens = window_tokens
        self.over_by_tokens = over_by_tokens


class InvalidModelOutput(ModelError):
    """The model's reply cannot be used; ``reason`` says why. Never repaired."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ModelStopError(ModelError):
    """A model output ended for a reason other than finishing or asking for tools.

    Raised by :meth:`agentstream.wire.events.ModelOutput.raise_for_stop`, the blocking-script
    counterpart of ``response.raise_for_status()``; the runtime never raises it by itself.

    Attributes:
        stop_reason: ``refusal``, ``content_filter``, ``length``, ``pause``, ``interrupted`` or
            ``unknown`` (see :data:`agentstream.wire.events.StopReason`).
        detail: the provider's own finish reason or refusal text, when it said more.
        turn_id: the turn of the model call.
        step: the model call's step within the turn.
    """

    def __init__(self, message: str, *, stop_reason: str, detail: str | None, turn_id: str, step: int):
        super().__init__(message)
        self.stop_reason = stop_reason
        self.detail = detail
        self.turn_id = turn_id
        self.step = step
