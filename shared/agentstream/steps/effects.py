"""What one step writes, as one value, and what the loop notes once it is written.

Every decision the agent loop carries out that writes to the trace comes down to one
:class:`Effects`: events to append under the lease's fencing token, events to append after them
only if nothing came into the trace since the step read it (``then``), and, on one Redis server,
what to publish with them (the tool jobs of a step, or a turn's reply) and the lease's release.
The loop applies any Effects value in one store operation
(:meth:`agentstream.runtime.store.TraceStore.apply`, one Lua script), then
:func:`after_apply` says, from what Redis answered, what the step loop does next and what it
notes in its fold.

The functions, in the order a step uses them:

1. the value of a decision: :func:`output_effects` (a model output, with what the step after it
   would do: its ending, results of calls that must not run, its jobs or its reply),
   :func:`ending_effects` (``EndTurn``, ``FailTurn``, ``CancelTurn``), :func:`turn_ends` (a
   failure the loop found before or around the model call), :func:`recorded` (results,
   approvals awaited or decided);
2. :func:`notes_before`: what the fold notes before Redis runs the release (another task of
   this process may take the lease next and must not publish the jobs again);
3. :func:`after_apply`: the step loop's next move and the fold's notes after the answer;
4. :func:`ending_kind`: which count a turn's ending adds to (ended, cancelled, failed).

None reads Redis or a clock (``tests/unit/test_step_effects.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentstream.steps.decision import CancelTurn, Decision, EndTurn, FailTurn, RecordResults, RunTools
from agentstream.steps.machine import storable_results
from agentstream.wire.events import Event, ModelOutput, TaskInput, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.failures import FailureCode


def jobs_marker(turn_id: str, step: int) -> str:
    """The key-hash marker that says the tool jobs of a step were published."""
    return f"jobs:{turn_id}:{step}"


def reply_marker(turn_id: str) -> str:
    """The key-hash marker that says a turn's reply was published."""
    return f"reply:{turn_id}"


def jobs_note(turn_id: str, step: int) -> tuple[str, str, int]:
    """The fold's note of a step's jobs: True published, False not (a new output), absent unknown
    (asked of Redis, :func:`jobs_marker`, before they are published)."""
    return ("jobs", turn_id, step)


def ended_note(turn_id: str) -> tuple[str, str]:
    """The fold's note of a turn this process ended: its reply is owed, no need to ask Redis."""
    return ("ended", turn_id)


@dataclass(frozen=True)
class Reply:
    """A root turn's reply, published with the append of its ending.

    Attributes:
        turn: the turn it answers.
        ending: the turn's ending (the last event of the effects).
        stop_reason: the stop reason of the turn's last model output when it was not a normal
            stop, else None.
    """

    turn: TurnInput
    ending: TurnEnded
    stop_reason: str | None = None


@dataclass(frozen=True)
class Effects:
    """What one step writes, applied in one operation under the lease.

    Attributes:
        turn: the turn the step acts on (None for writes no turn ends with).
        events: appended in order, each once by its idempotency key, under the fencing token.
        then: appended after ``events`` only when nothing came into the trace since the step's
            fold was read (the step decided them from it); else left out.
        jobs: publish the tool jobs of these calls (on one Redis server, with the release).
        reply: publish this reply (on one Redis server, with the release).

    The publication goes out only when every event (``then`` included) was appended by this
    operation and nothing came first; the lease is then released (or kept: a hint came).
    """

    turn: TurnInput | None = None
    events: tuple[Event, ...] = ()
    then: tuple[Event, ...] = ()
    jobs: RunTools | None = None
    reply: Reply | None = None

    @property
    def releases(self) -> bool:
        """Whether the operation publishes and releases the lease (when the append held)."""
        return self.jobs is not None or self.reply is not None

    @property
    def marks(self) -> tuple[str, ...]:
        """The key-hash markers that say the publication went out."""
        out = []
        if self.jobs is not None:
            out.append(jobs_marker(self.jobs.turn.turn_id, self.jobs.step))
        if self.reply is not None:
            out.append(reply_marker(self.reply.ending.turn_id))
        return tuple(out)

    @property
    def ending(self) -> TurnEnded | TurnFailed | None:
        """The turn's ending these effects append (always their last event), or None."""
        everything = (*self.events, *self.then)
        last = everything[-1] if everything else None
        return last if isinstance(last, TurnEnded | TurnFailed) else None


