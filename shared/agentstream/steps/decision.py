"""Deciding a trace's next step: a pure function of its events and the app.

The agent loop is level-triggered: whatever hint woke it (a new turn, a tool result, a
redelivered entry after a crash), it reads the trace and asks :func:`decide` what to do next.
Running the same decision twice is harmless because every append is once-only by key.

Turns of one trace are answered one at a time, in the order their inputs entered the trace;
a turn published while another runs waits behind it.

A turn with a CancelRequested ends as cancelled at its next step, whatever it was waiting on:
every call of the turn still without a result gets a synthetic cancelled result (so the
history stays valid: field case C27), then the turn fails with code ``cancelled``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from agentstream.context import reopen_result
from agentstream.context.cited import read_back, result_sources
from agentstream.context.elements import Numbering
from agentstream.declarations.agents import Agent
from agentstream.declarations.inputs import TurnDenied
from agentstream.declarations.tools import Tool
from agentstream.delegation import offered_agent
from agentstream.delegation.handoff import numbering_of
from agentstream.errors import ConfigError
from agentstream.models.endpoints import ModelEndpoint
from agentstream.steps.approvals import AwaitApproval, RecordApprovals, gate_calls
from agentstream.steps.offers import latest_offer
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    CancelRequested,
    CitedSource,
    Event,
    ModelOutput,
    OfferedTool,
    TaskInput,
    ToolCall,
    ToolOutput,
    ToolsOffered,
    TurnEnded,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode

EMPTY_REPLY_RETRIES = 1

PASSES_CAP_CODE = FailureCode.PASSES_CAP
"""The ToolOutput error of a call past the passes cap, and the TurnFailed code of a turn whose
model would not stop calling tools."""

PASSES_CAP_DIRECTIVE = (
    "Not run: this turn has reached its limit of {cap} model calls that use tools. "
    "Do not call any more tools; answer now with what you have."
)
"""The result each tool call past the passes cap gets instead of running (``{cap}``: the cap)."""

_ABNORMAL_STOPS = {
    "unknown": "ended for a reason agentstream does not know",
    "pause": "was paused by the provider (continuing a paused turn is not supported)",
    "interrupted": "was interrupted before the reply completed",
}
"""Stop reasons that end the turn as failed (besides refusal and content filter)."""
"""How many times an empty model reply is retried before the turn fails."""


@dataclass(frozen=True)
class CallModel:
    """Call the model for pass ``step`` of the turn."""

    turn: TurnInput
    agent: Agent
    step: int


@dataclass(frozen=True)
class RecordResults:
    """Append these results (calls that must not run: unknown tool, cut-off arguments)."""

    turn: TurnInput
    results: tuple[ToolOutput, ...]


@dataclass(frozen=True)
class RunTools:
    """Tool calls of pass ``step`` still lack results: make sure their jobs are published."""

    turn: TurnInput
    agent: Agent
    step: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class EndTurn:
    """End the turn with ``answer`` (without the citation marks that resolved) and the sources it
    cites; ``answer_call`` is the tool call whose result is the answer (``Agent.result_as_answer``)."""

    turn: TurnInput
    answer: str
    citations: tuple[CitedSource, ...] = ()
    answer_call: str | None = None


@dataclass(frozen=True)
class FailTurn:
    turn: TurnInput
    code: str
    reason: str


@dataclass(frozen=True)
class CancelTurn:
    """The turn was cancelled: record ``results`` (calls left without one), then end it."""

    turn: TurnInput
    results: tuple[ToolOutput, ...]
    code: str
    reason: str


@dataclass(frozen=True)
class Idle:
    """No turn is waiting for this trace."""


Decision = (
    CallModel | RecordResults | RunTools | EndTurn | FailTurn | CancelTurn | Idle | AwaitApproval | RecordApprovals
)

CANCELLED_CODE = FailureCode.CANCELLED
"""The TurnFailed code of a cancelled turn."""


def final_stop_reason(events: Sequence[Event], turn_id: str) -> str | None:
    """The stop reason of the turn's last model output when it was not a normal stop (``length``:
    cut off by the output token limit), else None (for the reply's ``stop_reason``)."""
    last = next((e for e in reversed(events) if isinstance(e, ModelOutput) and e.turn_id == turn_id), None)
    return last.stop_reason if last is not None and not last.stopped_normally else None


def active_turn(events: Sequence[object]) -> TurnInput | None:
    """The oldest turn of the trace without an ending, or None."""
    ended = {e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))}
    for event in events:
        if isinstance(event, TurnInput) and event.turn_id not in ended:
            return event
    return None


