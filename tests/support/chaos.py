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
- nothing is left pending in any consumer group at the end (C15);
- no entry was handled twice by live workers: every run of a tool is logged (start, end, pid),
  and a call that started again while the process of its earlier run was never killed counts
  (tools run below, around and several times over the claim idle time, at the services' own
  concurrency and batch size);
- no false *outcome unknown*: a side-effect call answered "outcome unknown" although no process
  that started it was killed;
- no service was stopped by an input: hostile entries (deep nesting, wrong types, huge payloads,
  bytes that are not JSON), duplicate copies of live entries and malformed copies of them (same
  trace, turn and call ids, a bad body) are mixed into every stream a backend can write (turns,
  cancel, wake-ups, tool jobs) while the run goes on; a service process that exits by itself is
  counted (and restarted).

And it measures, for every kill, each piece of work the killed process held (its pending
entries at the moment of the kill): the time from the kill to its next progress (a tool call's
result; for a turn or a wake-up, the trace's next event), in parts: until the entry was
delivered again (claimed by another consumer after the idle time, or read again by the process
restarted under its name; watched every 0.1 s), then until its tool started (the wait for a
handler, or the whole handling when no tool ran), and the tool's own run (every run of a test
tool logs its start and end). Work is quick or slow by what the entry held: a tool call planned
at :data:`SLOW_WORK_MS` or more is slow, a step is quick.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_sync

from agentstream.wire import codec
from agentstream.wire.events import ModelOutput, ToolOutput, ToolStarted, TurnEnded, TurnFailed, TurnInput
from agentstream.wire.keys import (
    AGENT_LOOP_GROUP,
    CANCEL_FIELD,
    JOB_FIELD,
    REPLY_FIELD,
    TOOL_WORKER_GROUP,
    TURN_FIELD,
    WAKE_FIELD,
    Keys,
)
from tests.support import apps
from tests.support.procs import Services, publish_turn
from tests.support.redis_server import sync_client
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
    slow_tools: bool = True  # tools around and over the claim idle time (and several times it)
    hostile_every_s: tuple[float, float] | None = (0.2, 0.6)  # an injected entry this often; None: none
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
class Held:
    """One entry a killed process held (pending on it) at the kill, and when it was delivered again."""

    stream: str
    group: str
    entry_id: str
    trace_id: str
    call_id: str = ""  # a tool job's call; "" for the agent loop's entries (turns, wake-ups)
    delivered: int = 0  # Redis's delivery count at the kill
    redelivered_ms: float | None = None  # first seen claimed by another consumer or read again (unix ms)


@dataclass
class Kill:
    at_ms: float
    name: str
    service: str
    held: list[Held]  # the entries pending on the process at the kill (hostile ones left out)
    pid: int = 0

    @property
    def stranded(self) -> set[str]:
        """The traces whose work the process held."""
        return {h.trace_id for h in self.held}