# --- 1. the effects of a decision ----------------------------------------------------------------


def ending_effects(decision: EndTurn | FailTurn | CancelTurn) -> Effects:
    """When a decision ends the turn, the loop appends the calls' results it records (a cancel's)
    and then the turn's ending, in one atomic append; the reply goes out with the next release."""
    turn = decision.turn
    match decision:
        case EndTurn(answer=answer, citations=citations, answer_call=answer_call):
            ending: TurnEnded | TurnFailed = TurnEnded(
                turn_id=turn.turn_id, answer=answer, citations=citations, answer_call=answer_call
            )
            return Effects(turn, (ending,))
        case FailTurn(code=code, reason=reason):
            return Effects(turn, (TurnFailed(turn_id=turn.turn_id, code=code, reason=reason),))
        case CancelTurn(results=results, code=code, reason=reason):
            return Effects(turn, (*results, TurnFailed(turn_id=turn.turn_id, code=code, reason=reason)))
    raise AssertionError(f"not a turn's end: {decision!r}")


def turn_ends(turn: TurnInput, ending: TurnEnded | TurnFailed) -> Effects:
    """When the loop ends a turn itself (a deadline, a model error, an unknown model...), it
    appends the ending alone; the reply goes out with the next release."""
    return Effects(turn, (ending,))


def recorded(events: Sequence[Event]) -> Effects:
    """When a decision records events (results of calls that must not run, approvals awaited or
    decided), the loop appends them and decides again."""
    return Effects(events=tuple(events))


def output_effects(
    turn: TurnInput,
    output: ModelOutput,
    following: Decision | None,
    *,
    publish_with_append: bool,
    replies_owed: bool,
    others_waiting: bool,
    unstorable: Callable[[Any], str | None],
) -> Effects:
    """What the loop writes for a model output of ``turn``, given the decision that would follow it.

    The step after the append is decided now, so its effects go with the append when nothing
    else came into the trace meanwhile: the turn's ending, or results of calls that must not
    run (as ``then``); and on one Redis server, when no earlier reply is owed, the jobs of the
    calls to run, or the reply of an answer to a root turn nothing waits behind, with the
    release.

    Args:
        turn: the running turn.
        output: the model output, as recorded (call ids scoped, prompt digest stamped).
        following: :func:`~agentstream.steps.decision.decide_view` on the fold with the output
            added (None when the fold's running turn is another one).
        publish_with_append: the store can append, publish and release in one script (one
            Redis server, not a cluster).
        replies_owed: replies of earlier turns have not been confirmed yet (they go out first,
            with the next release).
        others_waiting: another turn of the trace waits behind this one (the step after this
            turn's ending starts it instead of releasing).
        unstorable: the codec's check of an event (see
            :func:`~agentstream.steps.machine.storable_results`).

    Returns:
        The effects: the output as ``events``; ``then`` the ending or the results; ``jobs``
        when the output's calls are to run, ``reply`` when it answers a root turn.
    """
    then: tuple[Event, ...] = ()
    if isinstance(following, EndTurn | FailTurn):
        ending = ending_effects(following).ending
        assert ending is not None
        then = (ending,)
    elif isinstance(following, RecordResults):
        then = tuple(storable_results(following.results, unstorable))
    effects = Effects(turn, (output,), then)
    if not publish_with_append or replies_owed:
        return effects
    if isinstance(following, RunTools) and following.calls:
        return Effects(turn, (output,), jobs=following)
    if isinstance(following, EndTurn) and not isinstance(turn, TaskInput) and not others_waiting:
        answered = then[0]
        assert isinstance(answered, TurnEnded)
        stop_reason = output.stop_reason if not output.stopped_normally else None
        return Effects(turn, (output,), then, reply=Reply(turn, answered, stop_reason))
    return effects