@dataclass(frozen=True)
class TurnView:
    """What the next decision of a trace reads: its running turn and that turn's events.

    Gathered by scanning a whole trace (:func:`turn_view`) or kept up to date event by event
    (:class:`agentstream.steps.trace_fold.TraceFold`); :func:`decide_view` gives the same decision from either.

    Attributes:
        turn: the oldest turn without an ending, or None (the trace is idle).
        cancel: the turn's first CancelRequested, or None.
        outputs: the turn's model outputs, in trace order.
        results: the turn's tool results (late ones too), in trace order.
        reopen: ``reopen(agent, call)`` → the recorded result of a call of the context library's
            reopen tool, or None when ``call`` is not one (see
            :func:`agentstream.context.reopen_result`).
        offer_of: ``offer_of(agent name)`` → the agent's latest MCP tool offer in the trace, or None.
        numbering: ``numbering()`` → the trace's element numbering (read only for an agent that cites).
        awaited: the turn's calls recorded as awaiting approval, by call id.
        decided: the turn's first approval decision of each call, by call id.
        now_ms: the time of the decision (Unix ms), or None (nothing is due: a reader without a clock).
    """

    turn: TurnInput | None
    cancel: CancelRequested | None = None
    outputs: tuple[ModelOutput, ...] = ()
    results: tuple[ToolOutput, ...] = ()
    reopen: Callable[[Agent, ToolCall], ToolOutput | None] | None = None
    offer_of: Callable[[str], ToolsOffered | None] | None = None
    numbering: Callable[[], Numbering] | None = None
    awaited: Mapping[str, ApprovalAwaited] = dataclasses.field(default_factory=dict)
    decided: Mapping[str, ApprovalDecided] = dataclasses.field(default_factory=dict)
    now_ms: int | None = None

    def with_output(self, output: ModelOutput) -> TurnView:
        """The view once ``output`` (of this view's turn) is appended, nothing else coming between."""
        return dataclasses.replace(self, outputs=(*self.outputs, output))


def turn_view(events: Sequence[Event]) -> TurnView:
    """The :class:`TurnView` of a whole trace (oldest event first), by scanning it."""
    turn = active_turn(events)
    if turn is None:
        return TurnView(None)
    tid = turn.turn_id
    cancel = next((e for e in events if isinstance(e, CancelRequested) and e.turn_id == tid), None)
    outputs = tuple(e for e in events if isinstance(e, ModelOutput) and e.turn_id == tid)
    results = tuple(e for e in events if isinstance(e, ToolOutput) and e.turn_id == tid)
    awaited: dict[str, ApprovalAwaited] = {}
    decided: dict[str, ApprovalDecided] = {}
    for e in events:
        if isinstance(e, ApprovalAwaited) and e.turn_id == tid:
            awaited.setdefault(e.call_id, e)
        elif isinstance(e, ApprovalDecided) and e.turn_id == tid:
            decided.setdefault(e.call_id, e)
    return TurnView(
        turn,
        cancel,
        outputs,
        results,
        reopen=lambda agent, call: reopen_result(events, agent, tid, call),
        offer_of=lambda name: latest_offer(events, name),
        numbering=lambda: numbering_of(events),
        awaited=awaited,
        decided=decided,
    )


def decide(
    events: Sequence[Event],
    agent_of: Callable[[str], Agent | None],
    endpoints: Mapping[str, ModelEndpoint] | None = None,
) -> Decision:
    """The next step of the trace.

    Args:
        events: the whole trace, oldest first.
        agent_of: looks an agent up by name (``App.agent``).
        endpoints: the configured model endpoints by id (an agent without ``model_limits``
            gets its endpoint's, see :func:`agentstream.delegation.offered_agent`).
    """
    return decide_view(turn_view(events), agent_of, endpoints)


