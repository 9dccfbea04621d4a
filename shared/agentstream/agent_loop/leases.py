"""The lease loop: take a trace's lease with a fencing token, fold what is new, step until the trace
waits, release.

A part of :class:`agentstream.agent_loop.loop.AgentLoop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from agentstream.agent_loop._base import (
    LoopState,
    _Outcome,
    _step_span,
    log,
)
from agentstream.errors import (
    Deferred,
    StaleLeaseError,
)
from agentstream.ops import logs
from agentstream.runtime import operations
from agentstream.runtime.store import Read, Taken
from agentstream.steps.approvals import AwaitApproval
from agentstream.steps.trace_fold import AWAITS_APPROVAL, TraceFold


class Leases(LoopState):
    """The lease loop."""

    async def _current_fold(self, trace_id: str) -> TraceFold:
        """The trace's fold with everything appended so far (no lease needed: a trace only grows)."""
        return await self._reader.current(trace_id)

    async def _fold_with(self, trace_id: str, fold: TraceFold | None, read: Read) -> TraceFold:
        """Feed ``read`` (entries after ``fold``'s last id, or the whole trace without a fold)."""
        return await self._reader.fold_with(trace_id, fold, read)

    @contextlib.asynccontextmanager
    async def _lease(self, trace_id: str, *, wait_s: float = 0.0):
        """Hold the trace's lease for a write outside the step loop → its fencing token.

        Waits up to ``wait_s`` seconds for it; then raises :class:`Deferred` (the entry comes
        back when the lease would expire). The lease is given back afterwards; when a hint came
        meanwhile (it found the trace held, marked it dirty and left it to the holder, which does
        not run the step loop here), the trace is woken (a wake-up, reason ``held``), so the hint
        is not lost.
        """
        deadline = asyncio.get_running_loop().time() + wait_s
        while (token := await self.store.acquire_lease(trace_id, ttl_ms=self.lease_ttl_ms)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                left_ms = await operations.lease_left_ms(self.redis, self.keys, trace_id)
                raise Deferred(
                    min(max(left_ms, 0), self.lease_ttl_ms) / 1000.0 + 0.05,
                    f"trace {trace_id} is held by another worker",
                )
            await asyncio.sleep(0.05)
        try:
            yield token
        finally:
            await asyncio.shield(self._give_back(trace_id, token))

    async def _give_back(self, trace_id: str, token: int) -> None:
        """Release a lease held for a write outside the step loop; wake the trace when a hint
        came meanwhile (see :meth:`_lease`)."""
        if await self.store.release_lease(trace_id, token) == "dirty":  # the mark is cleared, the lease kept
            await self.store.release_lease(trace_id, token, keep_if_dirty=False)
            await operations.wake_trace(self.redis, self.keys, trace_id, "held")

    async def advance(self, trace_id: str, *, entry_id: str | None = None) -> None:
        """Take the trace's steps until it waits on tools or has no turn left.

        When another worker holds the trace, the trace is marked dirty (the holder looks again
        before it lets go) and this returns; a hint held by another process's lease waits, one
        per trace, until that lease would expire (``entry_id``: the hint's entry, see
        :class:`agentstream.errors.Deferred`), so it survives a holder that dies.
        """
        with logs.bind(trace_id=trace_id):
            self._take_back(trace_id, entry_id)
            fold = self.folds.get(trace_id)
            taken = await self.store.take(
                trace_id, ttl_ms=self.lease_ttl_ms, after=fold.last_id if fold is not None else None
            )
            await self._advance_taken(trace_id, entry_id, taken, fold)

    def _take_back(self, trace_id: str, entry_id: str | None) -> None:
        """The hint that waited for this trace is handled again: another one may wait next time."""
        waiting = self._deferred.get(trace_id)
        if waiting is not None and waiting[0] == entry_id:
            del self._deferred[trace_id]

    async def _advance_taken(self, trace_id: str, entry_id: str | None, taken: Taken, fold: TraceFold | None) -> None:
        while True:
            if taken.empty:
                self.folds.forget(trace_id)
                if entry_id is not None:  # a hint for a trace that is not there: deleted by retention, or a stray
                    self.empty_hints += 1
                    log.info(
                        "hint %s names trace %s, which holds nothing (deleted by retention, or never written); "
                        "nothing to do",
                        entry_id,
                        trace_id,
                    )
                return
            if taken.token is None:
                self._held_elsewhere(trace_id, entry_id, taken)
                return
            assert taken.read is not None
            if not await self._hold(trace_id, taken.token, taken.read, fold):
                return
            # The lease expired while held (this process stalled, or Redis was away): hints that
            # came meanwhile may have counted on this holder, so take the trace again; when
            # another worker has it now, this take marks it dirty and that holder goes on.
            log.warning("lost the lease of trace %s mid-step; taking it again", trace_id)
            fold = self.folds.get(trace_id)
            taken = await self.store.take(
                trace_id, ttl_ms=self.lease_ttl_ms, after=fold.last_id if fold is not None else None
            )

    async def _hold(self, trace_id: str, token: int, read: Read, fold: TraceFold | None) -> bool:
        """Take the trace's steps under the lease ``token`` → True when the lease was lost."""
        self._held[trace_id] = token
        renewer = _Renewer(self, trace_id, token)
        try:
            fold = await self._fold_with(trace_id, fold, read)
            return await self._steps(trace_id, token, fold)
        except StaleLeaseError:
            return True
        except BaseException:
            # shielded: a stopping worker gives the trace back even if it is cancelled again
            await asyncio.shield(self.store.release_lease(trace_id, token, keep_if_dirty=False))
            raise
        finally:
            if self._held.get(trace_id) == token:
                del self._held[trace_id]
            await renewer.stop()

    def _held_elsewhere(self, trace_id: str, entry_id: str | None, taken: Taken) -> None:
        """The lease is held (the trace is marked dirty already): wait for a holder in another
        process with one hint per trace; a holder in this process needs no help."""
        if str(self._held.get(trace_id)) == taken.holder or entry_id is None:
            return
        now = asyncio.get_running_loop().time()
        waiting = self._deferred.get(trace_id)
        if waiting is not None and waiting[0] != entry_id and waiting[1] > now:
            return  # another hint of this trace already waits for the holder
        delay_s = min(taken.left_ms, self.lease_ttl_ms) / 1000.0 + 0.05
        self._deferred[trace_id] = (entry_id, now + delay_s + self.lease_ttl_ms / 1000.0)
        raise Deferred(delay_s, f"trace {trace_id} is held by another worker")

    async def _renew(self, trace_id: str, token: int) -> None:
        while True:
            if not await self.store.renew_lease(trace_id, token, ttl_ms=self.lease_ttl_ms):
                log.warning("could not renew the lease of trace %s", trace_id)
                return
            await asyncio.sleep(self.lease_ttl_ms / 3000.0)

    async def _steps(self, trace_id: str, token: int, fold: TraceFold) -> bool:
        """Decide from the fold and act until the trace waits; then publish and release → True
        when the lease turned out lost at the release."""
        jobs: list[tuple[str, int, list[tuple[str, str, bytes, bytes]]]] = []
        while True:
            decision = fold.decide(self.app.agent, self.served, now_ms=int(time.time() * 1000))
            if not isinstance(decision, AwaitApproval) and fold.notes.pop(AWAITS_APPROVAL, None):
                await operations.forget_approval_due(self.redis, self.keys, trace_id)  # waits on no approval now
            turn = getattr(decision, "turn", None)
            # a child of the turn's trace context (OpenTelemetry); every line logged names the turn
            with _step_span(trace_id, decision), logs.bind(turn_id=turn.turn_id if turn is not None else None):
                outcome = await self._act(trace_id, token, fold, decision, jobs)
            if outcome is _Outcome.AGAIN:
                continue
            if outcome is _Outcome.REFRESH or outcome is _Outcome.DIRTY:
                fold = await self._current_fold(trace_id)
                continue
            if outcome is _Outcome.RELEASED:
                return False
            released = await self._release(trace_id, token, fold, jobs)
            jobs.clear()
            if released != "dirty":
                return released == "lost"
            fold = await self._current_fold(trace_id)  # a hint came meanwhile: look again


class _Renewer:
    """Renews a held lease every third of its time to live, from a timer: most holds end well
    before the first renewal, and a timer costs no task (a task per hold was created, stepped,
    cancelled and awaited at every step). The renewing task starts only when the timer fires."""

    __slots__ = ("_loop", "_task", "_timer", "_token", "_trace_id")

    def __init__(self, loop: Leases, trace_id: str, token: int) -> None:
        self._loop = loop
        self._trace_id = trace_id
        self._token = token
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            loop.lease_ttl_ms / 3000.0, self._start
        )

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._loop._renew(self._trace_id, self._token))

    async def stop(self) -> None:
        """Stop renewing (the lease is given back or lost); waits for a renewal under way to end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