@dataclass
class Recovery:
    """From a kill to the next progress of one entry the killed process held (seconds): the
    wait until it was delivered again (claimed after the idle time, or drained by the process
    restarted under its name), then until its tool's first run started (the wait for a handler;
    the whole handling when no tool ran), the own run of the tool run that answered, and the
    rest (the result's write; a run killed again and its recovery); ``slow`` when the work was
    a tool call planned at :data:`SLOW_WORK_MS` or more."""

    total: float
    claim: float
    handler: float
    tool: float
    slow: bool

    @property
    def rest(self) -> float:
        return self.total - self.claim - self.handler - self.tool


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
    handled_twice: int = 0
    false_outcomes_unknown: int = 0
    services_stopped: int = 0
    stopped_logs: list[str] = field(default_factory=list)
    hostile_entries: int = 0
    duplicate_copies: int = 0
    malformed_copies: int = 0
    # per entry a killed process held: its work quick (a step, a tool call under SLOW_WORK_MS)
    # or slow (a call around or over the claim idle time, whose own run time is in its recovery)
    recoveries: list[Recovery] = field(default_factory=list)
    slowest: list[tuple[float, str, str, str]] = field(default_factory=list)  # (s, killed, service, trace)
    slowest_quick: list[tuple] = field(default_factory=list)  # (s, claim, handler, tool, rest, killed, trace, call)
    seconds: float = 0.0

    @property
    def duplicates(self) -> int:
        """Effects recorded more than once: duplicate results, and side effects run twice."""
        return self.duplicate_results + self.duplicate_effects

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicates
            or self.dangling_calls
            or self.stray_results
            or self.failed_without_reason
            or self.missing_replies
            or self.left_pending
            or self.handled_twice
            or self.false_outcomes_unknown
            or self.services_stopped
        )

    @property
    def recovery_s(self) -> list[float]:
        return [r.total for r in self.recoveries]

    def figures(self) -> dict[str, object]:
        rec = sorted(self.recovery_s)
        quick = [r for r in self.recoveries if not r.slow]
        slow = [r for r in self.recoveries if r.slow]
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
            "entries handled twice": self.handled_twice,
            "side-effect tools run twice": self.duplicate_effects,
            "false outcome-unknown results": self.false_outcomes_unknown,
            "services stopped by an input": self.services_stopped,
            "hostile entries injected": self.hostile_entries,
            "duplicate copies of live entries": self.duplicate_copies,
            "malformed copies of live entries": self.malformed_copies,
            "outcome-unknown results": self.outcomes_unknown,
            "late results": self.late_results,
            "re-runs of retry-safe calls": self.reruns,
            "duplicate replies (at-least-once)": self.duplicate_replies,
            "kill → next progress p50 (s)": round(statistics.median(rec), 2) if rec else None,
            "kill → next progress p90 (s)": round(rec[int(0.9 * (len(rec) - 1))], 2) if rec else None,
            "kill → next progress max (s)": round(rec[-1], 2) if rec else None,
            "recoveries measured": len(rec),
            **_spread("kill → next progress, quick work", [r.total for r in quick]),
            **_spread("kill → next progress, slow tools", [r.total for r in slow]),
            **_parts("quick work", quick),
            **_parts("slow tools", slow),
            "wall time (s)": round(self.seconds, 1),
        }

    def report(self) -> str:
        return "\n".join(f"  {k}: {v}" for k, v in self.figures().items())


def _spread(label: str, seconds: list[float]) -> dict[str, object]:
    """p50, p90 and max of ``seconds`` under ``label``, and how many there were."""
    s = sorted(seconds)
    return {
        f"{label} p50 (s)": round(statistics.median(s), 2) if s else None,
        f"{label} p90 (s)": round(s[int(0.9 * (len(s) - 1))], 2) if s else None,
        f"{label} max (s)": round(s[-1], 2) if s else None,
        f"{label}, measured": len(s),
    }


def _parts(label: str, recoveries: list[Recovery]) -> dict[str, object]:
    """p50 and p90 of each part of the recoveries under ``label``: claim, handler, tool, rest."""
    out: dict[str, object] = {}
    for part in ("claim", "handler", "tool", "rest"):
        s = sorted(getattr(r, part) for r in recoveries)
        out[f"{label}: {part} p50 / p90 (s)"] = (
            f"{statistics.median(s):.2f} / {s[int(0.9 * (len(s) - 1))]:.2f}" if s else None
        )
    return out


SLOW_WORK_MS = 1000
"""A tool call planned at least this long is slow work: around or over the run's claim idle
time (1.5 s), so its recovery includes the tool's own run time."""


