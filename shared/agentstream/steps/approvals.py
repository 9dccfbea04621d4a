"""Tool calls that wait for a person: the decisions, as pure functions.

A call needs a person's approval when its tool says so (``Tool(needs_approval=...)``, for all
calls or those whose arguments a function picks), its MCP server does
(``McpServer(needs_approval=...)``), its agent does (``Agent(needs_approval=...)``), or its turn
does (the turn message's ``approval``): :func:`approval_needed`.

What the step does with the calls of a model output still without a result
(:func:`gate_calls`, called by :func:`agentstream.steps.decision.decide_view`), first match wins:

1. a call awaiting approval whose ``due_ms`` passed, undecided → :class:`RecordApprovals`: its
   denial by ``timeout`` is appended;
2. a call that needs approval and was never recorded as awaiting it → :class:`AwaitApproval` with
   its :class:`~agentstream.wire.events.ApprovalAwaited` to append (no tool job goes out);
3. a denied call → its error result (:func:`denial_result`), which the model sees;
4. a call still awaiting a decision → :class:`AwaitApproval` with nothing to append: the step
   gives the lease back and waits (an approval, a denial or the due time wakes it);
5. else the calls run (approved ones with the arguments the approver gave).

So the calls of one model output run together, once every one that needs a person is decided.

At the approvals stream, :func:`decide_message` says what an approval message does: append an
:class:`~agentstream.wire.events.ApprovalDecided`, nothing (the call was decided already: the
first decision stands), or refuse it with a reason.

Pure: no Redis, no asyncio, no clock (the loop passes the time).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentstream.declarations.agents import Agent
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    OfferedTool,
    ToolCall,
    ToolOutput,
    TurnInput,
)

DENIED_ERROR = "denied"
"""The ``error`` of the result of a call a person denied (or nobody approved in time)."""

TIMEOUT_BY = "timeout"
"""The ``by`` of a denial made because nobody decided before the call was due."""

ALL_TOOLS = "*"
"""In a turn's ``approval``: every tool."""


@dataclass(frozen=True)
class AwaitApproval:
    """Calls of the turn wait for a person: append ``awaited`` (new ones; may be empty), make sure
    the trace is woken at ``due_ms`` (Unix ms), publish no tool job and give the lease back."""

    turn: TurnInput
    awaited: tuple[ApprovalAwaited, ...]
    due_ms: int


@dataclass(frozen=True)
class RecordApprovals:
    """Append these decisions (denials of calls nobody decided before they were due)."""

    turn: TurnInput
    decisions: tuple[ApprovalDecided, ...]


def approval_needed(agent: Agent, turn: TurnInput, call: ToolCall, offered: OfferedTool | None) -> str | None:
    """Why ``call`` waits for a person's approval (for a person to read), or None when it runs
    without one. ``offered``: the MCP tool the call names, when it is one."""
    if ALL_TOOLS in turn.approval or call.name in turn.approval:
        return f"turn {turn.turn_id!r} asks approval for calls of {call.name!r}"
    wanted = agent.needs_approval
    if wanted is True or (not isinstance(wanted, bool) and call.name in wanted):
        return f"agent {agent.name!r} asks approval for calls of {call.name!r}"
    own = agent.tool(call.name)
    if own is not None:
        rule = own.needs_approval
        if rule is True:
            return f"tool {call.name!r} asks approval for every call"
        if callable(rule):
            arguments = _arguments(call.arguments)
            if arguments is None:
                return (
                    f"tool {call.name!r} asks approval for some calls, and this call's arguments are not a JSON object"
                )
            if rule(arguments):
                return f"tool {call.name!r} asks approval for calls with these arguments"
        return None
    if offered is not None:
        server = next((s for s in agent.mcp_servers if s.name == offered.server), None)
        if server is not None and server.approves(call.name):
            return f"MCP server {server.name!r} asks approval for calls of {call.name!r}"
    return None


def _arguments(text: str) -> dict[str, object] | None:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def editable(agent: Agent, call: ToolCall) -> bool:
    """Whether the approver of ``call`` may replace its arguments (the agent's own tool allows it)."""
    own = agent.tool(call.name)
    return own is not None and own.approval_edits


def _edit_schema(agent: Agent, call: ToolCall) -> dict[str, Any] | None:
    """The schema an edit of ``call``'s arguments must match: its tool's ``parameters`` when the
    approver may edit them, else None."""
    own = agent.tool(call.name)
    return dict(own.parameters) if own is not None and own.approval_edits else None


EDIT_PROBLEM_MAX_CHARS = 300
"""The most characters of the schema checker's message quoted in a refused edit (it may quote
the value, which the sender has)."""


