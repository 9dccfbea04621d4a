"""Benchmark: rebuilding a model call's context from a stored trace.

Prints, for generated conversations of about 1 k, 10 k and 100 k events:

- the cold rebuild: every event folded from the first, the next call's request built (with the
  default context policy, a 128 000-token window and compaction; and with no limits at all);
- the incremental step with the per-worker cache: the trace grows by one model call's events at
  a time and each next call's request is rebuilt, as the agent loop does.

The conversations are what an agent produces: turns of one to three tool rounds, results of a
few hundred to several thousand characters (some with sources), answers that cite, and a
compaction appended wherever the library says one is due (as the compaction service would).

Usage: ``python bench/context_rebuild.py [--sizes 1000,10000,100000] [--replay-max 10000] [--json OUT]
[--baseline IN] [--write]``. ``--replay-max`` also times rebuilding every model call of each trace
of at most that many events (:func:`agentstream.steps.replay.rebuild_calls`, what ``agentstream trace
verify`` does); ``--json`` keeps the figures; ``--baseline`` prints those of another run (say, of
the library at an earlier commit: ``PYTHONPATH=<its shared/> python bench/context_rebuild.py --json
before.json``) beside these, with the ratios; ``--write`` replaces the "Context rebuild" section of
bench/RESULTS.md with the figures (and the baseline's).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentstream import Agent, tool
from agentstream.context import (
    BRACKETS,
    Compact,
    ContextCache,
    ContextConfig,
    ContextPolicy,
    ModelLimits,
    Tokens,
    build_context,
    compaction_event,
)
from agentstream.wire.events import (
    Document,
    ModelOutput,
    Passage,
    ToolCall,
    ToolOutput,
    TurnEnded,
    TurnInput,
)

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "## Context rebuild"


@tool
def search(query: str, limit: int = 5) -> str:
    """Search the knowledge base; returns passages with their documents."""
    return query


@tool
def read(path: str) -> str:
    """Read a file."""
    return path


@tool
def run(command: str) -> str:
    """Run a shell command in the sandbox."""
    return command


AGENT = Agent(
    name="bench",
    system_prompt="You are a careful research assistant. Cite sources as [n]. " * 8,
    tools=[search, read, run],
    max_passes=8,
    context=ContextConfig(policy=ContextPolicy(compact=Compact()), citations=BRACKETS),
    model_limits=ModelLimits(window=Tokens(128_000)),
)

WORDS = "the of and to in is that for it as with was on be by this are from at or an have not".split()


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def conversation(events_wanted: int, *, sources: bool = True, seed: int = 7) -> list[Any]:
    """A conversation of about ``events_wanted`` events, compacted where due; it ends on a new turn's input.

    With ``sources``, search results carry a document and three passages (a retrieval agent);
    without, every result is plain text (a coding or operations agent).
    """
    rng = random.Random(seed)
    events: list[Any] = []
    entries: list[tuple[str, Any]] = []
    cache = ContextCache()
    calls = 0
    docs = 0
    number = 0
    while len(events) < events_wanted:
        turn = f"t{number}"
        number += 1
        events.append(TurnInput(turn_id=turn, agent="bench", text=words(rng, rng.randint(8, 60))))
        entries.extend((str(i), e) for i, e in enumerate(events[len(entries) :], start=len(entries)))
        built = cache.build("bench", entries, AGENT, turn_id=turn, step=0)
        if built.compaction is not None:
            events.append(compaction_event(built.compaction, words(rng, 300)))
        step = 0
        for _ in range(rng.randint(1, 3)):
            count = rng.randint(1, 3)
            tool_calls = []
            for _ in range(count):
                calls += 1
                name = rng.choice(["search", "read", "run"])
                tool_calls.append(
                    ToolCall(
                        id=f"call_{calls}", name=name, arguments=json.dumps({"query": words(rng, rng.randint(3, 40))})
                    )
                )
            events.append(ModelOutput(turn_id=turn, step=step, tool_calls=tuple(tool_calls), stop_reason="tool_calls"))
            step += 1
            for call in tool_calls:
                elements: tuple = ()
                if sources and call.name == "search":
                    docs += 1
                    elements = (
                        Document(id=f"doc{docs}", title=words(rng, 5), url=f"https://example.org/{docs}"),
                        *(
                            Passage(id=f"doc{docs}#{k}", ref=f"doc{docs}", text=words(rng, rng.randint(40, 200)))
                            for k in range(3)
                        ),
                    )
                events.append(
                    ToolOutput(
                        turn_id=turn,
                        call_id=call.id,
                        name=call.name,
                        text=words(rng, rng.randint(20, 900)),
                        elements=elements,
                    )
                )
        cite = f" [{rng.randint(1, max(1, docs * 4))}]" if docs else ""
        events.append(ModelOutput(turn_id=turn, step=step, content=words(rng, rng.randint(30, 150)) + cite))
        events.append(TurnEnded(turn_id=turn, answer="."))
    events.append(TurnInput(turn_id=f"t{number}", agent="bench", text="and what follows from that?"))
    return events


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return min(times)


def incremental(events: list[Any], steps: int) -> tuple[float, float, float]:
    """Median and 95th-percentile ms of a cached rebuild per model call, and events added per call."""
    points = [i for i, e in enumerate(events) if isinstance(e, ModelOutput)][-steps:]
    entries = [(str(i), e) for i, e in enumerate(events)]
    cache = ContextCache()
    first = points[0]
    cache.build("bench", entries[:first], AGENT, turn_id=events[first].turn_id, step=events[first].step)
    times = []
    previous = first
    added = []
    for point in points[1:]:
        output = events[point]
        visible = entries[:point]
        start = time.perf_counter()
        cache.build("bench", visible, AGENT, turn_id=output.turn_id, step=output.step)
        times.append((time.perf_counter() - start) * 1000.0)
        added.append(point - previous)
        previous = point
    assert cache.misses == 1, "every step after the first hits the cache"
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1], statistics.mean(added)


def machine() -> str:
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{os.cpu_count()} CPUs (nproc), {model}; Python {platform.python_version()}"


def load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def replay_s(events: list[Any]) -> float:
    """Seconds to rebuild every model call of the trace (and render and fingerprint its body)."""
    from agentstream.steps.replay import rebuild_calls

    gc.collect()
    start = time.perf_counter()
    rebuild_calls(events, {AGENT.name: AGENT}.get)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="trace sizes in events, comma-separated")
    parser.add_argument("--steps", type=int, default=200, help="model calls timed for the incremental figure")
    parser.add_argument(
        "--replay-max", type=int, default=0, help="also time replaying every call of traces of at most this many events"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--baseline", type=Path, help="figures of another run (--json) to print beside these")
    parser.add_argument(
        "--label", default="", help="what this run measures (default: the git commit, and the working tree)"
    )
    parser.add_argument("--write", action="store_true", help="write the figures into bench/RESULTS.md")
    args = parser.parse_args()
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    before = {(r["events"], r["workload"]): r for r in baseline["rows"]} if baseline else {}
    run = {
        "label": args.label or label(),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_before": load(),
        "rows": [],
    }
    for size, sources in ((int(s), kind) for s in args.sizes.split(",") for kind in (True, False)):
        events = conversation(size, sources=sources)
        last = events[-1]
        repeat = 5 if size <= 10_000 else 3
        built = build_context(events, AGENT, turn_id=last.turn_id, step=0)
        cold = best_ms(
            lambda events=events, last=last: build_context(events, AGENT, turn_id=last.turn_id, step=0), repeat
        )
        plain = best_ms(
            lambda events=events, last=last: build_context(events, AGENT, turn_id=last.turn_id, step=0, limits=None),
            repeat,
        )
        median, p95, added = incremental(events, args.steps)
        replay = replay_s(events) if len(events) <= args.replay_max else None
        row = {
            "events": len(events),
            "workload": "with sources" if sources else "plain text",
            "cold_ms": cold,
            "plain_ms": plain,
            "step_median_ms": median,
            "step_p95_ms": p95,
            "added": added,
            "replay_s": replay,
            "messages": len(built.request.messages),
            "tokens": built.size_tokens,
            "compactions": sum(1 for e in events if type(e).__name__ == "Compaction"),
        }
        run["rows"].append(row)
        was = before.get((row["events"], row["workload"]), {})
        print(
            f"{row['events']:>7} events, {row['workload']:>12}: cold {cold:7.1f} ms{versus(was, 'cold_ms', cold)} "
            f"(no limits {plain:6.1f} ms{versus(was, 'plain_ms', plain)}); cached step median {median:.3f} ms"
            f"{versus(was, 'step_median_ms', median, 3)}, p95 {p95:.3f} ms ({added:.1f} events added per call)"
            + (
                f"; replay of every call {replay:.2f} s{versus(was, 'replay_s', replay, 2, 's')}"
                if replay is not None
                else ""
            )
            + f"; {row['messages']} messages, ~{row['tokens']} tokens, {row['compactions']} compactions",
            flush=True,
        )
    run["load_after"] = load()
    if args.json:
        args.json.write_text(json.dumps(run, indent=1) + "\n")
    if args.write:
        write(run, baseline)


def label() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=RESULTS.parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "this run"
    return f"{commit} and the working tree"


def versus(was: dict, key: str, now: float | None, digits: int = 1, unit: str = "ms") -> str:
    """`` (was X, N× faster)`` against the baseline's figure, when it has one."""
    then = was.get(key)
    if then is None or now is None:
        return ""
    return f" (was {then:.{digits}f} {unit}, {then / now:.1f}× faster)" if now > 0 else ""


