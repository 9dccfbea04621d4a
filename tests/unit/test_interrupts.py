"""How `agentstream run` takes its stop signals (agentstream.cli.interrupts), in this process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from agentstream.cli.interrupts import Interrupts


class _SignalledWhileFinalized:
    """An object whose finalizer is where the stop signal lands (as SIGTERM once landed in
    zipfile.ZipFile.__del__ while `run` started the local model)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside __del__: its KeyboardInterrupt is dropped
            pass


def test_a_stop_signal_whose_keyboardinterrupt_a_finalizer_dropped_still_stops_the_command():
    interrupts = Interrupts()
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts.handled():
            finalized = _SignalledWhileFinalized()
            del finalized
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # the command goes on: the interrupt must come here
                time.sleep(0.01)
            reached_end = True
    assert not reached_end
    assert interrupts.signum == signal.SIGTERM and interrupts.exit_code == 143


def test_once_stopping_a_signal_hurries_the_stop_and_raises_nothing():
    interrupts = Interrupts()
    hurried: list[bool] = []
    interrupts.on_hurry(lambda: hurried.append(True))
    with interrupts.handled():
        interrupts.begin_stopping()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert hurried == [True] and interrupts.hurried and interrupts.signum == signal.SIGINT
