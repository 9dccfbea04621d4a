"""agentstream beside the durable-agent runtimes people would pick instead, in one sitting.

    scripts/bootstrap && bench/peers/setup              # agentstream's .venv; the peers' own venv
    .venv/bin/python bench/peers/run.py                 # everything (about 15 minutes on 2 cores)
    .venv/bin/python bench/peers/run.py --quick         # short runs, a 200-turn long conversation
    .venv/bin/python bench/peers/run.py --write         # also record the sitting in bench/RESULTS.md

The same work everywhere (``work.py``): one agent, a zero-latency model double in the runtime's
own process, one no-op tool; a turn is a tool round and an answer (two model calls). Figures per
runtime: turns/s with 64 concurrent conversations, turn p50/p99 of one conversation, CPU per turn
of every process (the runtime's, and its database's), bytes the database stored per turn, and
turn 1,000 of one long conversation against turn 50 (latency, CPU, bytes written), each
checkpoint turn followed by a turn of a short reference conversation so the machine's drift
cancels in the ratio.

Equal durability: agentstream's Redis runs with ``appendonly yes`` and ``appendfsync always``
(every write fsynced to the append-only file before the command replies), beside Postgres's
default commit (``synchronous_commit=on``, ``fsync=on``: a commit returns once its WAL is flushed).
Either survives a power cut with every acknowledged write. agentstream's services are separate
OS processes (1 agent loop + 1 tool worker), as deployed; each peer is one process that drives
its own conversations, which is how each is run (LangGraph and pydantic-ai run the agent in the
caller's process; their servers add a process in front that this leaves out, to their favour).
Postgres (the machine's, ``/usr/local/bin``) and Redis are started here on free ports.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "bench")]
import throughput  # noqa: E402  (agentstream's services, the model double and the driver)
from work import ANSWER, ARGUMENTS, RESULT, THINKING, CpuMeter, pct  # noqa: E402

PEERS_PYTHON = Path(os.environ.get("PEERS_PYTHON", HERE / ".venv" / "bin" / "python"))
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Peers"

assert (THINKING, RESULT, ANSWER, ARGUMENTS) == (
    throughput.THINKING,
    throughput.RESULT,
    throughput.ANSWER,
    throughput.ARGUMENTS,
), "work.py and bench/throughput.py must do the same work"


def _as_postgres_user() -> list[str]:
    """Postgres refuses to run as root: run its binaries as the ``postgres`` user then."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@contextmanager
