"""One peer runtime doing the benchmark's work, in the peers' own virtualenv (``bench/peers/setup``).

    python bench/peers/peer.py langgraph --dsn postgresql://... --postmaster-pid N --mode load
    python bench/peers/peer.py pydantic-ai-dbos --dsn ... --postmaster-pid N --mode growth

Peers, each as its documentation sets it up for production, on the Postgres of ``run.py``:

- ``langgraph``: a ``StateGraph`` over ``MessagesState`` (model node → ``ToolNode`` → model node),
  compiled with ``AsyncPostgresSaver`` (psycopg pool), invoked per turn with the conversation's
  ``thread_id`` and ``durability="sync"`` (each step's checkpoint is committed before the next
  step starts: the setting that loses nothing after a crash).
- ``pydantic-ai-dbos``: a pydantic-ai ``Agent`` wrapped in ``DBOSAgent`` (every model request a
  durable DBOS step, the run a DBOS workflow, Postgres as DBOS's system database); the
  conversation's history goes in as ``message_history``, as pydantic-ai's docs show, and so is
  stored with each turn's workflow inputs.

The model is a zero-latency double in the peer's own process (a tool call on a turn's first model
call, an answer on its second: the sizes of ``work.py``); the tool does nothing. Prints one JSON
line: the mode's figures, CPU seconds of this process and of Postgres (postmaster and backends),
and Postgres's bytes (database size and WAL written) before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from work import ANSWER, ARGUMENTS, RESULT, THINKING, CpuMeter, pct


class LangGraphPeer:
    async def start(self, dsn: str) -> None:
        from langchain_core.messages import AIMessage, HumanMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        @tool
        def noop(path: str, pattern: str, max_results: int = 50) -> str:
            """Does nothing; answers with a fixed 1 KB text."""
            return RESULT

        def model(state):  # no annotations: langgraph reads them at runtime (and the imports are local)
            last = state["messages"][-1]
            if isinstance(last, HumanMessage):
                call = {"name": "noop", "args": json.loads(ARGUMENTS), "id": f"c-{uuid.uuid4().hex[:12]}"}
                return {"messages": [AIMessage(content=THINKING, tool_calls=[call])]}
            return {"messages": [AIMessage(content=ANSWER)]}

        def route(state):
            return "tools" if state["messages"][-1].tool_calls else END

        graph = StateGraph(MessagesState)
        graph.add_node("model", model)
        graph.add_node("tools", ToolNode([noop]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", route, ["tools", END])
        graph.add_edge("tools", "model")
        self.pool = AsyncConnectionPool(
            dsn,
            min_size=4,
            max_size=16,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await self.pool.open()
        saver = AsyncPostgresSaver(self.pool)
        await saver.setup()
        self.graph = graph.compile(checkpointer=saver)
        self.HumanMessage = HumanMessage

    async def turn(self, conversation: str, text: str) -> None:
        out = await self.graph.ainvoke(
            {"messages": [self.HumanMessage(content=text)]},
            {"configurable": {"thread_id": conversation}},
            durability="sync",
        )
        assert out["messages"][-1].content == ANSWER, out["messages"][-1]

    async def close(self) -> None:
        await self.pool.close()


class PydanticAiDbosPeer:
    async def start(self, dsn: str) -> None:
        from dbos import DBOS
        from pydantic_ai import Agent
        from pydantic_ai.durable_exec.dbos import DBOSAgent
        from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
        from pydantic_ai.models.function import FunctionModel

        def model(messages, info):
            last = messages[-1]
            if isinstance(last, ModelRequest) and any(isinstance(p, UserPromptPart) for p in last.parts):
                return ModelResponse(
                    parts=[
                        TextPart(THINKING),
                        ToolCallPart("noop", ARGUMENTS, tool_call_id=f"c-{uuid.uuid4().hex[:12]}"),
                    ]
                )
            return ModelResponse(parts=[TextPart(ANSWER)])

        agent = Agent(FunctionModel(model, model_name="zero"), name="bench")

        @agent.tool_plain
        def noop(path: str, pattern: str, max_results: int = 50) -> str:
            """Does nothing; answers with a fixed 1 KB text."""
            return RESULT

        self.agent = DBOSAgent(agent)
        DBOS(config={"name": "peers-bench", "system_database_url": dsn, "run_admin_server": False})
        DBOS.launch()
        self.DBOS = DBOS
        self.histories: dict[str, list] = {}

    async def turn(self, conversation: str, text: str) -> None:
        result = await self.agent.run(text, message_history=self.histories.get(conversation))
        assert result.output == ANSWER, result.output
        self.histories[conversation] = result.all_messages()

    async def close(self) -> None:
        self.DBOS.destroy()


PEERS = {"langgraph": LangGraphPeer, "pydantic-ai-dbos": PydanticAiDbosPeer}


def pg_bytes(dsn: str) -> dict:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        size, lsn = conn.execute("select pg_database_size(current_database()), pg_current_wal_lsn()").fetchone()
        wal = conn.execute("select pg_wal_lsn_diff(%s, '0/0')", (lsn,)).fetchone()[0]
    return {"database": int(size), "wal": int(wal)}


async def _load(peer, conversations: int, warm_s: float, dur_s: float, meter_pids: dict, dsn: str) -> dict:
    latencies: list[float] = []
    counted = [0]
    stop_at = [float("inf")]
    measuring = [False]
    prefix = uuid.uuid4().hex[:6]

    async def conversation(i: int) -> None:
        n = 0
        while time.perf_counter() < stop_at[0]:
            n += 1
            t0 = time.perf_counter()
            await peer.turn(f"{prefix}-c{i}", f"turn {n}")
            t1 = time.perf_counter()
            if measuring[0] and t1 <= stop_at[0]:
                latencies.append(t1 - t0)
                counted[0] += 1

    tasks = [asyncio.create_task(conversation(i)) for i in range(conversations)]
    await asyncio.sleep(warm_s)
    bytes0 = await asyncio.to_thread(pg_bytes, dsn)
    meter = CpuMeter(meter_pids, frozenset({"postgres"}))
    measuring[0] = True
    stop_at[0] = time.perf_counter() + dur_s
    await asyncio.gather(*tasks)
    cpu = meter.used_s()
    bytes1 = await asyncio.to_thread(pg_bytes, dsn)
    turns = max(counted[0], 1)
    return {
        "turns": counted[0],
        "turns_per_s": counted[0] / dur_s,
        "turn_p50_ms": pct(latencies, 50) * 1000,
        "turn_p99_ms": pct(latencies, 99) * 1000,
        "cpu_ms_per_turn": {k: v / turns * 1000 for k, v in cpu.items()},
        "bytes_per_turn": {k: (bytes1[k] - bytes0[k]) / turns for k in bytes0},
    }


async def _latency(peer, turns: int) -> dict:
    conversation = f"lat-{uuid.uuid4().hex[:6]}"
    latencies = []
    for n in range(turns + 5):
        t0 = time.perf_counter()
        await peer.turn(conversation, f"turn {n}")
        if n >= 5:
            latencies.append(time.perf_counter() - t0)
    return {"turns": turns, "turn_p50_ms": pct(latencies, 50) * 1000, "turn_p99_ms": pct(latencies, 99) * 1000}


async def _growth(peer, checkpoints: list[int], window: int, meter_pids: dict, dsn: str) -> dict:
    """One long conversation; at each checkpoint, ``window`` turns timed, each followed by a turn of
    a short reference conversation (a new one every 50 turns) so the ratio takes the drift out."""
    long_id = f"long-{uuid.uuid4().hex[:6]}"
    n = 0
    ref_n = 0
    ref_id = ""
    out = {}
    for checkpoint in checkpoints:
        while n < checkpoint - window:
            n += 1
            await peer.turn(long_id, f"turn {n}")
        long_s, ref_s, long_cpu, ref_cpu, long_bytes = [], [], [], [], []
        for _ in range(window):
            n += 1
            b0 = await asyncio.to_thread(pg_bytes, dsn)
            meter = CpuMeter(meter_pids, frozenset({"postgres"}))
            t0 = time.perf_counter()
            await peer.turn(long_id, f"turn {n}")
            long_s.append(time.perf_counter() - t0)
            long_cpu.append(sum(meter.used_s().values()))
            b1 = await asyncio.to_thread(pg_bytes, dsn)
            long_bytes.append(b1["wal"] - b0["wal"])
            if ref_n % 50 == 0:
                ref_id = f"ref-{uuid.uuid4().hex[:6]}"
            ref_n += 1
            meter = CpuMeter(meter_pids, frozenset({"postgres"}))
            t0 = time.perf_counter()
            await peer.turn(ref_id, f"ref {ref_n}")
            ref_s.append(time.perf_counter() - t0)
            ref_cpu.append(sum(meter.used_s().values()))
        out[str(checkpoint)] = {
            "turn_ms": pct(long_s, 50) * 1000,
            "reference_turn_ms": pct(ref_s, 50) * 1000,
            "cpu_ms": pct(long_cpu, 50) * 1000,
            "reference_cpu_ms": pct(ref_cpu, 50) * 1000,
            "wal_bytes": pct(long_bytes, 50),
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--postmaster-pid", type=int, required=True)
    parser.add_argument("--mode", choices=("load", "latency", "growth"), required=True)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--dur", type=float, default=20.0)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--checkpoints", default="50,1000")
    parser.add_argument("--window", type=int, default=10)
    args = parser.parse_args()
    peer = PEERS[args.peer]()
    await peer.start(args.dsn)
    pids = {"peer": os.getpid(), "postgres": args.postmaster_pid}
    try:
        await peer.turn(f"warm-{uuid.uuid4().hex[:6]}", "warm up")
        if args.mode == "load":
            got = await _load(peer, args.conversations, args.warm, args.dur, pids, args.dsn)
        elif args.mode == "latency":
            got = await _latency(peer, args.turns)
        else:
            checkpoints = [int(c) for c in args.checkpoints.split(",")]
            got = await _growth(peer, checkpoints, args.window, pids, args.dsn)
    finally:
        await peer.close()
    print(json.dumps({"peer": args.peer, "mode": args.mode, **got}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