def decide_view(
    view: TurnView, agent_of: Callable[[str], Agent | None], endpoints: Mapping[str, ModelEndpoint] | None = None
) -> Decision:
    """The next step of a trace from its :class:`TurnView` (see :func:`decide`).

    A chain of passes, each deciding or handing on, in this order (the first that decides wins):

    1. no turn runs → :class:`Idle`;
    2. the turn was cancelled → :class:`CancelTurn`, whatever it waited on (before anything
       else: a cancelled turn calls nothing more, even with its agent gone);
    3. :func:`_refused_turn`: an agent the app does not have, a model the agent may not use, its
       settings function says no → :class:`FailTurn` (before any model call);
    4. :func:`_first_call`: no output yet → :class:`CallModel` step 0 (or :class:`FailTurn` for a
       required tool that is not offered);
    5. :func:`_abnormal_stop`: the last output was refused, filtered, paused, interrupted →
       :class:`FailTurn` (its tool calls never run: field case C14);
    6. :func:`_after_tool_calls`: the last output called tools → results of calls that must not
       run, the calls to run, the answer a tool result gives, or the next call;
    7. :func:`_after_text`: a cut-off or empty reply → fail or call again; else the answer.
    """
    turn = view.turn
    if turn is None:
        return Idle()
    if view.cancel is not None:
        return _cancel_view(view, turn, view.cancel)
    agents = _refused_turn(turn, agent_of, endpoints)
    if isinstance(agents, FailTurn):
        return agents
    agent, offered = agents
    if not view.outputs:
        return _first_call(view, turn, offered)
    last = view.outputs[-1]
    stopped = _abnormal_stop(turn, last)
    if stopped is not None:
        return stopped
    if last.tool_calls:
        return _after_tool_calls(view, turn, agent, offered, last)
    return _after_text(view, turn, agent, offered, last)


def _refused_turn(
    turn: TurnInput, agent_of: Callable[[str], Agent | None], endpoints: Mapping[str, ModelEndpoint] | None
) -> FailTurn | tuple[Agent, Agent]:
    """Pass 3: the turn's agent with its settings for the turn, and as the turn is offered it (a
    child's model and depth: delegations withheld at the limit), or the FailTurn that refuses it."""
    agent = agent_of(turn.agent)
    if agent is None:
        return FailTurn(turn, FailureCode.UNKNOWN_AGENT, f"no agent named {turn.agent!r} in this app")
    refused = model_refusal(agent, turn, endpoints)
    if refused is not None:
        return FailTurn(turn, FailureCode.BAD_TURN, refused)
    try:
        agent = agent.for_turn(turn)  # its settings function's changes for this turn
    except TurnDenied as exc:
        return FailTurn(turn, exc.code, exc.reason)
    except ConfigError as exc:
        return FailTurn(
            turn,
            FailureCode.CONFIG,
            f"agent {agent.name!r}: its settings for turn {turn.turn_id!r} are not valid: {exc}",
        )
    return agent, offered_agent(agent, turn, endpoints)


def _first_call(view: TurnView, turn: TurnInput, offered: Agent) -> Decision:
    """Pass 4: the turn's first model call, unless a tool the turn requires is not offered."""
    unlisted = unlisted_required(offered, turn, view.offer_of(offered.name) if view.offer_of is not None else None)
    if unlisted is not None:
        return FailTurn(turn, FailureCode.BAD_TURN, unlisted)
    return CallModel(turn, offered, 0)


def _abnormal_stop(turn: TurnInput, last: ModelOutput) -> FailTurn | None:
    """Pass 5: the turn fails when its last output was refused, filtered or stopped abnormally."""
    if last.stop_reason in ("refusal", "content_filter"):
        detail = f": {last.stop_detail}" if last.stop_detail else ""
        what = "refused" if last.stop_reason == "refusal" else "was stopped by the provider's content filter"
        return FailTurn(turn, FailureCode(last.stop_reason), f"the model {what}{detail}")
    if last.stop_reason in _ABNORMAL_STOPS:  # C14: never taken for a success, its tool calls never run
        detail = f" ({last.stop_detail})" if last.stop_detail else ""
        return FailTurn(
            turn, FailureCode(last.stop_reason), f"model call {last.step} {_ABNORMAL_STOPS[last.stop_reason]}{detail}"
        )
    return None


