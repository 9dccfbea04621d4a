"""Hand-off: a delegation call becomes a child trace's TaskInput, or an error result (pure).

See :mod:`agentstream.delegation` for the whole flow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from agentstream.context.elements import Numbering
from agentstream.declarations.agents import Agent
from agentstream.delegation.tool import Delegation
from agentstream.errors import ToolArgumentsError
from agentstream.models.endpoints import ModelEndpoint
from agentstream.wire.events import Event, ModelOutput, TaskInput, ToolCall, ToolOutput, TurnInput


class ChildEnded(msgspec.Struct, frozen=True, kw_only=True):
    """A hint on the child-endings stream: this child trace's turn ended; hand its result back.

    Attributes:
        trace_id: the child trace.
        turn_id: the child's turn (its TaskInput).
        trace_context: the OpenTelemetry context of the child's last step (W3C ``traceparent``,
            ``tracestate``; empty without tracing), see :mod:`agentstream.ops.tracing`.
    """

    trace_id: str
    turn_id: str = ""
    trace_context: dict[str, str] = {}


_ending_decoder = msgspec.json.Decoder(ChildEnded)


def decode_child_ended(payload: bytes) -> ChildEnded:
    """The JSON of a child ending → :class:`ChildEnded` (raises ``msgspec.DecodeError``)."""
    return _ending_decoder.decode(payload)


# --- which tools a trace's model is offered --------------------------------------------------

MEMO_ENTRIES = 256  # the most entries of each memo below (agents made per turn would fill them)
_OFFERED: dict[tuple[int, tuple[str, ...], str | None, Any, int], tuple[Agent, Agent]] = {}
_BY_TURN: dict[tuple[int, int, int], tuple[Agent, Any, Any, Agent]] = {}  # (agent, turn, endpoint) → offered


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep ``value`` under ``key``, dropping the oldest entry past :data:`MEMO_ENTRIES` (an
    agent's settings function makes an agent per turn; an unbounded memo would keep them all)."""
    if key not in memo and len(memo) >= MEMO_ENTRIES:
        memo.pop(next(iter(memo)))
    memo[key] = value


def depth_of(turn: TurnInput) -> int:
    """The delegation depth of a turn: 0 for a root trace's turn, the task's depth for a child."""
    return turn.depth if isinstance(turn, TaskInput) else 0


_CAPPED: dict[tuple[int, int], tuple[Any, Any]] = {}


def _reserve_capped(agent: Agent, endpoint: ModelEndpoint) -> Any:
    """The agent's context settings with the output reserve at most what a call may write
    (the same object for the same inputs, so caches keyed by settings keep working)."""
    from agentstream.context.builder import DEFAULT_CONFIG
    from agentstream.context.limits import Tokens

    config = agent.context if agent.context is not None else DEFAULT_CONFIG
    cap = agent.max_output_tokens + (endpoint.thinking_budget_tokens or 0)
    if config.policy.output_reserve.count <= cap:
        return agent.context
    cached = _CAPPED.get((id(config), cap))
    if cached is not None and cached[0] is config:
        return cached[1]
    policy = dataclasses.replace(config.policy, output_reserve=Tokens(cap))
    capped = dataclasses.replace(config, policy=policy)
    _remember(_CAPPED, (id(config), cap), (config, capped))
    return capped


