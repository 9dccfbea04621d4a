"""Which job may run a tool call, and when: the tool worker's checks before it runs anything.

A tool call runs once per call (trace, turn and call id), whichever job entry or consumer carries
it. Two things make that hold:

- **The job must name a live call**: the trace holds the job's turn, and (unless that turn is
  over) one of its model outputs made a call with the job's id and tool name. A model output
  marks its calls in the trace's key hash as it is appended (``call:<call id>``, see
  :func:`agentstream.runtime.store.markers_for`), so the check is O(1) and runs in the claim's script
  (:meth:`agentstream.runtime.store.TraceStore.begin_call`), whatever the trace's length; a call without
  a marker (appended by an older version, or never made) is checked by reading its turn, from
  the turn's input on (:func:`job_problem`). A model output is only appended for the running
  turn, and a turn that has not ended stays the running one. A job for anything else (a call
  the trace never made, whether or not its turn has ended; another trace; a turn that is not
  running) is acknowledged and reported; nothing is written into any trace, so no job can
  create a trace.
- **One live run per call** (:class:`CallRuns`): besides the trace's per-call claim (the job
  entry that owns the call, ``claim:<call id>``), the worker running a call holds a short-lived
  *run key* (``<trace key>:run:<call id>``, a PX TTL renewed while the tool runs, deleted when
  it is done; taken in the claim's script, deleted by the script that records the result). A
  delivery of the same job to another consumer (its entry claimed while the first
  worker still runs it: a tool slower than the claim idle time) finds the run key held and waits
  until it is released or expires, instead of running the tool a second time or giving a
  side-effect tool a false *outcome unknown*. Only a run key that expired (its worker died)
  lets another worker take the call over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from agentstream.runtime.lua import script
from agentstream.wire.events import ApprovalDecided, Event, ModelOutput, ToolJob, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.keys import Keys

log = logging.getLogger("agentstream.tool_worker")


def job_problem(events: Sequence[Event], job: ToolJob) -> str:
    """Why ``job`` names no call that may run in this trace → a reason, or ``""`` when it does.

    A call the job's turn made that has its result, or whose turn ended or was cancelled, is not
    a problem here: the worker's claim (:meth:`agentstream.runtime.store.TraceStore.begin_call`)
    skips it and wakes the agent loop. A call the turn never made is one, ended turn or not.
    """
    if not events:
        return f"trace {job.trace_id!r} does not exist"
    turns = [e for e in events if isinstance(e, TurnInput)]
    if not any(t.turn_id == job.turn_id for t in turns):
        return f"trace {job.trace_id!r} has no turn {job.turn_id!r}"
    ended = {e.turn_id for e in events if isinstance(e, (TurnEnded, TurnFailed))}
    active = next((t.turn_id for t in turns if t.turn_id not in ended), None)
    if job.turn_id not in ended and active != job.turn_id:
        return f"turn {job.turn_id!r} of trace {job.trace_id!r} is not the running turn ({active!r} runs)"
    for event in events:
        if isinstance(event, ModelOutput) and event.turn_id == job.turn_id:
            for call in event.tool_calls:
                if call.id == job.call_id:
                    if call.name != job.name:
                        return f"call {job.call_id!r} of turn {job.turn_id!r} is a call of tool {call.name!r}, not {job.name!r}"
                    edited = next(
                        (
                            e.arguments
                            for e in events
                            if isinstance(e, ApprovalDecided) and e.call_id == call.id and e.approved
                        ),
                        None,
                    )
                    if (edited if edited is not None else call.arguments) != job.arguments:
                        return (
                            f"call {job.call_id!r} of turn {job.turn_id!r} was made with other arguments than the job's "
                            "(the trace records what a call runs; a job only says which call to run)"
                        )
                    return ""
    return f"turn {job.turn_id!r} of trace {job.trace_id!r} made no call {job.call_id!r}"


_KEEP_LUA = script("keep_run")  # agentstream/runtime/lua/keep_run.lua


@dataclass
class Run:
    """A run key this worker holds (see :meth:`CallRuns.held`).

    Attributes:
        release: ``(run key, runner)``, for an append that deletes the key as it records the result.
        released: the key was deleted that way (nothing left to delete).
    """

    release: tuple[str, str]
    released: bool = False


class CallRuns:
    """The run keys of one tool-worker process (see the module docstring).

    Args:
        redis: an asyncio Redis client.
        keys: the key names.
        worker_name: this process's consumer name (part of its runner id).
        ttl_ms: how long a run key outlives its worker; renewed every third of it while the
            tool runs. Another worker takes over a call this long after its worker died.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, *, worker_name: str = "", ttl_ms: int = 30_000):
        self.redis = redis
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.runner = f"{worker_name or 'worker'}:{uuid.uuid4().hex[:12]}"  # this process, this run

    def key(self, trace_id: str, call_id: str) -> str:
        """The run key of a call (in the trace's hash slot)."""
        return f"{self.keys.trace(trace_id)}:run:{call_id}"

    def run(self, trace_id: str, call_id: str) -> tuple[str, str, int]:
        """``(run key, runner, ttl ms)``: what :meth:`agentstream.runtime.store.TraceStore.begin_call`
        takes the call's run key with, in the same step as its claim."""
        return self.key(trace_id, call_id), self.runner, self.ttl_ms

    @contextlib.asynccontextmanager
    async def held(self, trace_id: str, call_id: str):
        """Keep the (taken) run key renewed for the block, then delete it (also when the block
        is cancelled: the worker stops and releases the call; when it raised, the key is left to
        expire) → a :class:`Run`: a block that deleted the key itself with its last write
        (``release`` given to the append that records the result) sets ``released``."""
        key = self.key(trace_id, call_id)
        run = Run((key, self.runner))

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.ttl_ms / 3000.0)
                try:
                    if not int(await self.redis.eval(_KEEP_LUA, 1, key, self.runner, self.ttl_ms)):
                        log.warning("lost the run key of call %s of trace %s while it runs", call_id, trace_id)
                        return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Redis trouble: try again at the next renewal
                    log.debug("could not renew the run key of call %s: %s", call_id, exc)

        renewer = asyncio.create_task(renew())
        try:
            yield run
        except asyncio.CancelledError:
            # the worker stops and releases the call (its shutdown grace ran out): free it at once
            with contextlib.suppress(Exception):
                await asyncio.shield(self.redis.eval(_KEEP_LUA, 1, key, self.runner, 0))
            raise
        except BaseException:
            # kept until it expires: a result this process computed but could not record is
            # recorded by its retry here (same runner), never taken for a run that died
            raise
        else:
            if not run.released:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.redis.eval(_KEEP_LUA, 1, key, self.runner, 0))
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