def _after_tool_calls(view: TurnView, turn: TurnInput, agent: Agent, offered: Agent, last: ModelOutput) -> Decision:
    """Pass 6, for an output that called tools, in order: record the results of calls that must
    not run; run the calls still without a result; end the turn with a result that is its answer;
    fail a model that kept calling withdrawn tools; else call the model again."""
    # the passes cap counts the calls that called tools (since the last answer to a request,
    # with resets_on_answer); past it, calls do not run
    before = passes_before(agent, view.outputs, view.results)
    tool_passes = before[-1] + 1
    past_cap = tool_passes > agent.max_passes or agent.tool_choice_at(tool_passes - 1, last.step) == "none"
    results = {e.call_id for e in view.results}
    unrunnable = [
        result
        for call in last.tool_calls
        if call.id not in results and (result := _unrunnable(view, turn, agent, last, call, past_cap)) is not None
    ]
    if unrunnable:
        return RecordResults(turn, tuple(unrunnable))
    pending = tuple(c for c in last.tool_calls if c.id not in results)
    if pending:
        offer = view.offer_of(agent.name) if view.offer_of is not None else None
        mcp_tools = {t.name: t for t in offer.tools} if offer is not None else None
        gated = gate_calls(agent, turn, pending, mcp_tools, view.awaited, view.decided, view.now_ms)
        if isinstance(gated, AwaitApproval | RecordApprovals):
            return gated
        if gated and isinstance(gated[0], ToolOutput):
            return RecordResults(turn, tuple(r for r in gated if isinstance(r, ToolOutput)))
        return RunTools(turn, agent, last.step, tuple(c for c in gated if isinstance(c, ToolCall)))
    answer = result_answer(agent, last, view.results)
    if answer is not None:  # a tool whose result is the turn's answer: the model is not called again
        return _answered_by_result(view, turn, agent, answer)
    withheld = 0  # calls that called tools although none were offered (the server ignored it)
    for passes, output in zip(before, view.outputs, strict=True):
        withheld += bool(output.tool_calls) and agent.tool_choice_at(passes, output.step) == "none"
    if withheld > 1:
        return FailTurn(
            turn,
            PASSES_CAP_CODE,
            f"the agent {agent.name!r} reached its passes cap of {agent.max_passes} model calls with tools, "
            f"and its model kept calling tools after they were withdrawn ({withheld} times); "
            "raise max_passes or simplify the task",
        )
    return CallModel(turn, offered, last.step + 1)


def _unrunnable(
    view: TurnView, turn: TurnInput, agent: Agent, last: ModelOutput, call: ToolCall, past_cap: bool
) -> ToolOutput | None:
    """The result a call gets instead of running, or None when it runs. In order: past the passes
    cap; cut off mid-call; the context library's reopen tool (recorded here, run nowhere); a tool
    the agent does not have; with repeats off, a call made before (its earlier result again)."""
    if past_cap:
        return _error_result(turn, call, PASSES_CAP_CODE, PASSES_CAP_DIRECTIVE.format(cap=agent.max_passes))
    if last.stop_reason == "length":
        return _error_result(
            turn,
            call,
            "cut_off",
            "Error: your reply was cut off by the output token limit "
            "in the middle of this tool call, so it was not run. Make the arguments shorter.",
        )
    if view.reopen is not None and (reopened := view.reopen(agent, call)) is not None:
        return reopened
    own = _turn_tool(agent, turn, call.name)
    if own is None and _offered(view, agent, turn, call.name) is None:
        return _unknown_tool(view, turn, agent, call)
    if own is not None and not agent.repeats_of(call.name):
        return repeated_result(view, call)  # repeats off: the earlier result again, marked; not run
    return None


def _unknown_tool(view: TurnView, turn: TurnInput, agent: Agent, call: ToolCall) -> ToolOutput:
    """The error result of a call of a tool the agent does not have, naming the ones it has."""
    offer = view.offer_of(agent.name) if view.offer_of is not None else None
    off = agent.off_tools(turn) if offer else frozenset()
    names = ", ".join(
        [
            *(t.name for t in agent.offered_tools(turn)),
            *(t.name for t in (offer.tools if offer else ()) if t.name not in off),
        ]
    )
    return _error_result(
        turn, call, "unknown_tool", f"Error: there is no tool named {call.name!r}. Available tools: {names or 'none'}."
    )


