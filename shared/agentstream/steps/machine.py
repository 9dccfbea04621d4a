"""The agent loop's decisions around a model call, as pure functions: what the loop does when X.

:func:`agentstream.steps.decision.decide_view` says what a trace's next step is (call the model,
run tools, end the turn...). Carrying out a :class:`~agentstream.steps.decision.CallModel` takes
more decisions, each one function here, in the order the loop takes them:

1. :func:`turn_deadline_failure`: the turn ran past its deadline before the call → it fails
   (code ``deadline``);
2. :func:`offer_before_call`: the MCP tools the call offers changed → record them first (a
   :class:`~agentstream.wire.events.ToolsOffered`), or wait for a server's first catalog, or fail
   the turn (code ``tools_unavailable``);
3. compaction first: :func:`agentstream.steps.summarising.next_call` (a summary is due → its job
   goes out and the call waits);
4. :func:`unknown_model_failure`: the agent names a model that is not configured → the turn
   fails (code ``config``);
5. :func:`model_call_failure`: the call raised → the turn's deadline (code ``deadline``) or the
   model's error (``model_error``);
6. :func:`unstorable_output_failure`: the output cannot be stored → the turn fails
   (``model_error``) instead of the model being called again on every delivery;
7. :func:`stamped_output`: the output records the digest of the prompt file texts it read.

Then :func:`agentstream.steps.effects.output_effects` says what the append of the output
carries: the step that would follow it is decided now, so its effects (the turn's ending,
results of calls that must not run, the tool jobs to publish, the reply) go with the append when
nothing else came into the trace meanwhile (:mod:`agentstream.steps.effects`: every step's writes
as one value). :func:`storable_results` replaces results the trace cannot store.

Before all of them, at admission, :func:`on_busy` says what a turn published on a busy
conversation does to its running turn (its message's ``busy_policy``, else the process's), and
:func:`queue_full_refusal` whether it may queue behind it or fails at once (code ``busy``).

None of these reads Redis or a clock: the loop passes the time, the configured models and
what it read, and applies what they return (``tests/unit/test_step_machine.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from agentstream.declarations.agents import Agent
from agentstream.errors import ModelDeadlineExceeded, ModelError
from agentstream.steps.offers import desired_offer, latest_offer, offer_digest
from agentstream.wire.events import (
    BUSY_POLICIES,
    CancelRequested,
    Event,
    ModelOutput,
    OfferedTool,
    ToolOutput,
    ToolsOffered,
    TurnFailed,
    TurnInput,
)
from agentstream.wire.failures import FailureCode

# --- 1. the turn's deadline ------------------------------------------------------------------


def turn_started_s(entries: Sequence[tuple[str, Event]], turn_id: str) -> float | None:
    """When the turn's input entered the trace (Unix seconds, from its stream entry id ``<ms>-<n>``),
    or None when the entries do not hold it (or its id is not a stream id)."""
    for entry_id, event in entries:
        if isinstance(event, TurnInput) and event.turn_id == turn_id:
            try:
                return int(entry_id.split("-", 1)[0]) / 1000.0
            except ValueError:
                return None
    return None


def turn_time_left_s(
    entries: Sequence[tuple[str, Event]], turn_id: str, deadline_s: float | None, now_s: float
) -> float | None:
    """Seconds left of a turn's deadline at ``now_s`` (Unix seconds) → None without a deadline, or
    when the turn's input entry is not among ``entries``. May be zero or negative: past it."""
    if deadline_s is None:
        return None
    started_s = turn_started_s(entries, turn_id)
    return None if started_s is None else started_s + deadline_s - now_s


def past_turn_deadline(turn: TurnInput, deadline_s: float | None, step: int) -> TurnFailed:
    """The ending of a turn given up at model call ``step`` because it ran past ``deadline_s``."""
    return TurnFailed(
        turn_id=turn.turn_id,
        code=FailureCode.DEADLINE,
        reason=f"the turn ran past its deadline of {deadline_s:g} s (AGENTSTREAM_TURN_DEADLINE_S) at model call {step}; "
        "it was given up",
    )


def turn_deadline_failure(
    turn: TurnInput, left_s: float | None, deadline_s: float | None, step: int
) -> TurnFailed | None:
    """When the turn has no time left before model call ``step`` (``left_s`` from
    :func:`turn_time_left_s`), the loop fails it with code ``deadline`` instead of calling."""
    if left_s is not None and left_s <= 0:
        return past_turn_deadline(turn, deadline_s, step)
    return None


# --- 0. a turn's admission into a conversation's queue ------------------------------------------