def private_postgres():
    """A Postgres of our own on a free port (default settings: fsync and synchronous commit on)
    → (dsn, postmaster pid)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    port = throughput.free_port()
    subprocess.run(
        [*_as_postgres_user(), "initdb", "-D", str(folder / "data"), "-A", "trust", "-U", "postgres"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    proc = subprocess.Popen(
        [
            *_as_postgres_user(),
            "postgres",
            "-D",
            str(folder / "data"),
            "-p",
            str(port),
            "-k",
            str(folder),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=200",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid_file = folder / "data" / "postmaster.pid"
    for _ in range(300):
        if pid_file.exists() and len(pid_file.read_text().splitlines()) >= 8 and "ready" in pid_file.read_text():
            break
        time.sleep(0.05)
    postmaster = int(pid_file.read_text().splitlines()[0])
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster
    finally:
        os.kill(postmaster, signal.SIGINT)  # fast shutdown
        proc.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def durable_redis():
    """A redis-server of our own, every write fsynced to its append-only file → (port, pid, client, dir)."""
    binary = next(
        (b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), "redis-server"
    )
    port = throughput.free_port()
    folder = tempfile.mkdtemp(prefix="bench-redis-aof-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            folder,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis as redis_sync

    client = redis_sync.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis_sync.ConnectionError:
            time.sleep(0.02)
    try:
        yield port, proc.pid, client, Path(folder)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def redis_bytes(client, folder: Path) -> dict:
    """The dataset's bytes in memory and the append-only files' bytes on disk."""
    info = client.info("memory")
    aof = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "aof" in p.name)
    return {"memory": int(info["used_memory_dataset"]), "aof": aof}


async def agentstream_load(
    port: int, redis_pid: int, client, folder: Path, conversations: int, warm_s: float, dur_s: float
) -> dict:
    services = throughput.Services(port, 1, 1)
    driver = throughput.Driver(port, services.namespace)
    try:
        await driver.start()
        await throughput._ready(driver, services)
        latencies: list[float] = []
        counted = [0]
        stop_at = [float("inf")]
        measuring = [False]

        async def conversation(i: int) -> None:
            n = 0
            while time.perf_counter() < stop_at[0]:
                n += 1
                t0 = time.perf_counter()
                await driver.turn(f"conv-{i}", f"c{i}-t{n}")
                t1 = time.perf_counter()
                if measuring[0] and t1 <= stop_at[0]:
                    latencies.append(t1 - t0)
                    counted[0] += 1

        tasks = [asyncio.create_task(conversation(i)) for i in range(conversations)]
        await asyncio.sleep(warm_s)
        pids = {
            "agent loop": services.pids("agent-loop")[0],
            "tool worker": services.pids("tool-worker")[0],
            "redis": redis_pid,
            "driver": os.getpid(),
        }
        bytes0 = redis_bytes(client, folder)
        meter = CpuMeter(pids)
        measuring[0] = True
        stop_at[0] = time.perf_counter() + dur_s
        await asyncio.gather(*tasks)
        cpu = meter.used_s()
        bytes1 = redis_bytes(client, folder)
    finally:
        await driver.close()
        services.stop()
    turns = max(counted[0], 1)
    return {
        "turns": counted[0],
        "turns_per_s": counted[0] / dur_s,
        "turn_p50_ms": pct(latencies, 50) * 1000,
        "turn_p99_ms": pct(latencies, 99) * 1000,
        "cpu_ms_per_turn": {k: v / turns * 1000 for k, v in cpu.items()},
        "bytes_per_turn": {k: (bytes1[k] - bytes0[k]) / turns for k in bytes0},
    }


async def agentstream_latency(port: int, turns: int) -> dict:
    services = throughput.Services(port, 1, 1)
    driver = throughput.Driver(port, services.namespace)
    latencies = []
    try:
        await driver.start()
        await throughput._ready(driver, services)
        for n in range(turns + 5):
            t0 = time.perf_counter()
            await driver.turn("latency", f"l{n}")
            if n >= 5:
                latencies.append(time.perf_counter() - t0)
    finally:
        await driver.close()
        services.stop()
    return {"turns": turns, "turn_p50_ms": pct(latencies, 50) * 1000, "turn_p99_ms": pct(latencies, 99) * 1000}


async def agentstream_growth(
    port: int, redis_pid: int, client, folder: Path, checkpoints: list[int], window: int
) -> dict:
    services = throughput.Services(port, 1, 1)
    driver = throughput.Driver(port, services.namespace)
    out = {}
    try:
        await driver.start()
        await throughput._ready(driver, services)
        pids = {
            "agent loop": services.pids("agent-loop")[0],
            "tool worker": services.pids("tool-worker")[0],
            "redis": redis_pid,
        }
        n = ref_n = 0
        ref_id = ""
        for checkpoint in checkpoints:
            while n < checkpoint - window:
                n += 1
                await driver.turn("long", f"t{n}")
            long_s, ref_s, long_cpu, ref_cpu, long_bytes = [], [], [], [], []
            for _ in range(window):
                n += 1
                b0 = redis_bytes(client, folder)["aof"]
                meter = CpuMeter(pids)
                t0 = time.perf_counter()
                await driver.turn("long", f"t{n}")
                long_s.append(time.perf_counter() - t0)
                long_cpu.append(sum(meter.used_s().values()))
                long_bytes.append(redis_bytes(client, folder)["aof"] - b0)
                if ref_n % 50 == 0:
                    ref_id = f"ref-{uuid.uuid4().hex[:6]}"
                ref_n += 1
                meter = CpuMeter(pids)
                t0 = time.perf_counter()
                await driver.turn(ref_id, f"r{ref_n}")
                ref_s.append(time.perf_counter() - t0)
                ref_cpu.append(sum(meter.used_s().values()))
            out[str(checkpoint)] = {
                "turn_ms": pct(long_s, 50) * 1000,
                "reference_turn_ms": pct(ref_s, 50) * 1000,
                "cpu_ms": pct(long_cpu, 50) * 1000,
                "reference_cpu_ms": pct(ref_cpu, 50) * 1000,
                "wal_bytes": pct(long_bytes, 50),
            }
    finally:
        await driver.close()
        services.stop()
    return out


def run_peer(peer: str, dsn: str, postmaster: int, mode: str, extra: list[str]) -> dict:
    out = subprocess.run(
        [
            str(PEERS_PYTHON),
            str(HERE / "peer.py"),
            peer,
            "--dsn",
            dsn,
            "--postmaster-pid",
            str(postmaster),
            "--mode",
            mode,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{peer} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def sitting(args) -> dict:
    checkpoints = [50, args.long]
    out: dict = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "peers": {},
    }
    with durable_redis() as (port, redis_pid, client, folder), private_postgres() as (dsn, postmaster):
        out["redis"] = client.info("server")["redis_version"]
        out["postgres"] = subprocess.run(["postgres", "--version"], capture_output=True, text=True).stdout.split()[2]
        print(f"redis {out['redis']} (appendfsync always), postgres {out['postgres']}", flush=True)
        row = out["peers"].setdefault("agentstream", {})
        row["load"] = asyncio.run(agentstream_load(port, redis_pid, client, folder, 64, args.warm, args.dur))
        print("agentstream load", json.dumps(row["load"]), flush=True)
        row["latency"] = asyncio.run(agentstream_latency(port, args.turns))
        print("agentstream latency", json.dumps(row["latency"]), flush=True)
        row["growth"] = asyncio.run(agentstream_growth(port, redis_pid, client, folder, checkpoints, args.window))
        print("agentstream growth", json.dumps(row["growth"]), flush=True)
        row["load_avg"] = os.getloadavg()[0]
        for peer in ("langgraph", "pydantic-ai-dbos"):
            row = out["peers"].setdefault(peer, {})
            row["load"] = run_peer(peer, dsn, postmaster, "load", ["--warm", str(args.warm), "--dur", str(args.dur)])
            print(peer, "load", json.dumps(row["load"]), flush=True)
            row["latency"] = run_peer(peer, dsn, postmaster, "latency", ["--turns", str(args.turns)])
            print(peer, "latency", json.dumps(row["latency"]), flush=True)
            row["growth"] = run_peer(
                peer,
                dsn,
                postmaster,
                "growth",
                ["--checkpoints", ",".join(map(str, checkpoints)), "--window", str(args.window)],
            )
            print(peer, "growth", json.dumps(row["growth"]), flush=True)
            row["load_avg"] = os.getloadavg()[0]
    out["load_after"] = os.getloadavg()
    return out


def table(out: dict, long: int) -> str:
    def g(row, key):
        return row["growth"][str(long)][key] / row["growth"]["50"][key]

    def rel(row, key, ref):
        a = row["growth"][str(long)][key] / row["growth"][str(long)][ref]
        b = row["growth"]["50"][key] / row["growth"]["50"][ref]
        return a / b

    lines = [
        f"| runtime | turns/s (64 conv.) | turn p50 / p99, 1 conv. | CPU ms per turn (runtime + database) "
        f"| database bytes per turn | turn {long} ÷ turn 50: latency, CPU (drift-corrected) "
        f"| bytes written at turn {long} ÷ 50 | load after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in out["peers"].items():
        cpu = row["load"]["cpu_ms_per_turn"]
        cpu_text = " + ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        stored = ", ".join(f"{k} {v:,.0f}" for k, v in row["load"]["bytes_per_turn"].items())
        wal = row["growth"][str(long)]["wal_bytes"] / max(row["growth"]["50"]["wal_bytes"], 1)
        lines.append(
            f"| {name} | {row['load']['turns_per_s']:.1f} | {row['latency']['turn_p50_ms']:.1f} / "
            f"{row['latency']['turn_p99_ms']:.1f} ms | {cpu_text} | {stored} | "
            f"{rel(row, 'turn_ms', 'reference_turn_ms'):.2f}×, {rel(row, 'cpu_ms', 'reference_cpu_ms'):.2f}× "
            f"(raw {g(row, 'turn_ms'):.2f}×, {g(row, 'cpu_ms'):.2f}×) | {wal:.1f}× | {row['load_avg']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--long", type=int, default=1000, help="turns of the long conversation (default 1,000)")
    args = parser.parse_args()
    args.warm, args.dur, args.turns, args.window = (2.0, 8.0, 30, 5) if args.quick else (3.0, 20.0, 100, 10)
    if args.quick:
        args.long = min(args.long, 200)
    if not PEERS_PYTHON.exists():
        sys.exit(f"{PEERS_PYTHON} is missing: run bench/peers/setup first (or set PEERS_PYTHON)")
    out = sitting(args)
    text = table(out, args.long)
    print(text)
    print(json.dumps(out))
    if args.write:
        note = (
            f"\n\n### The sitting of {out['when']}\n\n`python bench/peers/run.py` (see its docstring); "
            f"{out['cpus']} CPUs, Redis {out['redis']} with appendfsync always, Postgres {out['postgres']} defaults; "
            f"load average {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after.\n\n{text}\n"
        )
        body = RESULTS.read_text()
        if SECTION not in body:
            body = (
                body.rstrip()
                + f"\n\n{SECTION}\n\nThe same work on agentstream and on the runtimes people would pick instead (`bench/peers/`)."
            )
        RESULTS.write_text(body.rstrip() + note)


if __name__ == "__main__":
    main()