def offered_agent(agent: Agent, turn: TurnInput, endpoints: Mapping[str, ModelEndpoint] | None = None) -> Agent:
    """The agent as a model call of ``turn`` sees it.

    In a child trace the agent runs on the model its task names, and each delegation whose
    ``max_depth`` the child has reached is withheld (not offered), so the chain of subagents
    ends (field case C30). An agent without ``model_limits`` gets the limits of the endpoint
    it runs on (its window and characters per token, :attr:`ModelEndpoint.limits`); limits
    that name no model get the endpoint's model name, so token counts and corrections are per
    model (a count one model recorded never sizes a call to another); and its
    policy's output reserve is capped at what its calls may write (``max_output_tokens`` plus
    the endpoint's thinking budget), so a small window (the local model's 8192 tokens) is not
    all reserved for an output the request never allows. This is the one place where limits
    come from the endpoints, so the agent loop, the compaction service and replay build the
    same context. The same agent object comes back for the same inputs, so caches keyed by
    agent keep working.

    Args:
        agent: the agent that answers the turn.
        turn: the turn being answered (a TaskInput in a child trace).
        endpoints: the configured model endpoints by id; None (or an endpoint not among them)
            leaves an agent without limits on the default limits.

    Returns:
        ``agent`` itself when nothing changes, else a copy with the turn's settings (its
        ``settings`` function's changes), without the withheld tools, with the task's model and
        with its endpoint's limits.

    Raises:
        TurnDenied: the agent's settings function refuses the turn.
        ConfigError: the settings it returned are not valid.
    """
    # Asked at every decision of every step (twice a step in the agent loop): the answer for the
    # same agent, turn event and endpoint is kept, so a step pays one lookup, not the settings,
    # the limits and the hashing of the memo keys below.
    model = turn.model or agent.model
    endpoint = endpoints.get(model) if endpoints and model is not None else None
    key = (id(agent), id(turn), id(endpoint))
    held = _BY_TURN.get(key)
    if held is not None and held[0] is agent and held[1] is turn and held[2] is endpoint:
        return held[3]
    offered = _offered_agent(agent, turn, endpoints)
    _remember(_BY_TURN, key, (agent, turn, endpoint, offered))
    return offered


def _offered_agent(agent: Agent, turn: TurnInput, endpoints: Mapping[str, ModelEndpoint] | None) -> Agent:
    agent = agent.for_turn(turn)  # the agent's settings function's changes for this turn (cached)
    depth = depth_of(turn)
    withheld = tuple(t.name for t in agent.tools if t.delegated and depth >= t.max_depth)  # type: ignore[attr-defined]
    model = turn.model or agent.model  # the turn's model (refused by decide unless allowed), a child's task's
    limits = agent.model_limits
    config = agent.context
    endpoint = endpoints.get(model) if endpoints and model is not None else None
    if endpoint is not None and limits is None:
        limits = endpoint.limits
        config = _reserve_capped(agent, endpoint)
    elif endpoint is not None and limits is not None and limits.model is None:
        limits = dataclasses.replace(limits, model=endpoint.model)  # counts of this model only correct it
    if not withheld and model == agent.model and limits is agent.model_limits and config is agent.context:
        return agent
    key = (id(agent), withheld, model, limits, id(config))
    cached = _OFFERED.get(key)
    if cached is not None and cached[0] is agent:
        return cached[1]
    copy = dataclasses.replace(
        agent,
        tools=[t for t in agent.tools if t.name not in withheld],
        model=model,
        model_limits=limits,
        context=config,
    )
    _remember(_OFFERED, key, (agent, copy))
    return copy


# --- hand-off ---------------------------------------------------------------------------------


def child_trace_id(parent_trace_id: str, call_id: str) -> str:
    """The id of the child trace that a call opens: ``<parent trace>/<call id>``.

    Deterministic, so a hand-off that runs twice opens the same child once. In the call id,
    braces become parentheses (a hash tag of its own would move the child to another slot) and
    ``/`` becomes ``%2F``, so the part after the last ``/`` is always the call and the rest the
    parent (what :func:`child_trace_refusal` relies on); a call id ``.`` or ``..`` becomes ``%2E``
    or ``%2E%2E`` (a dot segment: see :func:`agentstream.wire.keys.trace_id_problem`).
    """
    part = call_id.replace("{", "(").replace("}", ")").replace("/", "%2F")
    if part in (".", ".."):
        part = part.replace(".", "%2E")
    return f"{parent_trace_id}/{part}"