def planned_ms(name: str, arguments: str, env: dict[str, str]) -> float:
    """A test tool call's planned run time in ms, from its arguments: ``work``'s ``ms``, a
    ``record``/``upsert`` call's pause (``key@seconds``, else ``AGENTSTREAM_TEST_<NAME>_S``)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return 0.0
    if not isinstance(args, dict):
        return 0.0
    if name == "work":
        return float(args.get("ms") or 0)
    key = str(args.get("key", ""))
    if "@" in key:
        return float(key.rsplit("@", 1)[1]) * 1000.0
    return float(env.get(f"AGENTSTREAM_TEST_{name.upper()}_S", "0") or 0) * 1000.0


def _work_ms(rng: random.Random, slow: bool) -> int:
    """Mostly quick; with ``slow``, a fifth around the claim idle time (1.5 s in the run's
    settings) and a tenth two to four times over it."""
    draw = rng.random()
    if slow and draw < 0.1:
        return rng.randint(3000, 6000)
    if slow and draw < 0.3:
        return rng.randint(1000, 2500)
    return rng.randint(5, 600)


def _plan(rng: random.Random, turn_id: str, slow: bool = False) -> str:
    parts = [f"work({_work_ms(rng, slow)})" for _ in range(rng.randint(1, 3))]
    pause = f"@{rng.uniform(1.0, 4.0):.1f}" if slow and rng.random() < 0.3 else ""  # record/upsert run time
    if rng.random() < 0.5:
        parts.append(f"record({turn_id}{pause})")
    if rng.random() < 0.3:
        parts.append(f"upsert({turn_id}{pause})")
    rng.shuffle(parts)
    return f"{turn_id} do: " + " ".join(parts)


NESTED = b"[" * 2048 + b"]" * 2048


def hostile_payload(rng: random.Random) -> bytes:
    """One entry body that no decoder accepts: deep nesting, wrong types, huge, not JSON, ..."""
    return rng.choice(
        [
            b'{"trace_id":"hostile","z":' + NESTED + b"}",
            b'{"trace_id":"hostile","turn_id":"h","metadata":{"a":' + NESTED + b"}}",
            NESTED,
            b'{"trace_id":5,"turn_id":["x"],"call_id":{},"name":null,"agent":true}',
            b'{"trace_id":"hostile","text":"' + b"x" * 256_000 + b'"}',  # 256 KB
            b"\xff\xfe\x00not json",
            b"",
            b"[]",
            b'{"trace_id":"hostile-' + str(rng.randint(0, 9)).encode() + b'","turn_id":"h","agent":"nope","text":"x"}',
            b'{"trace_id":"hostile","turn_id":"h","call_id":"hc","name":"record","arguments":"{}"}',
        ]
    )


class ChaosRun:
    """One chaos run against ``redis_url`` under ``namespace`` (see the module docstring)."""

    def __init__(self, redis_url: str, namespace: str, log_dir: Path, config: ChaosConfig | None = None, echo=print):
        self.redis_url = redis_url
        self.keys = Keys(namespace, int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1))  # as the services have it
        self.namespace = namespace
        self.log_dir = log_dir
        self.config = config or ChaosConfig()
        self.echo = echo
        self.rng = random.Random(self.config.seed)
        self.client = sync_client(redis_url)
        self.kills: list[Kill] = []
        self.turns: list[tuple[str, str]] = []
        self.stopped = 0
        self.stopped_logs: list[str] = []
        self.injected = Counter()

    def run(self) -> ChaosResult:  # noqa: C901 (an outlier from before the complexity limit; issue 32 splits it)
        cfg = self.config
        started = time.monotonic()
        with ScriptedModelServer(parallel_rule) as model:
            services = Services(
                redis_url=self.redis_url,
                namespace=self.namespace,
                model_url=model.base_url,
                log_dir=self.log_dir,
                extra_env=dict(cfg.env),
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
                next_hostile = time.monotonic()
                next_check = next_watch = 0.0
                down: dict[str, float] = {}  # slot → restart time
                total = len(pending_turns)
                while time.monotonic() - started < cfg.deadline_s:
                    now = time.monotonic()
                    while published < total and pending_turns[published][0] <= now - started:
                        _, trace_id, turn_id, text = pending_turns[published]
                        publish_turn(
                            self.client, self.keys, trace_id=trace_id, turn_id=turn_id, agent="plan", text=text
                        )
                        self.turns.append((trace_id, turn_id))
                        published += 1
                    if cfg.hostile_every_s and now >= next_hostile:
                        self._inject()
                        next_hostile = now + self.rng.uniform(*cfg.hostile_every_s)
                    for slot, service in roles.items():  # a process that exited by itself: an input stopped it?
                        proc = services.procs.get(names[slot])
                        if slot not in down and proc is not None and proc.poll() is not None:
                            self.stopped += 1
                            self.stopped_logs.append(
                                f"{names[slot]} exited {proc.returncode}: " + services.log(names[slot])[-2000:]
                            )
                            services.procs.pop(names[slot], None)
                            services.start(names[slot], service)
                    for slot, at in list(down.items()):
                        if now >= at:
                            generation[slot] += 1
                            # half the time under a new consumer name (its entries are reclaimed),
                            # half under the old one (it drains its own pending entries first)
                            if self.rng.random() < 0.5:
                                names[slot] = f"{slot}-g{generation[slot]}"
                            services.start(names[slot], roles[slot])
                            del down[slot]
                    if now >= next_watch:
                        self._watch_redeliveries()
                        next_watch = now + 0.1
                    if published == total and now >= next_check:
                        next_check = now + 1.0
                        if self._ended() >= total:  # every turn has its ending in its trace
                            break
                    # kill any process but the last live one of its service (the service stays up;
                    # recovery then measures the runtime, not how fast a process restarts)
                    # and only a process that is up (it has logged; on a loaded machine a start takes
                    # seconds, and killing a process that never started tests nothing)
                    killable = [
                        s
                        for s in roles
                        if s not in down
                        and self._up(services, names[s])
                        and sum(1 for o in roles if roles[o] == roles[s] and o not in down) > 1
                    ]
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
                out.append((at + t * 0.01, f"chaos-{c}", turn_id, _plan(self.rng, turn_id, cfg.slow_tools)))
        return sorted(out)

    def _kill(self, services: Services, name: str, service: str) -> None:
        held = self._held_by(name, service)
        pid = services.procs[name].pid
        services.stop(name, kill=True)
        self.kills.append(Kill(at_ms=time.time() * 1000.0, name=name, service=service, held=held, pid=pid))

    def _watch_redeliveries(self) -> None:
        """Note when each entry a killed process held is delivered again: claimed by another
        consumer, read again by the process restarted under its name, or gone (acknowledged)."""
        waiting = [h for kill in self.kills for h in kill.held if h.redelivered_ms is None]
        if not waiting:
            return
        streams = {(h.stream, h.group) for h in waiting}
        owners: dict[str, tuple[str, int]] = {}
        for stream, group in streams:
            try:
                rows = self.client.xpending_range(stream, group, min="-", max="+", count=100_000)
            except redis_sync.ResponseError:
                continue
            for row in rows:
                owners[_text(row["message_id"])] = (_text(row["consumer"]), int(row["times_delivered"]))
        now_ms = time.time() * 1000.0
        for kill in self.kills:
            for h in kill.held:
                if h.redelivered_ms is not None:
                    continue
                owner = owners.get(h.entry_id)
                if owner is None or owner[0] != kill.name or owner[1] > h.delivered:
                    h.redelivered_ms = now_ms

    def _up(self, services: Services, name: str) -> bool:
        log_file = self.log_dir / f"{name}.log"
        proc = services.procs.get(name)
        return proc is not None and log_file.exists() and log_file.stat().st_size > 0

    def _inject(self) -> None:
        """Put one hostile entry, or a duplicate or malformed copy of a live one, on a stream a
        backend can write."""
        k = self.keys
        streams = [
            (k.turns, TURN_FIELD),
            (k.cancel, CANCEL_FIELD),
            (k.wake, WAKE_FIELD),
            (k.tools("default"), JOB_FIELD),
        ]
        draw = self.rng.random()
        if draw < 0.4:
            stream, fld = self.rng.choice(streams)
            stream = self._some_partition(stream)
            if self.rng.random() < 0.15:
                fld = b"not-the-field"
            self.client.xadd(stream, {fld: hostile_payload(self.rng)})
            self.injected["hostile"] += 1
            return
        stream, fld = self.rng.choice([(k.turns, TURN_FIELD), (k.tools("default"), JOB_FIELD)])
        stream = self._some_partition(stream)
        recent = [
            (eid, f)
            for eid, f in self.client.xrevrange(stream, count=10)
            if f.get(fld, b"").startswith(b'{"') and len(f[fld]) < 10_000
        ]
        if not recent:
            return
        _, fields = self.rng.choice(recent)
        try:
            message = json.loads(fields[fld])
        except (ValueError, RecursionError):
            return
        if not isinstance(message, dict) or not isinstance(message.get("trace_id"), str):
            return
        if draw < 0.7:  # an exact copy of a live entry: runs once all the same
            self.client.xadd(stream, {fld: fields[fld]})
            self.injected["duplicate"] += 1
            return
        # a malformed copy: the same ids, a bad body
        if fld == TURN_FIELD:
            if not self.client.hexists(k.trace_keys(message["trace_id"]), f"turn:{message.get('turn_id')}"):
                return  # only of a turn in its trace (a copy handled first would take the turn id: a race, not a fault)
            bad = {**message, "text": 7}
        else:
            if "-forged" in str(message.get("name")):
                return
            bad = {**message, "name": f"{message.get('name')}-forged", "arguments": "{"}
        self.client.xadd(stream, {fld: json.dumps(bad).encode()})
        self.injected["malformed"] += 1

    def _some_partition(self, stream: str) -> str:
        """A random partition of a work stream (itself with one partition, or for the cancel stream)."""
        if self.keys.partitions == 1 or stream == self.keys.cancel:
            return stream
        return self.rng.choice(self.keys.partitions_of(stream))

    def _held_by(self, consumer: str, service: str) -> list[Held]:
        """The entries pending on ``consumer`` (what a kill strands), hostile ones left out."""
        k = self.keys
        if service == "agent-loop":
            streams = [
                (s, AGENT_LOOP_GROUP, fld)
                for base, fld in ((k.turns, TURN_FIELD), (k.wake, WAKE_FIELD))
                for s in k.partitions_of(base)
            ]
        else:
            streams = [(s, TOOL_WORKER_GROUP, JOB_FIELD) for s in k.partitions_of(k.tools("default"))]
        held = []
        for stream, group, fld in streams:
            try:
                pending = self.client.xpending_range(stream, group, min="-", max="+", count=1000, consumername=consumer)
            except redis_sync.ResponseError:
                continue
            for p in pending:
                entry = self.client.xrange(stream, min=p["message_id"], max=p["message_id"])
                if entry and entry[0][1].get(fld):
                    raw = entry[0][1][fld]
                    try:
                        decoded = (
                            codec.decode_turn(raw)
                            if fld == TURN_FIELD
                            else (codec.decode_wake(raw) if fld == WAKE_FIELD else codec.decode_job(raw))
                        )
                    except Exception:  # a hostile entry
                        continue
                    if decoded.trace_id.startswith("chaos-"):
                        held.append(
                            Held(
                                stream=stream,
                                group=group,
                                entry_id=_text(p["message_id"]),
                                trace_id=decoded.trace_id,
                                call_id=getattr(decoded, "call_id", "") if fld == JOB_FIELD else "",
                                delivered=int(p["times_delivered"]),
                            )
                        )
        return held

    def _ended(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        for trace_id, turn_id in self.turns:
            pipe.hexists(self.keys.trace_keys(trace_id), f"end:{turn_id}")
        return sum(bool(x) for x in pipe.execute())

    def _replied(self) -> int:
        ours = {turn_id for _, turn_id in self.turns}
        return len(
            {codec.decode_reply(f[REPLY_FIELD]).turn_id for _, f in self.client.xrange(self.keys.replies)} & ours
        )

    def _pending(self) -> int:
        total = 0
        k = self.keys
        every = [(s, AGENT_LOOP_GROUP) for s in (*k.partitions_of(k.turns), *k.partitions_of(k.wake), k.cancel)]
        every += [(s, TOOL_WORKER_GROUP) for s in k.partitions_of(k.tools("default"))]
        for stream, group in every:
            try:
                total += self.client.xpending(stream, group)["pending"]
            except redis_sync.ResponseError:
                pass
        return total

    def _wait(self, predicate, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not predicate():
            self._watch_redeliveries()
            time.sleep(0.1)

    # --- checking -------------------------------------------------------------------------

    def _verify(self) -> ChaosResult:  # noqa: C901 (an outlier from before the complexity limit; issue 32 splits it)
        r = ChaosResult(
            turns=len(self.turns),
            kills=len(self.kills),
            services_stopped=self.stopped,
            stopped_logs=self.stopped_logs,
            hostile_entries=self.injected["hostile"],
            duplicate_copies=self.injected["duplicate"],
            malformed_copies=self.injected["malformed"],
        )
        killed_pids = {kill.pid for kill in self.kills}
        killed_names = {kill.name for kill in self.kills if kill.service == "tool-worker"}
        starts: dict[str, list[int]] = {}  # trace/call → pids of the runs that started, in order
        runs_at: dict[str, list[tuple[str, float]]] = {}  # trace/call → (phase, unix ms) of its runs
        for raw in self.client.lrange(apps.runs_key(self.namespace), 0, -1):
            call, _tool, phase, pid, at_ms = raw.decode().split("|")
            runs_at.setdefault(call, []).append((phase, float(at_ms)))
            if phase == "start":
                starts.setdefault(call, []).append(int(pid))
        # a call started again while the process of an earlier run was never killed: handled twice
        r.handled_twice = sum(1 for pids in starts.values() if any(p not in killed_pids for p in pids[:-1]))
        by_trace: dict[str, list[str]] = {}
        for trace_id, turn_id in self.turns:
            by_trace.setdefault(trace_id, []).append(turn_id)
        timeline: dict[str, list[tuple[float, object]]] = {}  # trace → (ms, event)
        planned: dict[tuple[str, str], float] = {}  # (trace, call) → the call's planned run time, ms
        for trace_id, turn_ids in by_trace.items():
            entries = codec.decode_entries(self.client.xrange(self.keys.trace(trace_id)), trace_id=trace_id)
            timeline[trace_id] = [(float(entry_id.split("-")[0]), e) for entry_id, e in entries]
            events = [e for _, e in entries]
            for e in events:
                if isinstance(e, ModelOutput):
                    for c in e.tool_calls:
                        planned[(trace_id, c.id)] = planned_ms(c.name, c.arguments, self.config.env)
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
            unknown = [e for e in events if isinstance(e, ToolOutput) and e.error == "outcome_unknown"]
            r.outcomes_unknown += len(unknown)
            started_by = {e.call_id: e.worker for e in events if isinstance(e, ToolStarted)}
            for e in unknown:  # "outcome unknown" is true only when a process that started it died
                pids = starts.get(f"{trace_id}/{e.call_id}", [])
                if not (
                    any(p in killed_pids for p in pids) or (not pids and started_by.get(e.call_id) in killed_names)
                ):
                    r.false_outcomes_unknown += 1
            r.duplicate_results += sum(n - 1 for n in results.values() if n > 1)
            r.stray_results += sum(1 for call_id in results if call_id not in calls)
            r.dangling_calls += sum(
                1 for call_id, (turn_id, _) in calls.items() if turn_id in endings and call_id not in results
            )
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
            if kill.held:
                r.kills_holding_work += 1
            for (trace_id, call_id), recovery in _recoveries(kill, timeline, runs_at, planned):
                r.recoveries.append(recovery)
                r.slowest.append((round(recovery.total, 2), kill.name, kill.service, trace_id))
                if not recovery.slow:
                    parts = (recovery.total, recovery.claim, recovery.handler, recovery.tool, recovery.rest)
                    r.slowest_quick.append((*(round(x, 2) for x in parts), kill.name, trace_id, call_id))
        r.slowest_quick = sorted(r.slowest_quick, reverse=True)[:8]
        r.slowest = sorted(r.slowest, reverse=True)[:5]
        return r


def _recoveries(
    kill: Kill,
    timeline: dict[str, list[tuple[float, object]]],
    runs_at: dict[str, list[tuple[str, float]]],
    planned: dict[tuple[str, str], float],
) -> list[tuple[tuple[str, str], Recovery]]:
    """((trace, call or ""), :class:`Recovery`) of every piece of work ``kill`` stranded: each tool call whose
    job the process held (its next progress: its result), and each trace whose turn or wake-up
    it held (its next progress: the trace's next event). Work recorded before the kill (an entry
    only left to acknowledge) has nothing to recover and is left out."""
    out = []
    seen: set[tuple[str, str]] = set()
    for h in kill.held:
        if (h.trace_id, h.call_id) in seen:
            continue
        seen.add((h.trace_id, h.call_id))
        events = timeline.get(h.trace_id, [])
        later = [
            ms
            for ms, e in events
            if ms > kill.at_ms and (not h.call_id or (isinstance(e, ToolOutput) and e.call_id == h.call_id))
        ]
        if not later:
            continue
        done = min(later)
        runs = runs_at.get(f"{h.trace_id}/{h.call_id}", []) if h.call_id else []
        starts = [ms for phase, ms in runs if phase == "start" and kill.at_ms < ms <= done]
        again = min(h.redelivered_ms or done, done, *starts)
        if starts:  # the wait for a handler: to the first run's start; the tool: the run that answered
            last = max(starts)
            ended = min((ms for phase, ms in runs if phase == "end" and last <= ms <= done), default=done)
            handler, tool = min(starts) - again, ended - last
        else:
            handler, tool = done - again, 0.0
        slow = planned.get((h.trace_id, h.call_id), 0.0) >= SLOW_WORK_MS if h.call_id else False
        recovery = Recovery(
            total=(done - kill.at_ms) / 1000.0,
            claim=(again - kill.at_ms) / 1000.0,
            handler=handler / 1000.0,
            tool=tool / 1000.0,
            slow=slow,
        )
        out.append(((h.trace_id, h.call_id), recovery))
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
