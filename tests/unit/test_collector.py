"""agentstream.ops.collector: a service process's garbage collector after its start."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from agentstream.ops.collector import SERVICE_THRESHOLDS


def test_a_tuned_service_process_freezes_what_its_start_made_and_collects_less_often():
    script = textwrap.dedent(
        """
        import gc
        from agentstream.ops.collector import tune_for_service
        import agentstream.agent_loop.loop  # a service's libraries, loaded
        assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
        tune_for_service()
        print(gc.get_threshold(), gc.get_freeze_count() > 10_000)
        class Cycle:
            pass
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        print(gc.collect() >= 2)  # cycles are still collected
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split("\n")
    assert out[0] == f"{SERVICE_THRESHOLDS} True"
    assert out[1] == "True"