def parent_ids(trace_id: str) -> list[str]:
    """Every trace id a child trace ``trace_id`` could descend from, nearest first: each part
    of it before a ``/`` (``a/b/c`` → ``a/b``, ``a``), the empty one left out."""
    parts = trace_id.split("/")
    return [p for p in ("/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)) if p]


def child_trace_refusal(trace_id: str, turn_id: str, first: Event | None, *, ancestor: str | None) -> str | None:
    """Why a published (root) turn may not enter ``trace_id`` → the reason, or None when it may.

    Delegations open child traces (:func:`child_trace_id`: ``<parent trace>/<call id>``), whose
    first event is their task. A turn published into one would run in a subagent's context and
    read it back in its reply; one published before the child opens would make its history the
    subagent's context and hide the task from the hand-back. So a turn may not enter a trace
    that begins with a :class:`TaskInput`, nor begin a trace whose id could be that of a
    descendant of an existing trace (one of :func:`parent_ids` exists). A conversation whose own
    id holds ``/`` (``org/conv-7`` where no trace ``org`` exists) is a conversation like any other.

    Args:
        trace_id: the trace the turn names.
        turn_id: the turn's id (for the reason).
        first: the trace's first event, or None when it has none.
        ancestor: the nearest of :func:`parent_ids` that exists, or None (only read when
            ``first`` is None).
    """
    if "/" not in trace_id:
        return None
    if first is not None:
        if not isinstance(first, TaskInput):
            return None
        return (
            f"turn {turn_id!r} names trace {trace_id!r}, a child trace (opened by delegation {first.delegation!r} "
            f"of trace {first.parent_trace_id!r}): only its parent's delegation gives it work; the turn was not run "
            "and nothing was written to that trace"
        )
    if ancestor is not None:
        return (
            f"turn {turn_id!r} names trace {trace_id!r}, which has the form of a child trace of conversation "
            f"{ancestor!r} (<trace id>/<call id>, opened by delegations only): the turn was not run and nothing was "
            "written to that trace; give a conversation an id of its own"
        )
    return None


def task_digest(agent: str, arguments: Any) -> str:
    """The fingerprint of a task: the agent and its arguments as canonical JSON (16 hex digits)."""
    canonical = json.dumps({"agent": agent, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class HandOff:
    """A call that opens a child: the child's trace id and its first event."""

    child_trace_id: str
    task: TaskInput


def _turn(events: Sequence[Event], turn_id: str) -> TurnInput | None:
    return next((e for e in events if isinstance(e, TurnInput) and e.turn_id == turn_id), None)


def numbering_of(events: Sequence[Event]) -> Numbering:
    """The element numbering of a trace (every input's and result's elements, in order)."""
    numbering = Numbering()
    for event in events:
        numbering.add_event(event)
    return numbering


def task_model(
    delegation: Delegation, child: Agent | None, parent_events: Sequence[Event], call: ToolCall, turn: TurnInput | None
) -> str | None:
    """The model endpoint a delegated task runs on (the ``model`` its TaskInput records).

    The rule: the delegation's own ``model`` when it names one; else the child agent's model when
    the child pins one (its ``model`` is set to an endpoint other than ``default``); else the
    model of the parent's call that delegated (the endpoint its model output records, or the
    parent turn's ``model``), as the seed says a task that names no model runs on the model of
    the parent's latest input. None (nothing known) runs the child on its own model.
    """
    if delegation.model is not None:
        return delegation.model
    if child is not None and child.model not in (None, "default"):
        return child.model
    for event in reversed(parent_events):
        if isinstance(event, ModelOutput) and any(c.id == call.id for c in event.tool_calls):
            if event.endpoint:
                return event.endpoint
            break
    return turn.model if turn is not None else None


def hand_off(
    delegation: Delegation,
    parent_trace_id: str,
    parent_events: Sequence[Event],
    call: ToolCall,
    turn_id: str,
    *,
    numbering: Numbering | None = None,
    turn: TurnInput | None = None,
    child: Agent | None = None,
) -> HandOff | ToolOutput:
    """The child that a call of ``delegation`` opens, or the error result that it gets instead.

    Args:
        delegation: the delegation called.
        parent_trace_id: the trace of the call.
        parent_events: the parent's trace (its turn ``turn_id`` made the call).
        call: the call, as the model wrote it.
        turn_id: the parent's turn.
        numbering: the parent trace's element numbering, when the caller keeps it folded
            (default: :func:`numbering_of` the parent's events).
        turn: the parent's turn input, when the caller has it (default: found in the events).
        child: the agent the delegation runs, when the caller has it: whether it pins a model
            (see :func:`task_model`, the rule of the task's model).

    Returns:
        A :class:`HandOff`, or a ToolOutput with an error for the parent's model: the
        arguments do not fit (``invalid_arguments``), the depth limit is reached
        (``depth_limit``), or an ancestor already gave the same agent the identical task
        (``repeated_task``).
    """
    if turn is None:
        turn = _turn(parent_events, turn_id)

    def refuse(error: str, text: str) -> ToolOutput:
        return ToolOutput(turn_id=turn_id, call_id=call.id, name=call.name, text=text, error=error)

    try:
        if numbering is None:
            numbering = numbering_of(parent_events)
        parsed, arguments, elements = delegation.parse(call.arguments, numbering)
    except ToolArgumentsError as exc:
        return refuse("invalid_arguments", f"Error: {exc}")
    depth = depth_of(turn) + 1 if turn is not None else 1
    if depth > delegation.max_depth:
        return refuse(
            "depth_limit",
            f"Error: the delegation depth limit ({delegation.max_depth}) is reached, so {call.name!r} started no "
            "subagent. Do the task yourself with the tools you have.",
        )
    digest = task_digest(delegation.agent, arguments)
    lineage = turn.lineage if isinstance(turn, TaskInput) else ()
    if digest in lineage:
        return refuse(
            "repeated_task",
            f"Error: this exact task was already delegated to the {delegation.agent!r} agent further up this chain "
            "of subagents, so it was not delegated again. Do the task yourself, or delegate a smaller, different part of it.",
        )
    root = turn.root_trace_id if isinstance(turn, TaskInput) and turn.root_trace_id else parent_trace_id
    task = TaskInput(
        turn_id=call.id,
        agent=delegation.agent,
        text=delegation.render_task(parsed),
        elements=elements,
        call_id=call.id,
        parent_trace_id=parent_trace_id,
        parent_turn_id=turn_id,
        root_trace_id=root,
        depth=depth,
        delegation=delegation.name,
        arguments=arguments,
        expects=delegation.result_schema,
        model=task_model(delegation, child, parent_events, call, turn),
        lineage=(*lineage, digest),
        deadline_s=delegation.deadline_s,
    )
    return HandOff(child_trace_id=child_trace_id(parent_trace_id, call.id), task=task)


def descendants_refused(delegation: Delegation, call: ToolCall, turn_id: str, limit: int) -> ToolOutput:
    """The error result of a call refused because its root trace has ``limit`` descendants already."""
    return ToolOutput(
        turn_id=turn_id,
        call_id=call.id,
        name=call.name,
        text=(
            f"Error: this conversation has already started {limit} subagents, its limit, so {call.name!r} "
            "started none. Do the task yourself with the tools you have."
        ),
        error="descendants_limit",
    )


def children_of(
    parent_trace_id: str, events: Sequence[Event], turn_id: str, is_delegation: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """The children that the delegation calls of a turn open: ``[(child trace id, child turn id)]``.

    Args:
        parent_trace_id: the parent's trace.
        events: the parent's trace events.
        turn_id: the parent's turn.
        is_delegation: whether a tool name is a delegation.
    """
    out: list[tuple[str, str]] = []
    for event in events:
        if isinstance(event, ModelOutput) and event.turn_id == turn_id:
            out.extend((child_trace_id(parent_trace_id, c.id), c.id) for c in event.tool_calls if is_delegation(c.name))
    return out