# --- 2. and 3. around the operation --------------------------------------------------------------


def notes_before(effects: Effects) -> dict[Hashable, Any]:
    """What the fold notes before the operation runs: the jobs it publishes, as published. Redis
    may run the release before this task has the answer, and a task of this process that takes
    the lease next must find them noted, or it publishes them again; the caller removes these
    notes when the operation fails (the jobs are then unknown: asked of Redis)."""
    if effects.jobs is None:
        return {}
    return {jobs_note(effects.jobs.turn.turn_id, effects.jobs.step): True}


@dataclass(frozen=True)
class AfterApply:
    """What the loop does once Redis answered an operation (:func:`after_apply`).

    Attributes:
        step: ``"again"`` (decide again from the fold), ``"released"`` (published and released:
            the step loop ends) or ``"dirty"`` (published, the lease kept: a hint came; read
            what came, then decide).
        notes: set in the fold's notes.
        forget: removed from the fold's notes.
        ended: the turn's ending this operation appended (counted, its reply owed), or None.
        replied: the reply that went out with it, or None.
    """

    step: str
    notes: Mapping[Hashable, Any]
    forget: tuple[Hashable, ...] = ()
    ended: TurnEnded | TurnFailed | None = None
    replied: Reply | None = None


def after_apply(effects: Effects, created: Sequence[bool | None], outcome: str | None) -> AfterApply:
    """What the loop does after applying ``effects``, from what Redis answered.

    Args:
        effects: what was applied.
        created: per event of ``events`` and ``then``: True appended now, False there already,
            None left out (one of ``then``).
        outcome: the publication's: ``"released"``, ``"dirty"``, or None (none, or it did not
            go out: the step loop decides again from what it read, and publishes as after any
            append).

    Returns:
        The step loop's next move and the fold's notes: a new output with calls whose jobs
        did not go out is noted unpublished (False); jobs noted before (:func:`notes_before`)
        that did not go out with an output that was there already are unknown again (removed);
        an ending appended now is noted (its reply owed, unless it went out with it).
    """
    notes: dict[Hashable, Any] = {}
    forget: list[Hashable] = []
    first = effects.events[0] if effects.events else None
    new_output = isinstance(first, ModelOutput) and bool(created) and created[0] is True
    if outcome is None and effects.jobs is not None:  # noted published before: not so
        key = jobs_note(effects.jobs.turn.turn_id, effects.jobs.step)
        if new_output:
            notes[key] = False  # a new output: nobody published its jobs
        else:
            forget.append(key)  # the output was there already: another worker may have published them
    elif outcome is None and isinstance(first, ModelOutput) and first.tool_calls and new_output:
        notes[jobs_note(first.turn_id, first.step)] = False  # a new output: nobody published its jobs
    ending = effects.ending
    ended = ending if ending is not None and bool(created) and created[-1] is True else None
    replied = effects.reply if outcome is not None else None
    if ended is not None and replied is None:
        notes[ended_note(ended.turn_id)] = True
    return AfterApply(outcome or "again", notes, tuple(forget), ended, replied)


# --- 4. counting the ending ----------------------------------------------------------------------


def ending_kind(ending: TurnEnded | TurnFailed) -> str:
    """Which count a turn's ending adds to: ``"ended"`` (answered), ``"cancelled"`` (code
    ``cancelled``) or ``"failed"`` (any other code)."""
    if isinstance(ending, TurnEnded):
        return "ended"
    return "cancelled" if ending.code == FailureCode.CANCELLED else "failed"