def _answered_by_result(view: TurnView, turn: TurnInput, agent: Agent, answer: ToolOutput) -> EndTurn:
    """The turn's end with a tool result as its answer (``Agent.result_as_answer``)."""
    ended = _end_turn(view, turn, agent, answer.text.strip(), answer_call=answer.call_id)
    cites = agent.context is not None and agent.context.citations is not None
    if cites and not ended.citations and answer.elements and view.numbering is not None:
        # no marks to read back: the answer rests on the sources its result carries
        sources = result_sources(ended.answer, answer.elements, view.numbering())
        ended = dataclasses.replace(ended, citations=sources)
    return ended


def _after_text(view: TurnView, turn: TurnInput, agent: Agent, offered: Agent, last: ModelOutput) -> Decision:
    """Pass 7, for an output without tool calls: a reply cut off before any answer fails the
    turn; an empty one is retried (:data:`EMPTY_REPLY_RETRIES`) then fails it; else it is the answer."""
    if last.stop_reason == "length" and not last.content.strip():
        return FailTurn(
            turn, FailureCode.CUT_OFF, "the model's reply was cut off by the output token limit before any answer"
        )
    if not last.content.strip():
        empty_in_a_row = 0
        for output in reversed(view.outputs):
            if output.tool_calls or output.content.strip():
                break
            empty_in_a_row += 1
        if empty_in_a_row <= EMPTY_REPLY_RETRIES:
            return CallModel(turn, offered, last.step + 1)
        return FailTurn(turn, FailureCode.EMPTY_REPLY, f"the model gave an empty reply {empty_in_a_row} times in a row")
    return _end_turn(view, turn, agent, last.content.strip())


def _turn_tool(agent: Agent, turn: TurnInput, name: str) -> Tool | None:
    """The agent's own tool ``name`` when the turn offers it (declared, supplied, not ``off``), else None."""
    tool = agent.tool(name)
    if tool is None or agent.declared is None and turn.tools is None:
        return tool
    return tool if any(t is tool for t in agent.offered_tools(turn)) else None


def _same_arguments(a: str, b: str) -> bool:
    """Whether two calls' argument texts say the same (equal JSON, whatever the spacing and key order)."""
    if a == b:
        return True
    try:
        same: bool = json.loads(a or "{}") == json.loads(b or "{}")
        return same
    except ValueError:
        return False


def repeated_result(view: TurnView, call: ToolCall) -> ToolOutput | None:
    """The result a call gets when its tool's repeats are off and a call of an earlier model call
    of the turn (same tool, same arguments: equal JSON) succeeded: that result again, with
    ``repeat_of`` naming the earlier call; None when none did. Identical calls of one model call
    all run (their jobs go out together).
    """
    by_call = {r.call_id: r for r in view.results}
    for output in view.outputs:
        if any(c.id == call.id for c in output.tool_calls):
            return None  # only calls of earlier model calls (those of one call run together)
        for earlier in output.tool_calls:
            if earlier.name != call.name or not _same_arguments(earlier.arguments, call.arguments):
                continue
            result = by_call.get(earlier.id)
            if result is not None and result.error is None and not result.late:
                assert view.turn is not None  # a turn with model calls has its input
                return msgspec.structs.replace(
                    result,
                    call_id=call.id,
                    repeat_of=result.repeat_of or earlier.id,
                    duration_ms=0.0,
                    turn_id=view.turn.turn_id,
                )
    return None


def passes_before(agent: Agent, outputs: Sequence[ModelOutput], results: Sequence[ToolOutput]) -> tuple[int, ...]:
    """For each of a turn's model outputs (in step order), how many earlier calls of the turn
    called tools, as the passes cap counts them (:meth:`Agent.tool_choice_at`).

    Every call with tool calls counts; with ``Agent.resets_on_answer`` the count starts again
    after a call whose tool calls got an answer to a request (:meth:`Agent.answers_request`:
    a subagent's result). A call's results all come before the next call is made, so the count
    of a call never changes once the call is made. The context library counts the same way
    (:meth:`agentstream.context._context_fold.ContextFold.tool_choice`).
    """
    answered: set[str] = set()
    if agent.resets_on_answer:
        seen: set[str] = set()
        for result in results:  # the first result of a call counts (a late one never does)
            if result.call_id in seen:
                continue
            seen.add(result.call_id)
            if agent.answers_request(result):
                answered.add(result.call_id)
    out = []
    count = 0
    for output in outputs:
        out.append(count)
        if output.tool_calls:
            count += 1
            if answered and any(call.id in answered for call in output.tool_calls):
                count = 0
    return tuple(out)


