"""What one model call costs the agent loop's process in the HTTP adapter: CPU per call, old and new code.

    python bench/model_call.py                              # this checkout's code only
    python bench/model_call.py --old 824dca9 --reps 3       # beside the code of an older commit

A model double answers over loopback HTTP from another process (``serve``: a minimal HTTP/1.1
server on asyncio, keep-alive, one whole OpenAI chat-completions answer, never streamed): its CPU
is not counted. Each run is a child process that sends ``--calls`` model calls through the real
adapter (:class:`agentstream.models.openai.OpenAIChatModel`'s ``complete``, with the agent loop's
delta sink, :class:`agentstream.runtime.deltas.RedisDeltaSink`, on a private ``redis-server``),
``--concurrency`` at a time, after as many calls to warm up, and prints the process's CPU time per
call (``time.process_time``: user + system of every thread, so a name lookup in a worker thread
counts), wall time per call, and the commands (XADD, EXPIRE) a call sent to the delta stream. Variants:

- ``old/plain``: the code of ``--old`` (a commit; its ``shared/`` unpacked into a temporary
  folder ahead on ``PYTHONPATH``) with ``httpx.AsyncClient()``, as its services made it;
- ``new/plain``: this checkout's code with ``httpx.AsyncClient()`` (httpx's defaults: 20
  connections kept, so at 64 calls at once 44 are closed and opened again each round);
- ``new/model``: this checkout's code with :func:`agentstream.models.client.model_client`, what
  the services make now (``new/uncoalesced``: the same without one write per request).

Runs alternate within one sitting; each figure is the median of ``--reps`` runs; ``uptime``'s load
is printed before and after. Benchmarks print figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Results: " + "worked 1 ms " * 20},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160},
    }
).encode()


async def _serve(port: int) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(ANSWER)).encode()
        + b"\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                writer.write(head + ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _run(kind: str, base_url: str, redis_url: str, calls: int, concurrency: int) -> dict:
    """One run in this process → its figures (CPU and wall seconds per call, deltas per call)."""
    import httpx
    import redis.asyncio as aioredis

    from agentstream.context.request import ChatRequest, UserMessage
    from agentstream.models.endpoints import ModelEndpoint
    from agentstream.models.openai import OpenAIChatModel
    from agentstream.runtime.deltas import RedisDeltaSink
    from agentstream.wire.keys import Keys

    if kind == "plain":
        client = httpx.AsyncClient()
    else:
        from agentstream.models.client import model_client

        client = model_client(concurrency=concurrency, coalesce=kind == "model")
    redis = aioredis.from_url(redis_url)
    keys = Keys(f"bench{os.getpid()}")
    endpoint = ModelEndpoint(id="default", provider="openai", base_url=base_url, model="bench", stream=False)
    model = OpenAIChatModel(endpoint, client=client)
    request = ChatRequest(system="You are brief.", messages=(UserMessage(text="do: work(1) " * 30),))
    left = calls

    async def worker(number: int) -> None:
        nonlocal left
        sink = RedisDeltaSink(redis, keys, f"trace-{number}")
        while left > 0:
            left -= 1
            await model.complete(request, turn_id="t", step=0, deltas=sink)

    try:
        await asyncio.gather(*(worker(n) for n in range(concurrency)))  # warm: connections made
        await redis.delete(*(keys.deltas(f"trace-{n}") for n in range(concurrency)))
        left = calls
        before = _writes(await redis.info("commandstats"))
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(n) for n in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        deltas = _writes(await redis.info("commandstats")) - before  # XADD and EXPIRE the sink sent
        await redis.delete(*(keys.deltas(f"trace-{n}") for n in range(concurrency)))
    finally:
        await client.aclose()
        await redis.aclose()
    return {"cpu": cpu / calls, "wall": wall / calls, "deltas": deltas / calls}


def _writes(stats: dict) -> int:
    """XADD and EXPIRE calls Redis ran so far (INFO commandstats)."""
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("xadd", "expire"))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _old_code(commit: str, into: Path) -> Path:
    """``shared/`` of ``commit`` unpacked into ``into`` → the folder to put on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "shared"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "serve", "one"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--kind", default="model")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--old", default="", help="a commit whose code runs beside this checkout's (old/plain)")
    parser.add_argument("--kinds", nargs="+", default=["plain", "model"], choices=["plain", "model", "uncoalesced"])
    args = parser.parse_args()
    if args.command == "serve":
        asyncio.run(_serve(args.port))
        return
    if args.command == "one":
        url = f"http://localhost:{args.port}/v1"
        print(json.dumps(asyncio.run(_run(args.kind, url, args.redis_url, args.calls, args.concurrency[0]))))
        return
    import httpx
    import redis

    port, redis_port = _free_port(), _free_port()
    with tempfile.TemporaryDirectory(prefix="agentstream-bench-") as tmp:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", "--port", str(port)], stdout=subprocess.PIPE, text=True
        )
        store = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        variants = [("new", kind) for kind in args.kinds]
        env = {"new": dict(os.environ)}
        if args.old:
            env["old"] = {**os.environ, "PYTHONPATH": str(_old_code(args.old, Path(tmp)))}
            variants.insert(0, ("old", "plain"))
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            for _ in range(50):
                try:
                    redis.Redis(port=redis_port).ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            print(f"load before: {_uptime()}")
            print(
                f"python {sys.version.split()[0]}, httpx {httpx.__version__}, redis-py {redis.__version__}, "
                f"{args.calls} calls a run; old code: {args.old or '-'}"
            )
            figures: dict[tuple[str, str, int], list[dict]] = {}
            for _ in range(args.reps):
                for concurrency in args.concurrency:
                    for code, kind in variants:
                        command = [sys.executable, __file__, "one", "--kind", kind, "--port", str(port)]
                        command += ["--redis-url", f"redis://127.0.0.1:{redis_port}/0", "--calls", str(args.calls)]
                        command += ["--concurrency", str(concurrency)]
                        out = subprocess.run(command, env=env[code], capture_output=True, text=True, check=True)
                        figures.setdefault((code, kind, concurrency), []).append(json.loads(out.stdout))
            print(f"load after: {_uptime()}")
            for concurrency in args.concurrency:
                for code, kind in variants:
                    runs = figures[(code, kind, concurrency)]
                    cpu = statistics.median(r["cpu"] for r in runs) * 1e6
                    wall = statistics.median(r["wall"] for r in runs) * 1e6
                    spread = ", ".join(f"{r['cpu'] * 1e6:.0f}" for r in runs)
                    print(
                        f"{code}/{kind:<11} {concurrency:>3} at once: CPU {cpu:6.0f} µs/call (runs: {spread}), "
                        f"wall {wall:6.0f} µs/call, delta-stream writes {runs[-1]['deltas']:.1f}/call"
                    )
        finally:
            server.terminate()
            store.terminate()
            server.wait()
            store.wait()


if __name__ == "__main__":
    main()