def cell(row: dict, was: dict, key: str, digits: int = 1, unit: str = "ms") -> str:
    now = row.get(key)
    if now is None:
        return "—"
    then = was.get(key)
    if then is None:
        return f"{now:.{digits}f} {unit}"
    return f"{now:.{digits}f} {unit} (was {then:.{digits}f}, {then / now:.1f}×)"


def write(run: dict, baseline: dict | None) -> None:
    before = {(r["events"], r["workload"]): r for r in baseline["rows"]} if baseline else {}
    lines = [
        SECTION,
        "",
        f"`python bench/context_rebuild.py` on {run['date']}, {run['machine']}: {run['label']}; load average "
        f"{run['load_before']} before, {run['load_after']} after",
        "(the machine is shared with other work: figures vary by up to a factor of two between runs).",
    ]
    if baseline:
        lines += [
            f'"was": the same benchmark just before on the same machine, {baseline["label"]} (load average '
            f"{baseline['load_before']} before, {baseline['load_after']} after); × is how many times faster now.",
        ]
    lines += [
        "Cold: every event folded from the first and the next call's request built (default policy,",
        '128 000-token window, compaction), best of 5 (3 at 100 k); "no limits" skips the policy.',
        "Cached step: the per-worker cache folds only the events added since the last call (median",
        "and 95th percentile over 200 model calls at the end of the trace). Replay: every model call of",
        "the trace rebuilt, rendered and fingerprinted (`agentstream trace verify`), once. Target: cold 10 k ≤ 50 ms.",
        "",
        (
            "| events | results | cold rebuild | cold, no limits | cached step (median) | cached step (p95) | "
            "replay, every call | messages sent | compactions |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in run["rows"]:
        was = before.get((row["events"], row["workload"]), {})
        lines.append(
            f"| {row['events']:,} | {row['workload']} | {cell(row, was, 'cold_ms')} | {cell(row, was, 'plain_ms')} | "
            f"{cell(row, was, 'step_median_ms', 3)} | {cell(row, was, 'step_p95_ms', 3)} | "
            f"{cell(row, was, 'replay_s', 2, 's')} | "
            f"{row['messages']} | {row['compactions']} |"
        )
    section = "\n".join(lines) + "\n"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        following = rest.find("\n## ")
        tail = rest[following + 1 :] if following >= 0 else ""
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)
    print(f"wrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