def _offered(view: TurnView, agent: Agent, turn: TurnInput, name: str) -> OfferedTool | None:
    """The MCP tool ``name`` as the agent's calls last offered it (see :func:`offered_tool`), or
    None (also when the turn turns it off: a declaration names it)."""
    offer = view.offer_of(agent.name) if view.offer_of is not None else None
    if offer is None:
        return None
    tool = next((t for t in offer.tools if t.name == name), None)
    if tool is not None and agent.declared is not None and name in agent.off_tools(turn):
        return None
    return tool


def unlisted_required(agent: Agent, turn: TurnInput, offer: ToolsOffered | None) -> str | None:
    """Why ``turn`` cannot run: it requires a declared MCP tool that the agent's servers do not
    list (``offer``: the agent's latest recorded offer), or None."""
    if offer is None or not agent.mcp_servers or agent.declared is None:
        return None
    own = {t.name for t in agent.tools}
    listed = {t.name for t in offer.tools}
    missing = [
        n for n, state in agent.turn_states(turn).items() if state == "required" and n not in own and n not in listed
    ]
    if not missing:
        return None
    servers = ", ".join(s.name for s in agent.mcp_servers)
    return (
        f"turn {turn.turn_id!r} requires tool {missing[0]!r}, which no MCP server of agent {agent.name!r} lists "
        f"(servers: {servers}; they list: {', '.join(sorted(listed)) or 'nothing'})"
    )


def result_answer(agent: Agent, output: ModelOutput, results: Sequence[ToolOutput]) -> ToolOutput | None:
    """The result that is the turn's answer, or None: the first call of ``output`` (in call
    order) to a tool the agent names in ``result_as_answer`` whose first result succeeded and
    has text (a call past the passes cap, an error or an empty result is no answer)."""
    if not agent.result_as_answer:
        return None
    first: dict[str, ToolOutput] = {}
    result: ToolOutput | None
    for result in results:
        first.setdefault(result.call_id, result)
    for call in output.tool_calls:
        if call.name not in agent.result_as_answer:
            continue
        result = first.get(call.id)
        if result is not None and result.error is None and not result.late and result.text.strip():
            return result
    return None


def _end_turn(view: TurnView, turn: TurnInput, agent: Agent, answer: str, answer_call: str | None = None) -> EndTurn:
    style = agent.context.citations if agent.context is not None else None
    if style is None or view.numbering is None:
        return EndTurn(turn, answer, answer_call=answer_call)
    text, citations = read_back(answer, view.numbering(), style)
    return EndTurn(turn, text.strip() or answer, citations, answer_call=answer_call)


def end_turn(events: Sequence[Event], turn: TurnInput, agent: Agent, answer: str) -> EndTurn:
    """The ending of a turn whose answer is ``answer``: for an agent that cites, its marks read
    back against the trace's numbering (see :mod:`agentstream.context.cited`)."""
    style = agent.context.citations if agent.context is not None else None
    if style is None:
        return EndTurn(turn, answer)
    text, citations = read_back(answer, numbering_of(events), style)
    return EndTurn(turn, text.strip() or answer, citations)


def model_refusal(agent: Agent, turn: TurnInput, endpoints: Mapping[str, ModelEndpoint] | None) -> str | None:
    """Why ``turn`` may not run on the model it names, or None when it may (or names none).

    A turn may name its agent's ``model`` or one of its ``models`` that is configured; one that
    names none runs on the agent's ``model``, and is refused when the agent has none. A child
    trace's task runs on the model its delegation chose.
    """
    name = turn.model
    allowed = ", ".join(agent.allowed_models)
    if name is None:
        if agent.model is not None:
            return None
        return (
            f"turn {turn.turn_id!r} names no model in its field `model`, and agent {agent.name!r} has no default "
            f"model: name one of {allowed}"
        )
    if isinstance(turn, TaskInput) or name == agent.model:
        return None
    if name not in agent.allowed_models:
        return (
            f"turn {turn.turn_id!r} names model {name!r} in its field `model`, which agent {agent.name!r} "
            f"does not allow (allowed: {allowed})"
        )
    if endpoints is not None and name not in endpoints:
        return f"turn {turn.turn_id!r} names model {name!r} in its field `model`, which is not configured (allowed: {allowed})"
    return None


