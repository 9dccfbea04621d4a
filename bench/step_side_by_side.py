"""Step cost of two checkouts side by side with the floor, alternating, in one sitting.

    python bench/step_side_by_side.py --roots /path/to/main /path/to/branch [--reps 3] [--dur 5] [--plans 1 64]

Each repetition of each plan (N conversations, 1 agent loop + 1 tool worker) runs the floor
(``bench/floor/agent_step.py``) once, then each checkout's real services (the ``serve`` command
of that checkout's ``bench/throughput.py``, on its own code), in alternating order from one
repetition to the next, on one private Redis. Printed per run and as medians: step p50, steps/s,
the agent loop's CPU per step (the floor's agent process for the floor), and the load average
at the end of the run. What a change to the step path buys, measured on the same machine in the
same minutes (a busy VM's speed drifts by tens of percent within a sitting).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
from types import ModuleType


def _throughput_of(root: str, name: str) -> ModuleType:
    """A checkout's ``bench/throughput.py``, loaded as module ``name`` (its services run its code)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "bench", "throughput.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", nargs="+", required=True, help="checkouts to compare (their services run)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dur", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--warm", type=float, default=1.5, help="seconds of warm-up per run")
    parser.add_argument("--plans", type=int, nargs="+", default=[1, 64], help="conversations per run")
    args = parser.parse_args()
    modules = [_throughput_of(root, f"throughput_{i}") for i, root in enumerate(args.roots)]
    runs: dict[tuple[int, str], list[dict]] = {}
    with modules[0].private_redis() as (port, redis_pid, client):
        for conversations in args.plans:
            for rep in range(args.reps):
                client.flushall()
                floor = modules[0].run_floor(port, agents=conversations, agent_procs=1, worker_procs=1, dur_s=args.dur)
                floor["load"] = os.getloadavg()[0]
                runs.setdefault((conversations, "floor"), []).append(floor)
                cpu = floor["cpu_us_per_step"]["agent"]
                print(
                    f"{conversations} conv. rep {rep + 1} floor: p50 {floor['step_p50_ms']:.2f} ms, "
                    f"{floor['steps_per_s']:.0f} steps/s, agent CPU {cpu:.0f} µs/step, load {floor['load']:.2f}",
                    flush=True,
                )
                order = list(zip(args.roots, modules, strict=True))
                for root, module in order if rep % 2 == 0 else reversed(order):
                    client.flushall()
                    got = asyncio.run(
                        module._conversations(port, redis_pid, client, 1, 1, conversations, args.warm, args.dur)
                    )
                    got["load"] = os.getloadavg()[0]
                    runs.setdefault((conversations, root), []).append(got)
                    cpu = got["cpu_us_per_step"]["agent-loop"]
                    print(
                        f"{conversations} conv. rep {rep + 1} {root}: p50 {got['step_p50_ms']:.2f} ms, "
                        f"{got['steps_per_s']:.0f} steps/s, agent-loop CPU {cpu:.0f} µs/step, load {got['load']:.2f}",
                        flush=True,
                    )
    print("\nmedians (ratios against the floor of the same plan):")
    for conversations in args.plans:
        floor_runs = runs[(conversations, "floor")]
        floor_p50 = statistics.median(r["step_p50_ms"] for r in floor_runs)
        floor_cpu = statistics.median(r["cpu_us_per_step"]["agent"] for r in floor_runs)
        for who in ["floor", *args.roots]:
            rs = runs[(conversations, who)]
            p50 = statistics.median(r["step_p50_ms"] for r in rs)
            cpu = statistics.median(r["cpu_us_per_step"]["agent" if who == "floor" else "agent-loop"] for r in rs)
            load = statistics.median(r["load"] for r in rs)
            print(
                f"{conversations:>3} conv. {who:<24} p50 {p50:6.2f} ms ({p50 / floor_p50:.1f}×)  "
                f"CPU/step {cpu:5.0f} µs ({cpu / floor_cpu:.1f}×)  "
                f"steps/s {statistics.median(r['steps_per_s'] for r in rs):5.0f}  load {load:.2f}"
            )


if __name__ == "__main__":
    main()