def edit_problem(arguments: str, schema: dict[str, Any] | None) -> str | None:
    """Why edited ``arguments`` (a JSON object, as text) cannot replace a call's, checked against
    ``schema`` (the tool's ``parameters``, JSON Schema; the dialect its ``$schema`` names, else
    draft 2020-12, with the ``jsonschema`` library) → None when they match, or when ``schema`` is
    None (a trace written before the schema was recorded: the tool checks them when it runs).

    The reason names the place of the first mismatch as a JSON path (``$.amount``) and what is
    wrong there; a schema the checker cannot read, or arguments nested too deep to check, are
    reasons too (an edit is never let through unchecked)."""
    if schema is None:
        return None
    import jsonschema  # here, not at import: only an edited approval pays for it

    try:
        value = json.loads(arguments)
        validator = jsonschema.validators.validator_for(schema)(schema)
        validator.check_schema(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.SchemaError as exc:
        return f"the tool's argument schema cannot be checked ({exc.message[:EDIT_PROBLEM_MAX_CHARS]})"
    except (ValueError, RecursionError) as exc:
        return f"the edited arguments cannot be checked ({type(exc).__name__})"
    if error is None:
        return None
    return f"the edited arguments do not match the tool's schema at {error.json_path}: {error.message[:EDIT_PROBLEM_MAX_CHARS]}"


def denial_result(turn: TurnInput, call: ToolCall, decision: ApprovalDecided) -> ToolOutput:
    """The error result of a denied call: what the model sees instead of the tool's result."""
    if decision.timed_out:
        text = f"Error: this call of {call.name!r} was not run: nobody approved it in time"
    else:
        who = f" by {decision.by}" if decision.by else ""
        text = f"Error: this call of {call.name!r} was not run: it was denied{who}"
    if decision.reason:
        text += f" ({decision.reason})"
    return ToolOutput(
        turn_id=turn.turn_id,
        call_id=call.id,
        name=call.name,
        text=text + ". Do not call it again the same way unless the user asks.",
        error=DENIED_ERROR,
    )


def gate_calls(
    agent: Agent,
    turn: TurnInput,
    pending: Sequence[ToolCall],
    offered_of: Mapping[str, OfferedTool] | None,
    awaited: Mapping[str, ApprovalAwaited],
    decided: Mapping[str, ApprovalDecided],
    now_ms: int | None,
) -> AwaitApproval | RecordApprovals | tuple[ToolOutput, ...] | tuple[ToolCall, ...]:
    """What happens to the calls of a model output that still lack a result (see the module
    docstring for the order).

    Args:
        agent: the turn's agent, with its settings for the turn.
        turn: the running turn.
        pending: the calls without a result, in call order (calls that must not run are
            recorded before this is asked).
        offered_of: the agent's MCP tools as last offered, by name (None: none).
        awaited: the turn's recorded :class:`ApprovalAwaited`, by call id.
        decided: the turn's first :class:`ApprovalDecided` of each call, by call id.
        now_ms: the time (Unix ms), or None (a reader without a clock: nothing is ever due).

    Returns:
        :class:`RecordApprovals` (timeouts), :class:`AwaitApproval`, a tuple of
        :class:`ToolOutput` (denied calls' results) or a tuple of :class:`ToolCall` (the calls to
        run, with approved arguments).
    """
    timeouts: list[ApprovalDecided] = []
    new: list[ApprovalAwaited] = []
    denials: list[ToolOutput] = []
    waiting: list[ApprovalAwaited] = []
    run: list[ToolCall] = []
    timeout_ms = int(agent.approval_timeout_s * 1000)
    for call in pending:
        decision = decided.get(call.id)
        if decision is not None:
            if not decision.approved:
                denials.append(denial_result(turn, call, decision))
            elif decision.arguments is not None:
                run.append(ToolCall(id=call.id, name=call.name, arguments=decision.arguments))
            else:
                run.append(call)
            continue
        wait = awaited.get(call.id)
        if wait is not None:
            if now_ms is not None and now_ms >= wait.due_ms:
                timeouts.append(_timed_out(turn, call, wait, agent))
            else:
                waiting.append(wait)
            continue
        why = approval_needed(agent, turn, call, offered_of.get(call.name) if offered_of else None)
        if why is None:
            run.append(call)
            continue
        new.append(
            ApprovalAwaited(
                turn_id=turn.turn_id,
                call_id=call.id,
                name=call.name,
                due_ms=(now_ms or 0) + timeout_ms,
                editable=editable(agent, call),
                why=why,
                parameters=_edit_schema(agent, call),
            )
        )
    if timeouts:
        return RecordApprovals(turn, tuple(timeouts))
    if new or (waiting and not denials):
        return AwaitApproval(turn, tuple(new), min(w.due_ms for w in (*new, *waiting)))
    if denials:
        return tuple(denials)
    return tuple(run)


def _timed_out(turn: TurnInput, call: ToolCall, wait: ApprovalAwaited, agent: Agent) -> ApprovalDecided:
    return ApprovalDecided(
        turn_id=turn.turn_id,
        call_id=call.id,
        name=call.name,
        approved=False,
        by=TIMEOUT_BY,
        reason=f"no decision within {agent.approval_timeout_s:g} s (the agent's approval_timeout_s)",
        timed_out=True,
    )


@dataclass(frozen=True)
class Refused:
    """An approval message that decides nothing: ``reason`` says why (reported to its sender)."""

    reason: str


@dataclass(frozen=True)
class AlreadyDecided:
    """The call was decided already (the first decision stands): nothing to append."""

    decision: ApprovalDecided


def decide_message(
    message: ApprovalMessage,
    *,
    awaited: ApprovalAwaited | None,
    decided: ApprovalDecided | None,
    turn_open: bool,
    by: str,
) -> ApprovalDecided | AlreadyDecided | Refused:
    """What an approval message for a trace does, from what the trace holds about its call.

    Args:
        message: the message (decoded and checked by :func:`agentstream.wire.codec.decode_approval`).
        awaited: the call's :class:`ApprovalAwaited`, or None when the trace records none.
        decided: the call's first :class:`ApprovalDecided`, or None.
        turn_open: the call's turn has not ended.
        by: who decides, as the transport knows them (recorded in the decision).

    Returns:
        the decision to append; :class:`AlreadyDecided`; or :class:`Refused` with the reason
        (no such call awaiting approval, its turn ended, arguments the tool does not let a
        person edit, edited arguments that do not match the tool's schema: :func:`edit_problem`).
    """
    where = f"call {message.call_id!r} of trace {message.trace_id!r}"
    if decided is not None:
        return AlreadyDecided(decided)
    if awaited is None:
        return Refused(f"{where} does not await approval (no such call, or it runs without one)")
    if not turn_open:
        return Refused(f"{where}: its turn {awaited.turn_id!r} has ended")
    if message.arguments is not None and not awaited.editable:
        return Refused(f"{where}: tool {awaited.name!r} does not let its arguments be edited; approve it as made")
    if message.arguments is not None and not message.approved:
        return Refused(f"{where}: a denial carries no arguments")
    problem = edit_problem(message.arguments, awaited.parameters) if message.arguments is not None else None
    if problem is not None:
        return Refused(f"{where}: {problem}; nothing was decided, send the decision again")
    return ApprovalDecided(
        turn_id=awaited.turn_id,
        call_id=awaited.call_id,
        name=awaited.name,
        approved=message.approved,
        by=by,
        reason=message.reason,
        arguments=message.arguments,
    )


def _at(entry_id: str) -> str:
    """A stream entry id's time, ``YYYY-MM-DD HH:MM:SS UTC`` (the id itself when it is not one)."""
    import datetime

    try:
        ms = int(entry_id.split("-", 1)[0])
    except ValueError:
        return entry_id
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe_approval(event: ApprovalAwaited | ApprovalDecided) -> str:
    """One line for a person: a call awaiting approval, or who decided it and why."""
    if isinstance(event, ApprovalAwaited):
        edits = "; its arguments may be edited" if event.editable else ""
        return f"  ⏸ call {event.name} [{event.call_id}] awaits approval ({event.why}){edits}"
    verdict = "approved" if event.approved else "denied"
    who = "nobody decided in time" if event.timed_out else f"by {event.by or '?'}"
    edited = f", with arguments {event.arguments}" if event.arguments is not None else ""
    why = f": {event.reason}" if event.reason else ""
    return f"  {'✔' if event.approved else '✘'} call {event.name} [{event.call_id}] {verdict} {who}{edited}{why}"


def approval_history(entries: Sequence[tuple[str, object]], turn_id: str | None = None) -> list[str]:
    """Who decided what and when, from a trace's ``(entry id, event)`` pairs: one line per
    approval event (of ``turn_id`` only, when given), with its time (what ``trace explain`` shows)."""
    lines = []
    for entry_id, event in entries:
        if isinstance(event, ApprovalAwaited | ApprovalDecided) and (turn_id is None or event.turn_id == turn_id):
            lines.append(f"{_at(entry_id)} {describe_approval(event).strip()}")
    return lines