def cancel_turn(events: Sequence[Event], turn: TurnInput, cancel: CancelRequested) -> CancelTurn:
    """The cancel of ``turn``: a cancelled result for each of its calls without one, and the reason."""
    tid = turn.turn_id
    view = TurnView(
        turn,
        cancel,
        tuple(e for e in events if isinstance(e, ModelOutput) and e.turn_id == tid),
        tuple(e for e in events if isinstance(e, ToolOutput) and e.turn_id == tid),
        awaited={e.call_id: e for e in reversed(events) if isinstance(e, ApprovalAwaited) and e.turn_id == tid},
        decided={e.call_id: e for e in reversed(events) if isinstance(e, ApprovalDecided) and e.turn_id == tid},
    )
    return _cancel_view(view, turn, cancel)


def _cancel_view(view: TurnView, turn: TurnInput, cancel: CancelRequested) -> CancelTurn:
    """The cancel of the view's turn: a cancelled result for each call without one. A call of a
    model output that still waits for a person's decision never ran (no job of that output goes out
    until every call of it is decided: :func:`agentstream.steps.approvals.gate_calls`), and its
    result says so; any other call may have partly run."""
    who = f"by {cancel.by}" if cancel.by else ""
    why = f": {cancel.reason}" if cancel.reason else ""
    ran = [o for o in view.outputs if not _held_for_approval(o, view)]
    held = [o for o in view.outputs if _held_for_approval(o, view)]
    may_have_run = unanswered_of(
        ran,
        view.results,
        turn,
        CANCELLED_CODE,
        f"Cancelled {who}{why} before this call returned a result; it may have partly run.",
    )
    never_ran = tuple(
        msgspec.structs.replace(
            r, text=f"Cancelled {who}{why} while {_awaiting_whom(r.call_id, view)}; it did not run."
        )
        for r in unanswered_of(held, view.results, turn, CANCELLED_CODE, "")
    )
    results = tuple(sorted((*may_have_run, *never_ran), key=_call_order(view.outputs)))
    return CancelTurn(turn, results, CANCELLED_CODE, f"the turn was cancelled {who}{why}".rstrip())


def _awaiting_whom(call_id: str, view: TurnView) -> str:
    """Why a call held for approval did not run: it awaited a person, or waited beside one that did."""
    if call_id in view.awaited and call_id not in view.decided:
        return "this call awaited a person's approval"
    return "another call of the same model output awaited a person's approval (they run together)"


def _held_for_approval(output: ModelOutput, view: TurnView) -> bool:
    """Whether no job of ``output``'s calls went out: one of them awaits a decision."""
    return any(c.id in view.awaited and c.id not in view.decided for c in output.tool_calls)


def _call_order(outputs: Sequence[ModelOutput]) -> Callable[[ToolOutput], int]:
    """A sort key: a result's place among the calls of ``outputs``, in call order."""
    place = {c.id: i for i, c in enumerate(c for o in outputs for c in o.tool_calls)}
    return lambda result: place.get(result.call_id, len(place))


def unanswered_results(events: Sequence[Event], turn: TurnInput, error: str, text: str) -> tuple[ToolOutput, ...]:
    """An error result (``error``, ``text``) for each call of ``turn`` that has no result yet, in
    call order: what a turn that ends early appends first, so no call is left dangling."""
    tid = turn.turn_id
    outputs = [e for e in events if isinstance(e, ModelOutput) and e.turn_id == tid]
    results = [e for e in events if isinstance(e, ToolOutput) and e.turn_id == tid]
    return unanswered_of(outputs, results, turn, error, text)


def unanswered_of(
    outputs: Sequence[ModelOutput], results: Sequence[ToolOutput], turn: TurnInput, error: str, text: str
) -> tuple[ToolOutput, ...]:
    """:func:`unanswered_results` from the turn's own model outputs and tool results."""
    answered = {e.call_id for e in results}
    out = []
    for event in outputs:
        for call in event.tool_calls:
            if call.id in answered:
                continue
            answered.add(call.id)
            out.append(_error_result(turn, call, error, text))
    return tuple(out)


def _error_result(turn: TurnInput, call: ToolCall, error: str, text: str) -> ToolOutput:
    return ToolOutput(turn_id=turn.turn_id, call_id=call.id, name=call.name, text=text, error=error)