def queue_full_refusal(trace_id: str, turn_id: str, open_turns: int, max_queued_turns: int) -> TurnFailed | None:
    """Whether a new turn may enter a conversation that has ``open_turns`` turns admitted and not
    ended (its running turn and those queued behind it) → None to admit it, else its failure
    (code ``busy``) when ``open_turns`` reached ``max_queued_turns``.

    The admission script applies the same rule in Redis, atomically with the append
    (``admit_turn.lua``: a new turn is refused while the count is at the cap); this states it and
    words the refusal. Raises ValueError when ``max_queued_turns`` is below 1.
    """
    if max_queued_turns < 1:
        raise ValueError(f"max_queued_turns must be at least 1, got {max_queued_turns!r}")
    if open_turns < max_queued_turns:
        return None
    return TurnFailed(
        turn_id=turn_id,
        code=FailureCode.BUSY,
        reason=f"conversation {trace_id!r} has {open_turns} turns admitted and not ended, the most it may queue "
        f"(AGENTSTREAM_MAX_QUEUED_TURNS={max_queued_turns}); this turn was refused: publish it again under a "
        "new turn_id once earlier turns have ended",
    )


@dataclass(frozen=True)
class EnterTurn:
    """The turn enters the trace (behind the running turn, if any, which ends first).

    Attributes:
        cancel: append this first (``interrupt``, ``rollback``): the running turn is cancelled
            at its next step (its calls without a result get a cancelled result).
        rolls_back: the turn input names this turn as the one it rolls back (``rollback``).
    """

    cancel: CancelRequested | None = None
    rolls_back: str | None = None


@dataclass(frozen=True)
class RejectTurn:
    """The turn does not enter the trace: it ends with ``failed`` (code ``busy``) at once."""

    failed: TurnFailed


def on_busy(
    trace_id: str, turn_id: str, asked: str | None, default: str, running_turn_id: str | None
) -> EnterTurn | RejectTurn:
    """What a new turn does to its conversation's running turn.

    Args:
        trace_id: the conversation.
        turn_id: the new turn.
        asked: the ``busy_policy`` its message names, or None.
        default: the process's policy (``AGENTSTREAM_BUSY_POLICY``).
        running_turn_id: the turn that has entered the trace and not ended (the oldest such),
            or None when the conversation is idle.

    Returns:
        ``EnterTurn()`` when the conversation is idle or the policy is ``queue``; ``RejectTurn``
        for ``reject``; ``EnterTurn`` with a cancel of the running turn for ``interrupt``, and
        also naming it as rolled back for ``rollback``.

    Raises:
        ValueError: a policy that is not one of :data:`~agentstream.wire.events.BUSY_POLICIES`
            (the wire refuses such a message before this, code ``bad_turn``).
    """
    policy = asked if asked is not None else default
    if policy not in BUSY_POLICIES:
        raise ValueError(f"busy policy must be one of {BUSY_POLICIES}, got {policy!r} (turn {turn_id!r})")
    if running_turn_id is None or policy == "queue":
        return EnterTurn()
    source = "the turn's" if asked is not None else "the process's"
    if policy == "reject":
        return RejectTurn(
            TurnFailed(
                turn_id=turn_id,
                code=FailureCode.BUSY,
                reason=f"conversation {trace_id!r} is busy with turn {running_turn_id!r}; this turn was rejected "
                f"({source} busy policy 'reject'): publish it again once that turn has ended",
            )
        )
    if policy == "interrupt":
        return EnterTurn(
            CancelRequested(turn_id=running_turn_id, by="interrupt", reason=f"interrupted by turn {turn_id}")
        )
    return EnterTurn(
        CancelRequested(
            turn_id=running_turn_id,
            by="rollback",
            reason=f"rolled back by turn {turn_id}: left out of every later context",
        ),
        rolls_back=running_turn_id,
    )


# --- 2. the MCP tools offered ----------------------------------------------------------------


@dataclass(frozen=True)
class KeepOffer:
    """The trace already says which MCP tools the call offers: call the model."""


@dataclass(frozen=True)
class WaitForCatalogs:
    """A server has not published its tools yet and the turn may still wait: hand the hint back
    after ``delay_s`` seconds (the loop raises :class:`~agentstream.errors.Deferred`)."""

    delay_s: float
    reason: str


OfferDecision = KeepOffer | WaitForCatalogs | TurnFailed | ToolsOffered


