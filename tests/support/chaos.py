"""The chaos run: real Redis, several agent-loop and tool-worker processes, a scripted model over
HTTP, many turns with parallel tool calls, and kill -9 of random service processes at random
moments (never the last live one of a service; each restarted after a random pause, under its
old consumer name or a new one).

Used by the bounded test (tests/chaos/) and the longer benchmark (bench/chaos.py). It checks,
from the traces and the work streams, that:

- every turn ended: an answer, or a failure with a code and a reason (none lost);
- every tool call has exactly one result (no duplicate, no dangling call), and no result answers
  a call that does not exist;
- no side effect ran twice: the ``record`` tool (side effects, not retry-safe) counts its
  effects per call in Redis, and must have run at most once per call;
- nothing is left pending in any consumer group at the end (C15).

And it measures, for every kill, the time from the kill to the next event in each trace the
killed process was holding work for (its pending entries at the moment of the kill).
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_sync

from agentstream import codec
from agentstream.events import ModelOutput, ToolOutput, TurnEnded, TurnFailed, TurnInput
from agentstream.keys import AGENT_LOOP_GROUP, JOB_FIELD, REPLY_FIELD, TOOL_WORKER_GROUP, TURN_FIELD, WAKE_FIELD, Keys
from tests.support import apps
from tests.support.procs import Services, publish_turn
from tests.support.scripted_model import ScriptedModelServer, parallel_rule


@dataclass
class ChaosConfig:
    """The size and pace of a chaos run (durations in seconds)."""

    conversations: int = 60
    turns_per_conversation: int = 4
    agent_loops: int = 2
    tool_workers: int = 2
    kill_every_s: tuple[float, float] = (0.5, 2.5)
    restart_after_s: tuple[float, float] = (0.1, 1.5)
    publish_over_s: float = 10.0
    deadline_s: float = 300.0
    seed: int = 4
    env: dict[str, str] = field(
        default_factory=lambda: {
            "AGENTSTREAM_MIN_IDLE_MS": "1500",
            "AGENTSTREAM_LEASE_TTL_MS": "1000",
            "AGENTSTREAM_BLOCK_MS": "200",
            "AGENTSTREAM_MAX_DELIVERIES": "10",
            "AGENTSTREAM_TRIM_INTERVAL_MS": "2000",
            "AGENTSTREAM_SHUTDOWN_GRACE_S": "10",
            "AGENTSTREAM_MODEL_RETRIES": "3",
            # side-effect tools take a while, so kills land mid-run (outcome unknown, not re-run)
            "AGENTSTREAM_TEST_RECORD_S": "0.3",
            "AGENTSTREAM_TEST_UPSERT_S": "0.2",
        }
    )


@dataclass
class Kill:
    at_ms: float
    name: str
    service: str
    stranded: set[str]  # traces whose work the process held (its pending entries)


@dataclass
class ChaosResult:
    turns: int = 0
    answered: int = 0
    failed: Counter = field(default_factory=Counter)
    failed_without_reason: int = 0
    lost: list[str] = field(default_factory=list)
    kills: int = 0
    kills_holding_work: int = 0
    calls: int = 0
    duplicate_results: int = 0
    dangling_calls: int = 0
    stray_results: int = 0
    duplicate_effects: int = 0
    reruns: int = 0
    outcomes_unknown: int = 0
    late_results: int = 0
    duplicate_replies: int = 0
    missing_replies: int = 0
    left_pending: int = 0
    recovery_s: list[float] = field(default_factory=list)
    slowest: list[tuple[float, str, str, str]] = field(default_factory=list)  # (s, killed, service, trace)
    seconds: float = 0.0

    @property
    def duplicates(self) -> int:
        """Effects recorded more than once: duplicate results, and side effects run twice."""
        return self.duplicate_results + self.duplicate_effects

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicates or self.dangling_calls or self.stray_results or self.failed_without_reason
            or self.missing_replies or self.left_pending
        )

    def figures(self) -> dict[str, object]:
        rec = sorted(self.recovery_s)
        return {
            "turns": self.turns,
            "answered": self.answered,
            "failed (with a reason)": dict(self.failed),
            "kills": self.kills,
            "kills holding work": self.kills_holding_work,
            "tool calls": self.calls,
            "duplicates": self.duplicates,
            "lost": len(self.lost),
            "dangling calls": self.dangling_calls,
            "left pending": self.left_pending,
            "outcome-unknown results": self.outcomes_unknown,
            "late results": self.late_results,
            "re-runs of retry-safe calls": self.reruns,
            "duplicate replies (at-least-once)": self.duplicate_replies,
            "kill → next progress p50 (s)": round(statistics.median(rec), 2) if rec else None,
            "kill → next progress p90 (s)": round(rec[int(0.9 * (len(rec) - 1))], 2) if rec else None,
            "kill → next progress max (s)": round(rec[-1], 2) if rec else None,
            "recoveries measured": len(rec),
            "wall time (s)": round(self.seconds, 1),
        }

    def report(self) -> str:
        return "\n".join(f"  {k}: {v}" for k, v in self.figures().items())


def _plan(rng: random.Random, turn_id: str) -> str:
    parts = [f"work({rng.randint(5, 600)})" for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        parts.append(f"record({turn_id})")
    if rng.random() < 0.3:
        parts.append(f"upsert({turn_id})")
    rng.shuffle(parts)
    return f"{turn_id} do: " + " ".join(parts)


class ChaosRun:
    """One chaos run against ``redis_url`` under ``namespace`` (see the module docstring)."""

    def __init__(self, redis_url: str, namespace: str, log_dir: Path, config: ChaosConfig | None = None, echo=print):
        self.redis_url = redis_url
        self.keys = Keys(namespace)
        self.namespace = namespace
        self.log_dir = log_dir
        self.config = config or ChaosConfig()
        self.echo = echo
        self.rng = random.Random(self.config.seed)
        self.client = redis_sync.Redis.from_url(redis_url)
        self.kills: list[Kill] = []
        self.turns: list[tuple[str, str]] = []

    def run(self) -> ChaosResult:
        cfg = self.config
        started = time.monotonic()
        with ScriptedModelServer(parallel_rule) as model:
            services = Services(
                redis_url=self.redis_url, namespace=self.namespace, model_url=model.base_url,
                log_dir=self.log_dir, extra_env=dict(cfg.env),
            )
            roles: dict[str, str] = {}
            generation: Counter = Counter()
            try:
                for i in range(cfg.agent_loops):
                    roles[f"loop-{i}"] = "agent-loop"
                for i in range(cfg.tool_workers):
                    roles[f"tools-{i}"] = "tool-worker"
                names = {slot: slot for slot in roles}  # slot → current consumer name
                for slot, service in roles.items():
                    services.start(names[slot], service)
                pending_turns = self._schedule_turns()
                published = 0
                next_kill = time.monotonic() + self.rng.uniform(*cfg.kill_every_s)
                next_check = 0.0
                down: dict[str, float] = {}  # slot → restart time
                total = len(pending_turns)
                while time.monotonic() - started < cfg.deadline_s:
                    now = time.monotonic()
                    while published < total and pending_turns[published][0] <= now - started:
                        _, trace_id, turn_id, text = pending_turns[published]
                        publish_turn(self.client, self.keys, trace_id=trace_id, turn_id=turn_id, agent="plan", text=text)
                        self.turns.append((trace_id, turn_id))
                        published += 1
                    for slot, at in list(down.items()):
                        if now >= at:
                            generation[slot] += 1
                            # half the time under a new consumer name (its entries are reclaimed),
                            # half under the old one (it drains its own pending entries first)
                            if self.rng.random() < 0.5:
                                names[slot] = f"{slot}-g{generation[slot]}"
                            services.start(names[slot], roles[slot])
                            del down[slot]
                    if published == total and now >= next_check:
                        next_check = now + 1.0
                        if self._ended() >= total:  # every turn has its ending in its trace
                            break
                    # kill any process but the last live one of its service (the service stays up;
                    # recovery then measures the runtime, not how fast a process restarts)
                    killable = [s for s in roles if s not in down
                                and sum(1 for o in roles if roles[o] == roles[s] and o not in down) > 1]
                    if now >= next_kill and killable:
                        slot = self.rng.choice(killable)
                        self._kill(services, names[slot], roles[slot])
                        down[slot] = now + self.rng.uniform(*cfg.restart_after_s)
                        next_kill = now + self.rng.uniform(*cfg.kill_every_s)
                    time.sleep(0.02)
                for slot, _ in list(down.items()):  # everyone back for the end
                    services.start(names[slot], roles[slot])
                self._wait(lambda: self._replied() >= len(self.turns), 60.0)
                self._wait(lambda: self._pending() == 0, 30.0)  # reclaim what the last kills left
            finally:
                services.stop_all()
        result = self._verify()
        result.seconds = time.monotonic() - started
        return result

    # --- driving --------------------------------------------------------------------------

    def _schedule_turns(self) -> list[tuple[float, str, str, str]]:
        """(publish at s, trace, turn, text) for every turn, spread over ``publish_over_s``."""
        cfg = self.config
        out = []
        for c in range(cfg.conversations):
            at = self.rng.uniform(0, cfg.publish_over_s)
            for t in range(cfg.turns_per_conversation):
                turn_id = f"c{c}t{t}"
                out.append((at + t * 0.01, f"chaos-{c}", turn_id, _plan(self.rng, turn_id)))
        return sorted(out)

    def _kill(self, services: Services, name: str, service: str) -> None:
        stranded = self._held_by(name, service)
        services.stop(name, kill=True)
        self.kills.append(Kill(at_ms=time.time() * 1000.0, name=name, service=service, stranded=stranded))

    def _held_by(self, consumer: str, service: str) -> set[str]:
        """The traces of the entries pending on ``consumer`` (what a kill strands)."""
        k = self.keys
        if service == "agent-loop":
            streams = [(k.turns, AGENT_LOOP_GROUP, TURN_FIELD), (k.wake, AGENT_LOOP_GROUP, WAKE_FIELD)]
        else:
            streams = [(k.tools("default"), TOOL_WORKER_GROUP, JOB_FIELD)]
        traces = set()
        for stream, group, fld in streams:
            try:
                pending = self.client.xpending_range(stream, group, min="-", max="+", count=1000, consumername=consumer)
            except redis_sync.ResponseError:
                continue
            for p in pending:
                entry = self.client.xrange(stream, min=p["message_id"], max=p["message_id"])
                if entry and entry[0][1].get(fld):
                    raw = entry[0][1][fld]
                    decoded = codec.decode_turn(raw) if fld == TURN_FIELD else (
                        codec.decode_wake(raw) if fld == WAKE_FIELD else codec.decode_job(raw))
                    traces.add(decoded.trace_id)
        return traces

    def _ended(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        for trace_id, turn_id in self.turns:
            pipe.hexists(self.keys.trace_keys(trace_id), f"end:{turn_id}")
        return sum(bool(x) for x in pipe.execute())

    def _replied(self) -> int:
        return len({codec.decode_reply(f[REPLY_FIELD]).turn_id for _, f in self.client.xrange(self.keys.replies)})

    def _pending(self) -> int:
        total = 0
        k = self.keys
        for stream, group in ((k.turns, AGENT_LOOP_GROUP), (k.wake, AGENT_LOOP_GROUP), (k.cancel, AGENT_LOOP_GROUP),
                              (k.tools("default"), TOOL_WORKER_GROUP)):
            try:
                total += self.client.xpending(stream, group)["pending"]
            except redis_sync.ResponseError:
                pass
        return total

    @staticmethod
    def _wait(predicate, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not predicate():
            time.sleep(0.1)

    # --- checking -------------------------------------------------------------------------

    def _verify(self) -> ChaosResult:
        r = ChaosResult(turns=len(self.turns), kills=len(self.kills))
        by_trace: dict[str, list[str]] = {}
        for trace_id, turn_id in self.turns:
            by_trace.setdefault(trace_id, []).append(turn_id)
        event_ms: dict[str, list[float]] = {}
        for trace_id, turn_ids in by_trace.items():
            entries = codec.decode_entries(self.client.xrange(self.keys.trace(trace_id)), trace_id=trace_id)
            event_ms[trace_id] = [float(entry_id.split("-")[0]) for entry_id, _ in entries]
            events = [e for _, e in entries]
            endings = {e.turn_id: e for e in events if isinstance(e, (TurnEnded, TurnFailed))}
            inputs = {e.turn_id for e in events if isinstance(e, TurnInput)}
            for turn_id in turn_ids:
                ending = endings.get(turn_id)
                if ending is None or turn_id not in inputs:
                    r.lost.append(f"{trace_id}/{turn_id}")
                elif isinstance(ending, TurnEnded):
                    r.answered += 1
                else:
                    r.failed[ending.code] += 1
                    if not ending.code or not ending.reason:
                        r.failed_without_reason += 1
            calls = {c.id: (e.turn_id, c.name) for e in events if isinstance(e, ModelOutput) for c in e.tool_calls}
            r.calls += len(calls)
            results = Counter(e.call_id for e in events if isinstance(e, ToolOutput) and not e.late)
            r.late_results += sum(1 for e in events if isinstance(e, ToolOutput) and e.late)
            r.outcomes_unknown += sum(1 for e in events if isinstance(e, ToolOutput) and e.error == "outcome_unknown")
            r.duplicate_results += sum(n - 1 for n in results.values() if n > 1)
            r.stray_results += sum(1 for call_id in results if call_id not in calls)
            r.dangling_calls += sum(1 for call_id, (turn_id, _) in calls.items() if turn_id in endings and call_id not in results)
        effects = {k.decode(): int(v) for k, v in self.client.hgetall(apps.effects_key(self.namespace)).items()}
        for key, n in effects.items():
            if key.endswith("/record"):
                r.duplicate_effects += max(0, n - 1)
            elif key.endswith("/upsert") or key.endswith("/work"):
                r.reruns += max(0, n - 1)
        replies = Counter(codec.decode_reply(f[REPLY_FIELD]).turn_id for _, f in self.client.xrange(self.keys.replies))
        r.duplicate_replies = sum(n - 1 for n in replies.values() if n > 1)
        r.missing_replies = sum(1 for _, turn_id in self.turns if turn_id not in replies)
        r.left_pending = self._pending()
        for kill in self.kills:
            if kill.stranded:
                r.kills_holding_work += 1
            for trace_id in kill.stranded:
                later = [ms for ms in event_ms.get(trace_id, []) if ms > kill.at_ms]
                if later:
                    seconds = (min(later) - kill.at_ms) / 1000.0
                    r.recovery_s.append(seconds)
                    r.slowest.append((round(seconds, 2), kill.name, kill.service, trace_id))
        r.slowest = sorted(r.slowest, reverse=True)[:5]
        return r
