"""The long chaos run: kill -9 random service processes for minutes while turns run.

    python bench/chaos.py                       # defaults: 1,500 turns, 3 agent loops, 3 tool workers
    python bench/chaos.py --conversations 60 --turns 4 --publish-over-s 20   # a quick one
    python bench/chaos.py --write               # also record the figures in bench/RESULTS.md

Real Redis (REDIS_URL, else a local redis-server on a free port), the services as separate OS
processes (``agentstream serve``) at their own concurrency and batch size, the scripted
OpenAI-compatible model over HTTP with parallel tool calls (tools below, around and several times
over the claim idle time), hostile entries and duplicate and malformed copies of live entries
mixed into every stream a backend can write, and kill -9 of a random service process every 0.5–2.5 s (never the last live one of
its service; restarted 0.1–1.5 s later, under its old consumer name or a new one). The same harness as the bounded test in
tests/chaos/ (tests/support/chaos.py), bigger. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.chaos import ChaosConfig, ChaosResult, ChaosRun  # noqa: E402
from tests.support.redis_server import local_redis_server  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Chaos"


@contextmanager
def redis_url():
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        yield explicit
        return
    with local_redis_server() as (url, _proc, _dir):
        yield url


def redis_version(url: str) -> str:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return client.info("server")["redis_version"]
    finally:
        client.close()


def section(result: ChaosResult, config: ChaosConfig, version: str, command: str, load: str = "") -> str:
    f = result.figures()
    failed = ", ".join(f"{code} {n}" for code, n in sorted(result.failed.items())) or "none"
    rows = [
        ("turns", f["turns"]),
        ("answered / failed with a reason", f"{f['answered']} / {sum(result.failed.values())} ({failed})"),
        ("tool calls", f["tool calls"]),
        ("kills (kill -9)", f"{f['kills']} ({f['kills holding work']} while holding work)"),
        ("duplicates (results per call > 1, side effects run twice)", f["duplicates"]),
        ("lost turns", f["lost"]),
        ("dangling calls", f["dangling calls"]),
        ("entries left pending at the end", f["left pending"]),
        ("entries handled twice (a call run again while its earlier run's process lived)", f["entries handled twice"]),
        ("side-effect tools run twice", f["side-effect tools run twice"]),
        (
            "false outcome-unknown results (no process that started the call was killed)",
            f["false outcome-unknown results"],
        ),
        ("services stopped by an input", f["services stopped by an input"]),
        (
            "hostile entries / duplicate copies / malformed copies injected",
            (
                f"{f['hostile entries injected']} / {f['duplicate copies of live entries']} / "
                f"{f['malformed copies of live entries']}"
            ),
        ),
        ("kill → next progress of the work it held, p50", f"{f['kill → next progress p50 (s)']} s"),
        ("kill → next progress of the work it held, p90", f"{f['kill → next progress p90 (s)']} s"),
        ("kill → next progress of the work it held, max", f"{f['kill → next progress max (s)']} s"),
        ("recoveries measured (work held at a kill)", f["recoveries measured"]),
        *(
            (
                f"kill → next progress, {kind} (p50 / p90 / max, measured)",
                f"{f[f'kill → next progress, {kind} p50 (s)']} / {f[f'kill → next progress, {kind} p90 (s)']} / "
                f"{f[f'kill → next progress, {kind} max (s)']} s ({f[f'kill → next progress, {kind}, measured']})",
            )
            for kind in ("quick work", "slow tools")
        ),
        *(
            (
                f"{kind}: until delivered again · then until its tool started · the tool's own run · the rest "
                "(p50 / p90)",
                " · ".join(f"{f[f'{kind}: {part} p50 / p90 (s)']} s" for part in ("claim", "handler", "tool", "rest")),
            )
            for kind in ("quick work", "slow tools")
        ),
        ("outcome-unknown results (side-effect tool killed mid-run)", f["outcome-unknown results"]),
        ("re-runs of `work` and `upsert` calls (allowed: retry-safe)", f["re-runs of retry-safe calls"]),
        ("late results", f["late results"]),
        ("duplicate replies (replies are at-least-once)", f["duplicate replies (at-least-once)"]),
        ("wall time", f"{f['wall time (s)']} s"),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    env = ", ".join(f"`{k}={v}`" for k, v in sorted(config.env.items()))
    lines = [
        SECTION,
        "",
        f"`{command}` ({datetime.date.today().isoformat()}; {platform.machine()}, {os.cpu_count()} cores shared with "
        f"other work{load}; Redis {version} on loopback; {config.agent_loops} agent-loop and {config.tool_workers} tool-worker "
        f"processes; the scripted model over HTTP; seed {config.seed}).",
        "",
        f"{config.conversations} conversations × {config.turns_per_conversation} turns, published over "
        f"{config.publish_over_s:.0f} s. Each turn makes 1–3 parallel `work` calls and, at random, a `record` call "
        "(side effects, not retry-safe) and an `upsert` call (side effects, retry-safe). "
        + (
            "Tool run times: most `work` calls 5–600 ms, a fifth 1–2.5 s (around the claim idle time), a tenth 3–6 s "
            "(two to four times it); three in ten `record`/`upsert` calls take 1–4 s. "
            if config.slow_tools
            else ""
        )
        + (
            "Meanwhile an entry is injected every "
            f"{config.hostile_every_s[0]}–{config.hostile_every_s[1]} s into the turns, cancel, wake-up or tool-job stream: "
            "a hostile one (4 KB of nesting, wrong types, 256 KB, bytes that are not JSON, a wrong field), an exact "
            "copy of a live turn or job, or a malformed copy of one (same ids, bad body). "
            if config.hostile_every_s
            else ""
        )
        + f"The services run at concurrency {config.env.get('AGENTSTREAM_CONCURRENCY', '64 (the default)')}. "
        "A random service process "
        f"(never the last live one of its service) is killed with SIGKILL every {config.kill_every_s[0]}–"
        f"{config.kill_every_s[1]} s and restarted {config.restart_after_s[0]}–{config.restart_after_s[1]} s later, "
        f"half the time under a new consumer name. Settings: {env}.",
        "",
        "| figure | value |",
        "|---|---|",
        table,
        "",
        '"Kill → next progress" is, for every piece of work the killed process held at the kill (its pending '
        "entries: a tool call's job, a turn or a wake-up of a trace), the time until that work's next progress: the "
        "call's result, or the trace's next event for a turn or a wake-up (p50, p90 and max over all of them). It is "
        "quick or slow by that work alone: a tool call planned at 1 s or more is slow, a step is quick; the target is "
        "quick work's p90 at most 10 s. Its parts: until the entry was delivered again (claimed by a live consumer once "
        "idle, or read again by the process restarted under its name; watched every 0.1 s), then until its tool "
        "started (the wait for a handler; for a step or a call that did not run again, the whole handling), and the "
        "own run of the tool run that answered (the test tools log every run's start and end); the rest is the "
        "result's write, or a run killed again and its own recovery. "
        "A `record` call whose worker was killed mid-run gets an outcome-unknown error result instead "
        "of running again, which is why its effects never repeat; `work` and `upsert` calls may run again, but only after "
        'the process of their earlier run was killed: "entries handled twice" counts the calls started again while that '
        'process lived (every run of a tool logs its start, end and pid), and a "false outcome unknown" is one given to a '
        'call no killed process had started. "Services stopped by an input" counts service processes that exited by '
        "themselves. The "
        "bounded version (300 turns, 2 + 2 processes, about a minute) runs in the test suite: `pytest tests/chaos`.",
        "",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace (or add) the Chaos section of bench/RESULTS.md; other sections stay as they are."""
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _m: text, current)
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(updated)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument("--publish-over-s", type=float, default=180.0)
    parser.add_argument("--agent-loops", type=int, default=3)
    parser.add_argument("--tool-workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--deadline-s", type=float, default=1800.0)
    parser.add_argument(
        "--kill-every-s", type=float, nargs=2, default=(0.5, 2.5), metavar=("MIN", "MAX"), help="pause between kills"
    )
    parser.add_argument(
        "--restart-after-s", type=float, nargs=2, default=(0.1, 1.5), metavar=("MIN", "MAX"), help="pause to a restart"
    )
    parser.add_argument("--concurrency", type=int, default=0, help="AGENTSTREAM_CONCURRENCY (0: the default)")
    parser.add_argument("--quick-tools", action="store_true", help="only quick tools (no run time near the idle time)")
    parser.add_argument("--no-hostile", action="store_true", help="inject no hostile entries or copies")
    parser.add_argument("--write", action="store_true", help="record the figures in bench/RESULTS.md")
    parser.add_argument("--logs", type=Path, default=None, help="keep the services' logs in this directory")
    args = parser.parse_args()
    config = ChaosConfig(
        conversations=args.conversations,
        turns_per_conversation=args.turns,
        agent_loops=args.agent_loops,
        tool_workers=args.tool_workers,
        publish_over_s=args.publish_over_s,
        deadline_s=args.deadline_s,
        seed=args.seed,
        slow_tools=not args.quick_tools,
        hostile_every_s=None if args.no_hostile else (0.2, 0.6),
        kill_every_s=tuple(args.kill_every_s),
        restart_after_s=tuple(args.restart_after_s),
    )
    if args.concurrency:
        config.env["AGENTSTREAM_CONCURRENCY"] = str(args.concurrency)
    with redis_url() as url, tempfile.TemporaryDirectory(prefix="agentstream-chaos-") as scratch:
        logs = str(args.logs) if args.logs else scratch
        Path(logs).mkdir(parents=True, exist_ok=True)
        version = redis_version(url)
        print(
            f"chaos: {config.conversations * config.turns_per_conversation} turns, Redis {version}, logs in {logs}",
            flush=True,
        )
        before = os.getloadavg()
        result = ChaosRun(url, f"chaos-{uuid.uuid4().hex[:8]}", Path(logs), config).run()
        after = os.getloadavg()
    load = f", load average {before[0]:.1f} before and {after[0]:.1f} after"
    print(f"load average (1 min): {before[0]:.1f} before, {after[0]:.1f} after")
    print(result.report())
    print("slowest recoveries (s, killed process, service, trace):", result.slowest)
    print("slowest quick recoveries (s, claim, handler, tool, rest, killed process, trace, call):")
    for row in result.slowest_quick:
        print("  ", row)
    if result.lost:
        print("lost:", ", ".join(result.lost[:20]))
    for text in result.stopped_logs[:3]:
        print("a service stopped by itself:", text[-1500:])
    command = "python bench/chaos.py " + " ".join(sys.argv[1:])
    if args.write:
        write_section(section(result, config, version, command.replace(" --write", "").strip(), load))
        print(f"wrote the {SECTION!r} section of {RESULTS.relative_to(ROOT)}")
    print("OK" if result.ok else "FAILED")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
