"""Two checkouts' services side by side in one sitting: 64 conversations, 1 + 1 and 2 + 2 processes.

    python bench/scaling_side_by_side.py --before /path/to/main --after . [--reps 3] [--dur 8] [--profile]

Each checkout runs ``bench/throughput.py``'s own measurement of 64 conversations (its services as
separate OS processes, its zero-latency model double, a no-op tool, a private Redis per run) with
its own virtualenv's Python (``<checkout>/.venv/bin/python``: a virtualenv's editable install
maps ``agentstream_services`` to its own checkout). Runs alternate, before then after, plan by
plan, ``--reps`` times; the medians are reported with the load average of each run: steps/s,
step p50, and CPU per step of the agent loops, the tool workers and Redis (µs). (Unlike
``bench/step_side_by_side.py``, one agent loop and one tool worker beside the floor, this one is
about how the services scale with processes, and runs each checkout with its own interpreter.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANS = [("1 + 1", 1, 1), ("2 + 2", 2, 2)]

_ONE_RUN = """
import asyncio, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("throughput", sys.argv[1])
t = importlib.util.module_from_spec(spec)
sys.modules["throughput"] = t
spec.loader.exec_module(t)
loops, workers, warm, dur = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
with t.private_redis() as (port, pid, client):
    out = asyncio.run(t._conversations(port, pid, client, loops, workers, 64, warm, dur))
out["load"] = os.getloadavg()[0]
print("RESULT " + json.dumps(out))
"""


def one_run(checkout: Path, loops: int, workers: int, warm: float, dur: float, profile: str = "") -> dict:
    """One measurement of ``checkout`` with its own Python → ``_conversations``' figures and the
    load; with ``profile`` (a path prefix), its agent loops run under cProfile
    (``bench/throughput.py``'s ``BENCH_PROFILE``) and the figures get ``folded_per_step``,
    ``fold_share`` and ``put_share`` (:func:`fold_figures`)."""
    python = checkout / ".venv" / "bin" / "python"
    env = {**os.environ, "BENCH_PROFILE": profile, "BENCH_PROFILE_KIND": "agent-loop"} if profile else None
    done = subprocess.run(
        [
            str(python),
            "-c",
            _ONE_RUN,
            str(checkout / "bench" / "throughput.py"),
            str(loops),
            str(workers),
            str(warm),
            str(dur),
        ],
        cwd=str(checkout),
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    if profile:
        out |= fold_figures(profile)
    return out


def fold_figures(prefix: str) -> dict:
    """From the agent loops' profiles at ``prefix`` (the whole run, warm-up included): trace
    entries folded per step (calls of ``TraceFold._fold``, one per entry fed to a fold, over
    calls of ``Acting._act``, one per model call), and the share of their profiled CPU time in
    ``TraceFold.feed`` and in ``FoldCache.put`` (which measures a fold's memory as it grows)."""
    import glob
    import pstats

    files = glob.glob(f"{prefix}.agent-loop.*")
    stats = pstats.Stats(*files)
    folded = steps = feed_s = put_s = total = 0.0
    for (path, _line, name), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        if path.endswith("trace_fold.py") and name == "_fold":
            folded += calls
        if path.endswith("acting.py") and name == "_act":
            steps += calls
        if path.endswith("trace_fold.py") and name == "feed":
            feed_s += ct
        if path.endswith("trace_fold.py") and name == "put":
            put_s += ct
    for f in files:
        os.unlink(f)
    return {
        "folded_per_step": folded / max(steps, 1),
        "fold_share": feed_s / max(total, 1e-9),
        "put_share": put_s / max(total, 1e-9),
    }


def _median(runs: list[dict], key: str, sub: str | None = None) -> float:
    return statistics.median(r[key][sub] if sub else r[key] for r in runs)


def git_head(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dur", type=float, default=8.0)
    parser.add_argument("--warm", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="agent loops under cProfile: trace entries folded per step and the share of time folding",
    )
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[tuple[str, str], list[dict]] = {}
    load_before = os.getloadavg()
    for rep in range(args.reps):
        for label, loops, workers in PLANS:
            for side, checkout in sides.items():
                prefix = f"{tempfile.gettempdir()}/scaling-side-by-side-{os.getpid()}-{side}" if args.profile else ""
                r = one_run(checkout, loops, workers, args.warm, args.dur, prefix)
                runs.setdefault((label, side), []).append(r)
                print(
                    f"rep {rep + 1} {label} {side}: {r['steps_per_s']:.0f} steps/s, agent loop "
                    f"{r['cpu_us_per_step']['agent-loop']:.0f} µs/step, load {r['load']:.2f}"
                    + (f", {r['folded_per_step']:.2f} entries folded a step" if args.profile else ""),
                    flush=True,
                )
    print()
    print(
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='minutes')}, {os.cpu_count()} CPUs, "
        f"load before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; before = {git_head(sides['before'])}, "
        f"after = {git_head(sides['after'])}; medians of {args.reps} runs of {args.dur:g} s"
    )
    print()
    print(
        "| processes | code | steps/s | step p50 ms | agent loop µs/step | tool worker µs/step | Redis µs/step | load (runs) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for label, _, _ in PLANS:
        for side in sides:
            rs = runs[(label, side)]
            loads = ", ".join(f"{r['load']:.2f}" for r in rs)
            print(
                f"| {label} | {side} | {_median(rs, 'steps_per_s'):.0f} | {_median(rs, 'step_p50_ms'):.2f} | "
                f"{_median(rs, 'cpu_us_per_step', 'agent-loop'):.0f} | {_median(rs, 'cpu_us_per_step', 'tool-worker'):.0f} | "
                f"{_median(rs, 'cpu_us_per_step', 'redis'):.0f} | {loads} |"
            )
    if args.profile:
        print()
        print(
            "| processes | code | trace entries folded a step | agent loop's profile in TraceFold.feed "
            "| in FoldCache.put |"
        )
        print("|---|---|---:|---:|---:|")
        for label, _, _ in PLANS:
            for side in sides:
                rs = runs[(label, side)]
                print(
                    f"| {label} | {side} | {_median(rs, 'folded_per_step'):.2f} | "
                    f"{100 * _median(rs, 'fold_share'):.1f} % | {100 * _median(rs, 'put_share'):.1f} % |"
                )
    for side in sides:
        one = statistics.median(r["steps_per_s"] for r in runs[("1 + 1", side)])
        two = statistics.median(r["steps_per_s"] for r in runs[("2 + 2", side)])
        print(f"{side}: 2 + 2 / 1 + 1 = {two / one:.2f}")
    if args.json:
        args.json.write_text(json.dumps({f"{k[0]} {k[1]}": v for k, v in runs.items()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
