"""Does one agent loop's memory stay under its limit, however many conversations it has seen?

    python bench/memory.py                       # 3 minutes of one-turn conversations, then long ones
    python bench/memory.py --minutes 10 --long 20 --write   # record the figures in bench/RESULTS.md

One agent loop and one tool worker (bench/throughput.py's real services and model double: a
tool round then an answer, two steps a turn) on a private Redis. A driver serves many one-turn
conversations, each a new trace (``--concurrency`` at a time, for ``--minutes``), then
``--long`` conversations of ``--turns`` turns side by side, and samples the agent loop's RSS
(``/proc/<pid>/status`` VmRSS) every ``--every-s`` seconds. The agent loop's fold cache is bound
as a pod with ``--limit-mib`` of memory would bind it (``AGENTSTREAM_FOLD_CACHE_BYTES`` =
:func:`agentstream.ops.memory.cache_bytes_for_limit` of the limit; the machine running the bench
has no cgroup limit of its own): RSS must level off once the cache is full, under the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

from agentstream.ops.memory import cache_bytes_for_limit  # noqa: E402
from agentstream.wire.codec import EVENT_FIELD  # noqa: E402
from bench.throughput import Driver, Services, _ready, private_redis  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Memory of one agent loop"
MiB = 1 << 20


def rss_bytes(pid: int) -> int:
    """The resident set of a process, in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def sitting(args: argparse.Namespace) -> dict:
    bound = cache_bytes_for_limit(args.limit_mib * MiB)
    os.environ["AGENTSTREAM_FOLD_CACHE_BYTES"] = str(bound)  # the services inherit it
    samples: list[dict] = []
    served = {"one_turn": 0, "long_turns": 0}
    with private_redis() as (port, _redis_pid, client):
        services = Services(port, 1, 1, concurrency=args.concurrency)
        driver = Driver(port, services.namespace)
        loop_pid = services.pids("agent-loop")[0]
        started = time.monotonic()
        phase = ["one-turn"]

        async def sample() -> None:
            while True:
                samples.append(
                    {
                        "t_s": round(time.monotonic() - started, 1),
                        "phase": phase[0],
                        "one_turn": served["one_turn"],
                        "long_turns": served["long_turns"],
                        "rss_mib": round(rss_bytes(loop_pid) / MiB, 1),
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
                await asyncio.sleep(args.every_s)

        try:
            await driver.start()
            await _ready(driver, services)
            sampler = asyncio.create_task(sample())
            stop_at = time.monotonic() + args.minutes * 60
            next_id = [0]

            async def one_turn_worker() -> None:
                while time.monotonic() < stop_at:
                    n = next_id[0]
                    next_id[0] += 1
                    await driver.turn(f"one-{n}", f"one-{n}-t0")
                    served["one_turn"] += 1

            await asyncio.gather(*(one_turn_worker() for _ in range(args.concurrency)))
            phase[0] = "long"

            async def long_conversation(i: int) -> None:
                for turn in range(args.turns):
                    await driver.turn(f"long-{i}", f"long-{i}-t{turn}")
                    served["long_turns"] += 1

            await asyncio.gather(*(long_conversation(i) for i in range(args.long)))
            phase[0] = "end"
            await asyncio.sleep(args.every_s)
            sampler.cancel()
            stored = sum(len(f[EVENT_FIELD]) for _, f in client.xrange(services_trace_key(services, "one-0")))
        finally:
            await driver.close()
            services.stop()
        redis_version = client.info("server")["redis_version"]
    return {
        "samples": samples,
        "served": served,
        "bound_bytes": bound,
        "limit_mib": args.limit_mib,
        "stored_bytes_per_one_turn": stored,
        "redis_version": redis_version,
        "args": vars(args),
    }


def services_trace_key(services: Services, trace_id: str) -> str:
    from agentstream.wire.keys import Keys

    return Keys(services.namespace, 1).trace(trace_id)


def report(result: dict) -> str:
    import redis

    samples = result["samples"]
    one = [s for s in samples if s["phase"] == "one-turn"]
    peak = max(s["rss_mib"] for s in samples)
    half = one[len(one) // 2 :] if one else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = [
        f"### The sitting of {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC (code at {commit.strip()})",
        "",
        f"`python bench/memory.py --minutes {result['args']['minutes']} --long {result['args']['long']} "
        f"--turns {result['args']['turns']} --limit-mib {result['limit_mib']}`; Python {platform.python_version()}, "
        f"redis-py {redis.__version__}, Redis {result['redis_version']}, load average {os.getloadavg()[0]:.1f} at the end, "
        f"{os.cpu_count()} cores. Fold cache bound {result['bound_bytes'] / MiB:.0f} MiB "
        f"(a quarter of a {result['limit_mib']} Mi limit). Served: {result['served']['one_turn']:,} one-turn "
        f"conversations (two steps each, {result['stored_bytes_per_one_turn']:,} stored event bytes), then "
        f"{result['args']['long']} conversations of {result['args']['turns']} turns "
        f"({result['served']['long_turns']:,} turns).",
        "",
        "| t (s) | phase | one-turn conversations | long-conversation turns | agent-loop RSS (MiB) |",
        "|---:|---|---:|---:|---:|",
    ]
    step = max(1, len(samples) // 16)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    for s in shown:
        lines.append(f"| {s['t_s']} | {s['phase']} | {s['one_turn']:,} | {s['long_turns']:,} | {s['rss_mib']} |")
    lines += [
        "",
        f"Peak RSS {peak} MiB against the {result['limit_mib']} Mi limit"
        + (
            f"; over the second half of the one-turn phase RSS ranged {min(s['rss_mib'] for s in half)}"
            f"-{max(s['rss_mib'] for s in half)} MiB."
            if half
            else "."
        ),
    ]
    return "\n".join(lines)


def write_results(text: str) -> None:
    content = RESULTS.read_text()
    if SECTION not in content:
        content = content.rstrip("\n") + f"\n\n{SECTION}\n\nWritten by `python bench/memory.py --write`.\n"
    head, _, tail = content.partition(SECTION)
    intro, sep, rest = tail.partition("\n### ")
    RESULTS.write_text(head + SECTION + intro.rstrip("\n") + "\n\n" + text + "\n" + (sep + rest if sep else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes of one-turn conversations")
    parser.add_argument("--concurrency", type=int, default=64, help="one-turn conversations at a time")
    parser.add_argument("--long", type=int, default=10, help="conversations of --turns turns, after")
    parser.add_argument("--turns", type=int, default=100, help="turns of each long conversation")
    parser.add_argument("--limit-mib", type=int, default=512, help="the pod memory limit the cache is bound for")
    parser.add_argument("--every-s", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--write", action="store_true", help="record the figures in bench/RESULTS.md")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    result = asyncio.run(sitting(args))
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if args.write:
        write_results(text)


if __name__ == "__main__":
    main()