def offer_before_call(
    events: Sequence[Event],
    agent: Agent,
    turn: TurnInput,
    step: int,
    catalogs: Mapping[str, Any] | None,
    *,
    waited_s: float,
    wait_s: float,
) -> tuple[OfferDecision, list[str]]:
    """What the loop does about MCP tools before model call ``step``.

    Args:
        events: the trace (its latest ``tools_offered`` for the agent is what the calls offer now).
        agent: the agent as the turn is offered it.
        turn: the running turn.
        step: the model call's step.
        catalogs: each MCP server's published catalog by name (None for a server that has not
            published one); None when the agent has no MCP servers (nothing to read).
        waited_s: how long the turn has run, in seconds.
        wait_s: how long a turn waits for a server's first catalog, in seconds.

    Returns:
        (the decision, the problems found in the catalogs, to log once each): ``ToolsOffered``:
        append it, then take the step again; ``KeepOffer``: call the model; ``WaitForCatalogs``:
        defer the hint; ``TurnFailed``: end the turn (code ``tools_unavailable``).
    """
    recorded = latest_offer(events, agent.name)
    problems: list[str] = []
    if not agent.mcp_servers:
        if recorded is None or not recorded.tools:
            return KeepOffer(), problems
        desired: tuple[OfferedTool, ...] = ()  # the app no longer gives the agent MCP servers
    else:
        catalogs = catalogs or {}
        missing = [s for s in agent.mcp_servers if catalogs.get(s.name) is None]
        if missing:
            what = "; ".join(
                f"MCP server {s.name!r} has published no tool list: no tool worker serves queue {s.queue!r} "
                f"(run `agentstream serve tool-worker --queue {s.queue}`) or it cannot reach the server"
                for s in missing
            )
            if waited_s < wait_s:
                return WaitForCatalogs(min(1.0, max(wait_s - waited_s, 0.05)), what), problems
            failed = TurnFailed(
                turn_id=turn.turn_id,
                code=FailureCode.TOOLS_UNAVAILABLE,
                reason=f"{what}; the turn waited {waited_s:.0f} s for it",
            )
            return failed, problems
        desired, problems = desired_offer(agent, catalogs)
    digest = offer_digest(desired)
    if (recorded is not None and recorded.digest == digest) or (recorded is None and not desired):
        return KeepOffer(), problems
    return ToolsOffered(turn_id=turn.turn_id, step=step, agent=agent.name, tools=desired, digest=digest), problems


# --- 4. to 7. the model and its output ---------------------------------------------------------


def unknown_model_failure(agent: Agent, configured: Container[str], turn: TurnInput) -> TurnFailed | None:
    """When the agent names a model that is not among the ``configured`` endpoint ids, the loop
    fails the turn with code ``config`` instead of calling."""
    if agent.model is not None and agent.model in configured:
        return None
    return TurnFailed(
        turn_id=turn.turn_id,
        code=FailureCode.CONFIG,
        reason=f"agent {agent.name!r} names model {agent.model!r}, which is not configured",
    )


def model_call_failure(
    exc: BaseException, turn: TurnInput, step: int, *, turn_deadline_s: float | None, bounded: bool
) -> TurnFailed | None:
    """The ending of a turn whose model call ``step`` raised ``exc``, or None when ``exc`` is not
    the turn's to end (the loop re-raises it: a bug, or Redis, not the model).

    A ``TimeoutError`` is the turn's own deadline when the call was ``bounded`` by it (code
    ``deadline``); a :class:`~agentstream.errors.ModelDeadlineExceeded` is the model call's deadline
    (``deadline``); any other :class:`~agentstream.errors.ModelError` is ``model_error``.
    """
    if isinstance(exc, TimeoutError) and not isinstance(exc, ModelError):
        return past_turn_deadline(turn, turn_deadline_s, step) if bounded else None
    if isinstance(exc, ModelError):
        code = FailureCode.DEADLINE if isinstance(exc, ModelDeadlineExceeded) else FailureCode.MODEL_ERROR
        return TurnFailed(turn_id=turn.turn_id, code=code, reason=f"model call {step} failed: {exc}")
    return None


def unstorable_output_failure(problem: str | None, turn: TurnInput, step: int) -> TurnFailed | None:
    """When the trace cannot store the model's output (``problem``, from the codec), the turn fails
    with ``model_error``: left to the handler, the model would be called again on every delivery."""
    if problem is None:
        return None
    return TurnFailed(
        turn_id=turn.turn_id,
        code=FailureCode.MODEL_ERROR,
        reason=f"model call {step} returned an output that cannot be stored: {problem}",
    )


def stamped_output(output: ModelOutput, agent: Agent) -> ModelOutput:
    """The output as recorded: with the digest of the prompt file texts the call read (what a
    rebuild of the call compares), when the agent's prompt comes from files."""
    if agent.prompt_digest:
        return msgspec.structs.replace(output, prompt_digest=agent.prompt_digest)
    return output


# --- after the output: what goes with its append ----------------------------------------------


def storable_results(results: Sequence[Event], unstorable: Callable[[Any], str | None]) -> list[Event]:
    """The results a decision records, each the trace cannot store (``unstorable`` says why: a
    lone surrogate echoed from its arguments) replaced by an error result saying so: it would fail
    the append on every delivery, and the model would be called again each time."""
    out: list[Event] = []
    for result in results:
        problem = unstorable(result)
        if problem is not None and isinstance(result, ToolOutput):
            result = ToolOutput(
                turn_id=result.turn_id,
                call_id=result.call_id,
                name=result.name,
                error="invalid_result",
                text=f"Error: the result of this call of {result.name!r} could not be stored ({problem}); "
                "check the call's arguments and call it again",
            )
        out.append(result)
    return out
