"""How ``agentstream run`` takes Ctrl-C and SIGTERM, and stops what it started in order.

A terminal's Ctrl-C is SIGINT to its whole foreground process group. What ``run`` starts is not
in that group: the service processes, the local model and the embedded Redis each run in a
session of their own, so the keypress reaches ``run`` alone, which stops them in order: the
services first (SIGTERM: they take no new work and drain what they hold within
``AGENTSTREAM_SHUTDOWN_GRACE_S``), then the model and Redis they need while they drain. Before,
the services got the keypress too (one still importing died with a traceback), and the order
was theirs. SIGTERM to ``run`` (a process manager, ``kill <pid>``) and SIGHUP (its terminal
closed) are taken as Ctrl-C is. Should ``run`` die without stopping them (SIGKILL), the services
and the model get SIGTERM from the kernel (:func:`die_with_parent`).

While ``run`` is stopping, a second SIGINT or SIGTERM hurries it: the processes still running
are SIGKILLed at once (what a service held stays pending in its group, for the next worker to
claim), and the embedded Redis is still shut down as usual. ``run`` then exits with 128 + the
first signal's number: 130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP (the shell's
convention).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop ``run`` (each as Ctrl-C does)."""

REDELIVER_AFTER_S = 0.02
"""How long after Python dropped a stop signal's KeyboardInterrupt (in a finalizer) the signal is sent again (seconds)."""


class Interrupts:
    """The signals a command has received, and what to do when it is hurried.

    Attributes:
        signum: the first of :data:`STOP_SIGNALS` received inside :meth:`handled` (None: none).
        stopping: whether :meth:`begin_stopping` was called: from then on a signal hurries the
            stop instead of raising.
        hurried: whether a signal arrived while stopping (the callbacks of :meth:`on_hurry` ran).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopping = False
        self.hurried = False
        self._on_hurry: list[Callable[[], None]] = []
        self._unraisable_hook: Callable[[Any], None] = sys.unraisablehook
        self._resent = False

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number (130 when none was recorded: a KeyboardInterrupt from elsewhere)."""
        return 128 + int(self.signum or signal.SIGINT)

    @contextlib.contextmanager
    def handled(self) -> Iterator[Interrupts]:
        """While inside: SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt where the main thread is (in
        ``asyncio.run`` too: its loop stops, its tasks are cancelled and awaited, and the
        KeyboardInterrupt comes out of it), and after :meth:`begin_stopping` they hurry the stop
        instead. The handlers in place before are put back on the way out. Outside the main
        thread (where Python cannot set signal handlers) nothing is installed.

        ``asyncio.run``'s own Ctrl-C handling (Python 3.11+) only cancels its main task, and a
        coroutine that swallows the cancellation carries on as if nothing had happened (``run``
        was seen to go on following its turn, past a SIGTERM); a KeyboardInterrupt is not
        swallowed so easily."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:  # both, even if ignored (started with `&` by a script), as localmodel.main does
            signal.signal(sig, self._on_signal)
        previous_hook = sys.unraisablehook
        self._unraisable_hook = previous_hook
        sys.unraisablehook = self._on_unraisable
        try:
            yield self
        finally:
            sys.unraisablehook = previous_hook
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _on_unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook`` while :meth:`handled`: a KeyboardInterrupt that a stop signal raised
        inside a ``__del__`` or a weakref callback is printed and dropped by Python ("Exception
        ignored in …"), and ``run`` went on as if no signal had come (seen: SIGTERM during the local
        model's start, dropped in ``zipfile.ZipFile.__del__``). The signal is sent again from
        another thread a moment later, so its KeyboardInterrupt comes once the finalizer has
        returned (were it dropped again, this runs again). Anything else goes to the hook that
        was in place."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.signum is not None and not self.stopping:
            self._resent = True
            resend = threading.Timer(REDELIVER_AFTER_S, os.kill, (os.getpid(), self.signum))
            resend.daemon = True
            resend.start()
            return
        self._unraisable_hook(unraisable)

    def on_hurry(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the signal handler, in the main thread) when a signal arrives
        while stopping; it must return at once (send a signal, set a flag), never wait."""
        self._on_hurry.append(callback)

    def begin_stopping(self) -> None:
        """From now on the stop signals hurry the stop (see :meth:`on_hurry`) instead of raising,
        so the stop itself is never cut short. Only in the main thread, inside :meth:`handled`."""
        self.stopping = True
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        resent, self._resent = self._resent, False
        if self.signum is None:
            self.signum = signum
        if self.stopping:
            if not resent:  # a signal sent again by _on_unraisable is no second keypress
                self.hurry()
            return
        raise KeyboardInterrupt

    def hurry(self) -> None:
        """Run the :meth:`on_hurry` callbacks (once)."""
        if self.hurried:
            return
        self.hurried = True
        for callback in self._on_hurry:
            with contextlib.suppress(Exception):
                callback()


def die_with_parent() -> None:
    """In a child process before it runs (``preexec_fn``; Linux): SIGTERM when the process that
    started it dies, however it dies (SIGKILL included), and SIGINT/SIGTERM restored to their
    defaults (a parent started with SIGINT ignored, as under ``nohup ... &``, must not pass that
    on). The kernel sends the SIGTERM when the *thread* that started the child exits: start it
    from the main thread."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
