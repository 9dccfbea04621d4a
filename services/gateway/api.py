"""The gateway's HTTP API (FastAPI): a second door to the same wire, under the same rules.

Every ``/v1`` route needs ``Authorization: Bearer <key>``; a request without a valid key gets
401 and no data. A key may use only its agents: a conversation is visible to it when every turn
of the conversation (of its root, for a subagent's child trace) names one of them; one that is
not visible is answered 404, as one that does not exist. Requests are counted per key in
Redis (429 over the limit, with ``Retry-After``).

The gateway holds no state: everything it reads and writes is in Redis, through the runtime
library, so any number of replicas serve the same clients (a resumed event stream may land on
another replica: its position is in the ``Last-Event-ID``).
"""

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Annotated, Any

import msgspec
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse, ServerSentEvent

from agentstream.declarations.apps import App
from agentstream.delegation import child_trace_refusal, parent_ids
from agentstream.errors import AgentStreamError, ForkRefused, TurnRejected
from agentstream.models.endpoints import ModelEndpoint
from agentstream.ops import metrics
from agentstream.ops.apikeys import ApiKey, KeyRing
from agentstream.ops.settings import Settings
from agentstream.runtime import conversations, deadletters, operations, ratelimit
from agentstream.runtime.cancel import cancel_target, publish_cancel
from agentstream.runtime.connection import LOST_REDIS_ERRORS, POOL_EXHAUSTED_ERROR
from agentstream.runtime.deltas import follow
from agentstream.runtime.fold_reader import FoldReader
from agentstream.runtime.forks import fork_conversation, new_fork_id
from agentstream.runtime.operations import publish_approval
from agentstream.runtime.store import TraceStore
from agentstream.steps.approvals import AlreadyDecided, Refused, decide_message
from agentstream.steps.explaining import explain_call
from agentstream.steps.replay import endpoint_settings
from agentstream.steps.timeline import (
    ConversationState,
    conversation_filter,
    conversation_state,
    reply_from_fold,
    reply_of,
    root_of,
    trace_agents,
)
from agentstream.steps.trace_fold import FoldCache, TraceFold, fold_events
from agentstream.wire import checks as wire
from agentstream.wire import codec
from agentstream.wire.backends import turn_scope
from agentstream.wire.events import (
    ApprovalMessage,
    CancelMessage,
    Event,
    Reply,
    TurnEnded,
    TurnFailed,
    TurnInput,
    TurnMessage,
)
from agentstream_services.gateway import schemas
from agentstream_services.gateway.perimeter import OpenStreams, Perimeter, validation_problem
from agentstream_services.gateway.settings import GatewaySettings

log = logging.getLogger("agentstream.gateway")

_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_EVENT_ID = re.compile(r"^(\d{1,20}-\d{1,20}),(\d{1,20}-\d{1,20})$")
TRACE_PAGE_MAX = 5000
LIST_MAX = 200

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"model": schemas.Problem, "description": "No valid API key (refused before the body is read)."},
    413: {"model": schemas.Problem, "description": "The body is over the gateway's limit (refused as it streams)."},
    429: {
        "model": schemas.Problem,
        "description": "Over the key's rate limit, or its or the gateway's open streams; see Retry-After.",
    },
    503: {"model": schemas.Problem, "description": "Redis is not answering or its connections are all in use."},
}
_NOT_JSON: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Problem, "description": "The body is not JSON."},
}
_WIRE_REPLY: dict[str, Any] = {
    "description": "The reply: the wire's own (`agentstream schema reply`), as the agent loop publishes it.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Reply"}}},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": schemas.Problem, "description": "No such trace, or not one of this key's agents'."}
}


def _event_json(event: Event) -> dict[str, Any]:
    return msgspec.json.decode(codec.encode(event))


def _id(value: str, what: str, limits: wire.WireLimits, *, names_trace: bool = False) -> str:
    """An id of a path, query or body, checked by the wire's one rule (:func:`agentstream.wire.checks.id_refusal`):
    what no turn may have, no request may name either (422, the value quoted, bounded)."""
    refusal = wire.id_refusal(value, what, limits, names_trace=names_trace)
    if refusal is not None:
        raise HTTPException(422, f"{refusal}: got {_quoted(value)}")
    return value


def _trace_id(trace_id: str, limits: wire.WireLimits) -> str:
    return _id(trace_id, "a trace id", limits, names_trace=True)


_quoted = wire.quoted


def _stream_id(value: str | None, name: str) -> str | None:
    if value is not None and not _STREAM_ID.match(value):
        raise HTTPException(422, f"{name} must be a stream entry id such as 1700000000000-0, got {_quoted(value)}")
    return value


def _turn_id(turn_id: str, limits: wire.WireLimits) -> str:
    return _id(turn_id, "a turn id", limits)


class _Gateway:
    """What the routes of one gateway app share: its settings, the trace store, the folds of the
    traces requests ask about, the streams this replica holds open, and the rules of what a key
    may see."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        gateway: GatewaySettings,
        store: TraceStore,
        endpoints: dict[str, ModelEndpoint],
    ) -> None:
        self.app = app
        self.settings = settings
        self.gateway = gateway
        self.store = store
        self.keys = store.keys
        self.endpoints = endpoints
        self.folds = FoldReader(store, FoldCache(settings.fold_cache_budget_bytes()))  # the traces requests ask about
        self.block_ms = min(settings.block_ms, 1000)
        self.open_streams = OpenStreams(gateway.max_streams, gateway.max_streams_per_key)
        self.default_wait_s = min(30.0, gateway.max_wait_s)

    def hold_stream(self, key: ApiKey) -> None:
        """Count a stream (or a long-poll) the key holds open; 429 over its or the gateway's limit."""
        refusal = self.open_streams.take(key.name)
        if refusal is not None:
            metrics.GATEWAY_RATE_LIMITED.labels(key=key.name).inc()
            raise HTTPException(429, refusal, headers={"Retry-After": "1"})

    async def visible_events(self, key: ApiKey, trace_id: str) -> list[tuple[str, Event]]:
        """The trace's entries when the key may see it; 404 when it is empty or not the key's."""
        _trace_id(trace_id, self.settings.wire_limits)
        entries = await self.store.read(trace_id)
        if not entries or not await self.may_see(key, trace_id, [e for _, e in entries]):
            raise HTTPException(404, f"no trace {trace_id!r} among this key's conversations")
        return entries

    async def may_see(self, key: ApiKey, trace_id: str, events: list[Event]) -> bool:
        if key.trace_refusal(trace_id) is not None:  # another backend's conversation
            return False
        if key.all_agents:
            return True
        root = root_of(events, trace_id)
        agents = trace_agents(events) if root == trace_id else (await self.folds.current(root)).agents
        return bool(agents) and key.may_see(agents)  # a trace without a turn is nobody's but a "*" key's

    async def may_see_fold(self, key: ApiKey, fold: TraceFold) -> bool:
        """:meth:`may_see` from the trace's fold: what a request reads is what came since the last one."""
        if key.trace_refusal(fold.trace_id) is not None:  # another backend's conversation
            return False
        if key.all_agents:
            return True
        root = fold.root_trace_id or fold.trace_id
        agents = fold.agents if root == fold.trace_id else (await self.folds.current(root)).agents
        return bool(agents) and key.may_see(agents)


def _state_out(state) -> schemas.ConversationOut | None:
    if state is None:
        return None
    return schemas.ConversationOut(**{f: getattr(state, f) for f in schemas.ConversationOut.model_fields})


def create_api(
    app: App,
    settings: Settings,
    gateway: GatewaySettings,
    store: TraceStore,
    keyring: KeyRing,
    *,
    endpoints: dict[str, ModelEndpoint] | None = None,
) -> FastAPI:
    """The gateway's ASGI app.

    Its routes are added in this order (a request takes the first route whose path matches):
    publishing and waiting, following, cancelling, approving, forking, reading, then the probes
    and the console; then the perimeter, CORS and the error handlers.

    Args:
        app: the user app (its agents and tool queues; explain rebuilds requests with it).
        settings: agentstream's settings (namespace, block_ms, OPENAI_MODEL for explain).
        gateway: the gateway's settings.
        store: the trace store on the deployment's Redis.
        keyring: the API keys.
        endpoints: the configured model endpoints (explain renders bodies with them).
    """
    gw = _Gateway(app, settings, gateway, store, endpoints or {})
    api = FastAPI(
        title="agentstream gateway",
        version="1",
        description=(
            "Publish turns, wait for replies, follow conversations as server-sent events, cancel, "
            "read traces, explain model calls, list dead letters. Bearer API keys; see docs/how-to/gateway.md."
        ),
        docs_url=None,  # the interactive pages load scripts from a CDN; the document is at /openapi.json
        redoc_url=None,
    )
    bearer = HTTPBearer(auto_error=False, description="An API key from the gateway's keys file.")
    api.state.open_streams = gw.open_streams  # what this replica holds open (read by tests and operators' probes)

    async def caller(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> ApiKey:
        key = keyring.find(credentials.credentials) if credentials is not None else None
        if key is None:
            metrics.GATEWAY_UNAUTHORIZED.inc()
            raise HTTPException(
                401, "a valid API key is needed: Authorization: Bearer <key>", headers={"WWW-Authenticate": "Bearer"}
            )
        decision = await ratelimit.hit(store.redis, store.keys, key.name, limit=gateway.rate_limit_per_min)
        if not decision.allowed:
            metrics.GATEWAY_RATE_LIMITED.labels(key=key.name).inc()
            raise HTTPException(
                429,
                f"API key {key.name!r} is over its limit of {gateway.rate_limit_per_min} requests per minute",
                headers={"Retry-After": str(decision.retry_after_s)},
            )
        return key

    Caller = Annotated[ApiKey, Depends(caller)]
    for add_routes in (
        _publish_route,
        _reply_route,
        _stream_route,
        _cancel_route,
        _approval_route,
        _fork_route,
        _conversations_route,
        _explain_route,
        _trace_routes,
    ):
        add_routes(api, gw, Caller)
    _probe_routes(api, gw)
    _guard(api, gateway, keyring)
    _add_wire_schemas(api)
    return api


def _publish_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """POST /v1/turns."""
    app, settings, store, keys, folds = gw.app, gw.settings, gw.store, gw.keys, gw.folds
    may_see_fold = gw.may_see_fold

    @api.post(
        "/v1/turns",
        status_code=202,
        response_model=schemas.TurnAccepted,
        summary="Publish a turn",
        tags=["turns"],
        responses={
            **_PROBLEMS,
            403: {"model": schemas.Problem, "description": "The key may not use this agent or conversation."},
            422: {"model": schemas.Problem, "description": "Not a valid turn."},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TurnMessage"}}},
            }
        },
    )
    async def publish(request: Request, key: Caller) -> schemas.TurnAccepted:
        """Publish a turn: the wire's turn message (``agentstream schema turn``), validated by the
        same decoder the agent loop uses. The turn is answered by the running services; wait for
        its reply at ``reply_url`` or follow it at ``stream_url``."""
        raw = await request.body()  # at most max_body_bytes: the perimeter answers 413 past it
        try:  # the wire's rules, as the agent loop applies them (size, depth, schema, ids, metadata, reply stream)
            turn = wire.validate_turn(raw, keys=keys, limits=settings.wire_limits)
        except TurnRejected as exc:
            raise HTTPException(
                413 if exc.limit == wire.LIMIT_SETTINGS["max_turn_bytes"] else 422, exc.reason
            ) from None
        if app.agent(turn.agent) is None:
            known = ", ".join(sorted(a.name for a in app.agents))
            raise HTTPException(
                422, f"turn {turn.turn_id!r} names agent {turn.agent!r}, which this app does not have (agents: {known})"
            )
        if not key.may_use(turn.agent):
            raise HTTPException(403, f"API key {key.name!r} may not use agent {turn.agent!r}")
        scope = turn_scope(key.backend, keys.replies, turn.trace_id, turn.reply_to)
        if scope.refusal is not None:  # the agent loop's rule for a backend's own streams
            raise HTTPException(403, scope.refusal)
        try:  # the agent's rules: its input type, the tool states the turn asks (other refusals fail the turn)
            app.turn_input(turn)
        except TurnRejected as exc:
            if exc.code == wire.BAD_TURN:
                raise HTTPException(422, exc.reason) from None
        existing = await folds.current(turn.trace_id)  # what came since this gateway last looked
        if existing.events and not await may_see_fold(key, existing):
            raise HTTPException(403, f"API key {key.name!r} may not add turns to conversation {turn.trace_id!r}")
        if "/" in turn.trace_id:  # a child trace's id: the agent loop would refuse it (and write nothing)
            ancestor = None if existing.events else await conversations.nearest_trace(store, parent_ids(turn.trace_id))
            refusal = child_trace_refusal(
                turn.trace_id, turn.turn_id, existing.events[0] if existing.events else None, ancestor=ancestor
            )
            if refusal is not None:
                raise HTTPException(422, refusal)
        entry_id = await conversations.publish_turn(store, turn)
        metrics.GATEWAY_TURNS.labels(key=key.name, agent=turn.agent).inc()
        base = f"/v1/traces/{turn.trace_id}"
        return schemas.TurnAccepted(
            trace_id=turn.trace_id,
            turn_id=turn.turn_id,
            entry_id=entry_id,
            reply_url=f"{base}/turns/{turn.turn_id}/reply",
            stream_url=f"{base}/stream?turn_id={turn.turn_id}",
        )


def _reply_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """GET /v1/traces/{trace_id}/turns/{turn_id}/reply."""
    store, folds, gateway, open_streams = gw.store, gw.folds, gw.gateway, gw.open_streams
    block_ms, default_wait_s = gw.block_ms, gw.default_wait_s
    hold_stream, may_see_fold = gw.hold_stream, gw.may_see_fold

    @api.get(
        "/v1/traces/{trace_id:path}/turns/{turn_id}/reply",
        summary="Wait for a turn's reply (long-poll)",
        tags=["turns"],
        response_class=Response,
        responses={
            **_PROBLEMS,
            **_NOT_FOUND,
            200: _WIRE_REPLY,
            202: {"model": schemas.Pending, "description": "Not ended yet: ask again."},
        },
    )
    async def wait_reply(
        trace_id: str,
        turn_id: str,
        key: Caller,
        timeout_s: Annotated[
            float, Query(ge=0, le=gateway.max_wait_s, description="Longest wait, in seconds.")
        ] = default_wait_s,
    ) -> Any:
        """The turn's reply once it has ended (200); 202 when it has not ended within
        ``timeout_s``. A turn just published may not be in its trace yet: the wait covers that."""
        _trace_id(trace_id, gw.settings.wire_limits)
        _turn_id(turn_id, gw.settings.wire_limits)
        fold = await folds.current(trace_id)  # a poll reads what came since the last one, not the trace
        if fold.events and not await may_see_fold(key, fold):
            raise HTTPException(404, f"no trace {trace_id!r} among this key's conversations")
        reply = reply_from_fold(fold, turn_id)
        if reply is None and timeout_s > 0:
            hold_stream(key)  # a long-poll holds a Redis connection while it waits: counted
            try:
                stop = asyncio.Event()
                asyncio.get_running_loop().call_later(timeout_s, stop.set)
                after = fold.last_id or "0-0"
                async for _, event in store.follow(trace_id, after=after, block_ms=block_ms, stop=stop):
                    if isinstance(event, TurnInput) or (
                        isinstance(event, (TurnEnded, TurnFailed)) and event.turn_id == turn_id
                    ):
                        fold = await folds.current(trace_id)
                        if not await may_see_fold(key, fold):
                            raise HTTPException(404, f"no trace {trace_id!r} among this key's conversations")
                        reply = reply_from_fold(fold, turn_id)
                        if reply is not None:
                            break
            finally:
                open_streams.give(key.name)
        if reply is None:
            return JSONResponse(
                status_code=202, content=schemas.Pending(trace_id=trace_id, turn_id=turn_id).model_dump()
            )
        return Response(
            codec.encode(reply), media_type="application/json"
        )  # the wire's reply, as the agent loop publishes it


def _stream_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """GET /v1/traces/{trace_id}/stream."""
    store, gateway = gw.store, gw.gateway
    hold_stream, may_see = gw.hold_stream, gw.may_see

    @api.get(
        "/v1/traces/{trace_id:path}/stream",
        summary="Follow a conversation as server-sent events",
        tags=["traces"],
        responses={
            **_PROBLEMS,
            **_NOT_FOUND,
            200: {
                "content": {"text/event-stream": {}},
                "description": (
                    "Events `trace` (data: {id, event}: a stored event), `delta` (data: a token delta with its "
                    "`attempt` id and `id`), `end` (data: the reply; only with turn_id) and `error`. Each has an id "
                    "`<trace entry id>,<delta entry id>`: reconnect with Last-Event-ID to resume after it."
                ),
            },
        },
    )
    async def stream(
        request: Request,
        trace_id: str,
        key: Caller,
        turn_id: Annotated[str | None, Query(description="End the stream once this turn has ended.")] = None,
        after: Annotated[str | None, Query(description="Only trace events after this entry id (default: all).")] = None,
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", description="Resume after this event id.")
        ] = None,
    ) -> EventSourceResponse:
        """The conversation's stored events and, while the model writes, its token deltas, in
        the order they happened. Deltas of a failed attempt are followed by an ``abort`` delta:
        drop what that attempt wrote (each delta carries its attempt id)."""
        if last_event_id:
            match = _EVENT_ID.match(last_event_id.strip())
            if match is None:
                raise HTTPException(
                    422, f"Last-Event-ID must be '<trace entry id>,<delta entry id>' as sent, got {last_event_id!r}"
                )
            position, delta_position = match.group(1), match.group(2)
        else:
            position, delta_position = _stream_id(after, "after") or "0-0", "0-0"
        entries = await store.read(_trace_id(trace_id, gw.settings.wire_limits))
        if turn_id is not None:
            _turn_id(turn_id, gw.settings.wire_limits)
        events = [e for _, e in entries]
        if events and not await may_see(key, trace_id, events):
            raise HTTPException(404, f"no trace {trace_id!r} among this key's conversations")
        ended_early = None  # the turn ended at or before the position the client resumes from
        if turn_id:
            ending_id = next(
                (i for i, e in entries if isinstance(e, (TurnEnded, TurnFailed)) and e.turn_id == turn_id), None
            )
            if ending_id is not None and _after_or_at(position, ending_id):
                ended_early = reply_of(trace_id, events, turn_id)

        hold_stream(key)  # given back when the stream ends (_stream_events' finally)

        return EventSourceResponse(
            _stream_events(gw, key, trace_id, turn_id, events, position, delta_position, ended_early),
            ping=gateway.sse_ping_s,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


def _cancel_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """POST /v1/traces/{trace_id}/cancel."""
    store, keys = gw.store, gw.keys
    visible_events = gw.visible_events

    @api.post(
        "/v1/traces/{trace_id:path}/cancel",
        status_code=202,
        response_model=schemas.CancelAccepted,
        summary="Cancel a turn",
        tags=["turns"],
        responses={
            **_PROBLEMS,
            **_NOT_FOUND,
            **_NOT_JSON,
            409: {"model": schemas.Problem, "description": "Nothing to cancel (the reason says why)."},
        },
    )
    async def cancel(trace_id: str, key: Caller, body: schemas.CancelIn | None = None) -> schemas.CancelAccepted:
        """Cancel the turn running now (or ``turn_id``): the in-flight model request is
        aborted, queued tool jobs skipped, running tools told; the turn ends with
        ``turn_failed`` code ``cancelled``. Follow the stream to see it end."""
        body = body or schemas.CancelIn()
        if body.turn_id:
            _turn_id(body.turn_id, gw.settings.wire_limits)
        entries = await visible_events(key, trace_id)
        target = cancel_target([e for _, e in entries], body.turn_id)
        if target.turn_id is None:
            raise HTTPException(409, f"trace {trace_id!r}: {target.reason}; nothing to cancel")
        message = CancelMessage(trace_id=trace_id, turn_id=target.turn_id, by=f"gateway:{key.name}", reason=body.reason)
        entry_id = await publish_cancel(store.redis, keys, message)
        return schemas.CancelAccepted(trace_id=trace_id, turn_id=target.turn_id, entry_id=entry_id)


def _approval_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """POST /v1/traces/{trace_id}/approvals."""
    store, keys = gw.store, gw.keys
    visible_events = gw.visible_events

    @api.post(
        "/v1/traces/{trace_id:path}/approvals",
        status_code=202,
        response_model=schemas.ApprovalAccepted,
        summary="Approve or deny a tool call that awaits a person",
        tags=["turns"],
        responses={
            **_PROBLEMS,
            **_NOT_JSON,
            404: {
                "model": schemas.Problem,
                "description": "No such trace (among this key's) or call awaiting approval.",
            },
            409: {"model": schemas.Problem, "description": "The call was decided already, or its turn ended."},
            422: {
                "model": schemas.Problem,
                "description": "Not a valid approval (edited arguments the tool does not allow).",
            },
        },
    )
    async def approve(trace_id: str, key: Caller, body: schemas.ApprovalIn) -> schemas.ApprovalAccepted:
        """Approve (``approved: true``) or deny a call the trace records as awaiting approval,
        under the key's scopes; ``by`` is the key's name. The decision is appended once per call
        (a second one changes nothing) and the turn goes on: an approved call runs once, a denied
        one gets an error result the model sees. Follow the stream to see it."""
        _id(body.call_id, "a call id", gw.settings.wire_limits)
        entries = await visible_events(key, trace_id)
        arguments = json.dumps(body.arguments) if body.arguments is not None else None
        by = f"gateway:{key.name}"
        try:
            message = ApprovalMessage(
                trace_id=trace_id,
                call_id=body.call_id,
                approved=body.approved,
                by=by,
                reason=body.reason,
                arguments=arguments,
            )
            message = codec.decode_approval(codec.encode(message))  # the wire's own checks
        except msgspec.DecodeError as exc:
            raise HTTPException(422, str(exc)) from None
        awaited, decided, turn_open = fold_events(trace_id, entries).approval_of(body.call_id)
        outcome = decide_message(message, awaited=awaited, decided=decided, turn_open=turn_open, by=by)
        if isinstance(outcome, AlreadyDecided):
            first = outcome.decision
            verdict = "approved" if first.approved else "denied"
            raise HTTPException(
                409, f"call {body.call_id!r} was {verdict} already by {first.by!r}; that decision stands"
            )
        if isinstance(outcome, Refused):
            status = 404 if awaited is None else 409 if not turn_open else 422
            raise HTTPException(status, outcome.reason)
        entry_id = await publish_approval(store.redis, keys, message)
        return schemas.ApprovalAccepted(trace_id=trace_id, call_id=body.call_id, by=by, entry_id=entry_id)


def _fork_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """POST /v1/traces/{trace_id}/forks."""
    settings, store, keys = gw.settings, gw.store, gw.keys
    visible_events = gw.visible_events

    @api.post(
        "/v1/traces/{trace_id:path}/forks",
        status_code=201,
        response_model=schemas.ForkOut,
        summary="Fork the conversation at a turn",
        tags=["turns"],
        responses={
            **_PROBLEMS,
            **_NOT_JSON,
            404: {"model": schemas.Problem, "description": "No such trace (among this key's), turn or model call."},
            403: {"model": schemas.Problem, "description": "The key may not use the agent of the replaced turn."},
            409: {"model": schemas.Problem, "description": "The turn has not ended, or the fork id is taken."},
            422: {"model": schemas.Problem, "description": "Not a valid fork (the reason says why)."},
        },
    )
    async def fork(trace_id: str, key: Caller, body: schemas.ForkIn) -> schemas.ForkOut:
        """Start a new conversation whose history is this one's up to a turn: after it (it must
        have ended), before one of its model calls (``step``: the fork's agent loop makes that
        call again), or before it with its input replaced (``text``: published to the fork as
        the same turn). The fork's first event names this trace; asking again with the same
        ``fork_id`` answers the same fork. Under the key's scopes: the key must see this
        conversation (else 404), may use the replaced turn's agent, and, for a key of one
        backend, fork only into that backend's conversations (else 403)."""
        _turn_id(body.turn_id, settings.wire_limits)
        if body.fork_id is not None:  # as the fork itself checks it: no fork a turn cannot reach
            _id(body.fork_id, "a fork id", settings.wire_limits, names_trace=True)
        entries = await visible_events(key, trace_id)
        fork_id = body.fork_id or new_fork_id(trace_id)  # under the source's id: its backend's too
        refusal = key.trace_refusal(fork_id)
        if refusal is not None:  # a backend's key forks only into its own conversations
            raise HTTPException(403, refusal)
        if body.text is not None:
            source = next((e for _, e in entries if isinstance(e, TurnInput) and e.turn_id == body.turn_id), None)
            if source is not None and not key.may_use(source.agent):
                raise HTTPException(403, f"API key {key.name!r} may not use agent {source.agent!r}")
            scope = turn_scope(key.backend, keys.replies, fork_id, source.reply_to if source else None)
            if scope.refusal is not None:
                raise HTTPException(403, scope.refusal)
        try:
            forked = await fork_conversation(
                store,
                trace_id,
                turn_id=body.turn_id,
                step=body.step,
                text=body.text,
                fork_id=fork_id,
                by=f"gateway:{key.name}",
                limits=settings.wire_limits,
                expire_ms=int(settings.trace_retention_s * 1000) if settings.trace_retention_s else None,
            )
        except ForkRefused as exc:
            status = {"not_found": 404, "conflict": 409, "too_large": 413}.get(exc.kind, 422)
            raise HTTPException(status, str(exc)) from None
        made = forked.forked_from
        return schemas.ForkOut(
            trace_id=forked.trace_id,
            source_trace_id=made.source_trace_id,
            source_entry_id=made.source_entry_id,
            turn_id=made.turn_id,
            step=made.step,
            replaced=made.replaced,
            copied=made.copied,
            created=forked.created,
            turn_entry=forked.turn_entry,
            stream_url=f"/v1/traces/{forked.trace_id}/stream",
        )


def _conversations_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """GET /v1/conversations."""
    store, folds = gw.store, gw.folds
    may_see_fold, state_out = gw.may_see_fold, _state_out

    @api.get(
        "/v1/conversations",
        response_model=schemas.ConversationList,
        summary="Recent conversations",
        tags=["traces"],
        responses=_PROBLEMS,
    )
    async def list_conversations(
        key: Caller,
        limit: Annotated[int, Query(ge=1, le=LIST_MAX)] = 50,
        before_ms: Annotated[
            int | None, Query(ge=0, le=2**53, description="Only conversations older than this (Unix ms).")
        ] = None,
        after_ms: Annotated[
            int | None, Query(ge=0, le=2**53, description="Only conversations at or after this time (Unix ms).")
        ] = None,
        agent: Annotated[str | None, Query(description="Only those whose newest turn is this agent's.")] = None,
        state: Annotated[
            str | None, Query(max_length=32, description="Only those whose newest turn is in this state.")
        ] = None,
        meta: Annotated[
            list[str] | None,
            Query(description="key=value: only those whose newest turn's metadata holds it (repeat, at most 8)."),
        ] = None,
    ) -> schemas.ConversationList:
        """The newest conversations this key may see, each with the state of its newest turn
        (running, waiting on tools, ended, failed or cancelled, with the reason) and its metadata,
        found by agent, state, metadata and time (the newest turn's, to within a second). A page
        holds at most ``limit``; ``next_before_ms`` is where the next one starts (with the same
        filters). A filter that few conversations match may answer a short page (even an empty
        one) with a ``next_before_ms``: the gateway reads at most a bounded part of the index
        per request."""
        if agent is not None:
            _id(agent, "an agent name", gw.settings.wire_limits)
        try:
            where = conversation_filter(agent=agent, state=state, meta=meta or ())
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        if after_ms is not None and before_ms is not None and after_ms >= before_ms:
            raise HTTPException(422, f"after_ms ({after_ms}) must be before before_ms ({before_ms})")

        async def visible(found: ConversationState) -> bool:
            # the rule reads use: every turn's agent is the key's (not only the newest turn's)
            return await may_see_fold(key, await folds.current(found.trace_id))

        found, next_before = await conversations.find(
            store, limit=limit, keep=visible, where=where, before_ms=before_ms, after_ms=after_ms
        )
        return schemas.ConversationList(
            conversations=[c for c in map(state_out, found) if c is not None], next_before_ms=next_before
        )


def _explain_route(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """GET /v1/traces/{trace_id}/explain."""
    app, settings, endpoints = gw.app, gw.settings, gw.endpoints
    visible_events = gw.visible_events

    @api.get(
        "/v1/traces/{trace_id:path}/explain",
        response_model=schemas.Explanation,
        summary="Explain a model call",
        tags=["traces"],
        responses={**_PROBLEMS, **_NOT_FOUND, 422: {"model": schemas.Problem}},
    )
    async def explain(
        trace_id: str,
        key: Caller,
        step: Annotated[int, Query(ge=0, le=100_000, description="The call's step within its turn (0-based).")],
        turn_id: Annotated[str | None, Query(description="The turn (default: the newest).")] = None,
    ) -> schemas.Explanation:
        """The exact request of one model call, rebuilt from the stored trace (its fingerprint
        compared with the one recorded), and which shrink shortened each old result, and when
        (what ``agentstream trace explain`` prints)."""
        entries = await visible_events(key, trace_id)
        if turn_id is not None:
            _turn_id(turn_id, settings.wire_limits)
        try:
            explained = explain_call(
                [e for _, e in entries],
                app.agent,
                step=step,
                turn_id=turn_id,
                endpoints=endpoints,
                model_name=settings.openai_model,
            )
        except LookupError as exc:
            raise HTTPException(404, f"trace {trace_id!r}: {exc}") from None
        except AgentStreamError as exc:
            raise HTTPException(422, f"trace {trace_id!r}: {exc}") from None
        data = explained.as_json(trace_id)
        data["matches"] = explained.matches
        data["endpoint"] = (
            endpoint_settings(explained.endpoint, configured=explained.configured) if explained.endpoint else None
        )
        return schemas.Explanation(**data)


def _trace_routes(api: FastAPI, gw: _Gateway, Caller: Any) -> None:
    """GET /v1/traces/{trace_id}, /v1/dead-letters and /v1/agents."""
    app, store, keys = gw.app, gw.store, gw.keys
    visible_events, state_out = gw.visible_events, _state_out

    @api.get(
        "/v1/traces/{trace_id:path}",
        response_model=schemas.TraceOut,
        summary="Read a trace",
        tags=["traces"],
        responses={**_PROBLEMS, **_NOT_FOUND},
    )
    async def read_trace(
        trace_id: str,
        key: Caller,
        after: Annotated[str | None, Query(description="Only events after this entry id.")] = None,
        limit: Annotated[int, Query(ge=1, le=TRACE_PAGE_MAX)] = 1000,
    ) -> schemas.TraceOut:
        """A trace's stored events (a page of them), its child traces (subagent runs, each a
        trace of its own) and the state of its newest turn."""
        _stream_id(after, "after")
        entries = await visible_events(key, trace_id)
        events = [e for _, e in entries]
        root = root_of(events, trace_id)
        page = [(i, e) for i, e in entries if after is None or _after(i, after)][:limit]
        more = bool(page) and page[-1][0] != entries[-1][0]
        return schemas.TraceOut(
            trace_id=trace_id,
            root_trace_id=root,
            events=[schemas.TraceEvent(id=i, event=_event_json(e)) for i, e in page],
            next_after=page[-1][0] if more else None,
            children=await conversations.children(store, trace_id, root),
            state=state_out(conversation_state(trace_id, entries)),
        )

    @api.get(
        "/v1/dead-letters",
        response_model=schemas.DeadLetterList,
        summary="List dead letters",
        tags=["operations"],
        responses={**_PROBLEMS, 403: {"model": schemas.Problem, "description": 'Only a key for every agent ("*").'}},
    )
    async def dead_letters(
        key: Caller,
        limit: Annotated[int, Query(ge=1, le=LIST_MAX)] = 50,
        before: Annotated[str | None, Query(description="Only entries older than this entry id.")] = None,
    ) -> schemas.DeadLetterList:
        """The newest entries of every work stream's dead-letter stream: where each came from,
        how many deliveries it had, its last error and its payload (cut to a bounded excerpt)."""
        if not key.sees_everything:
            raise HTTPException(
                403, f'API key {key.name!r} may not read the dead letters (it needs agents ["*"] and no backend)'
            )
        _stream_id(before, "before")
        letters = await deadletters.read(
            store.redis, keys, keys.work_streams(app.tool_queues), count=limit, before=before
        )
        return schemas.DeadLetterList(
            dead_letters=letters,
            next_before=letters[-1].entry_id if len(letters) == limit else None,
        )

    @api.get(
        "/v1/agents",
        response_model=schemas.AgentList,
        summary="The agents this key may use",
        tags=["operations"],
        responses=_PROBLEMS,
    )
    async def agents(key: Caller) -> schemas.AgentList:
        return schemas.AgentList(
            key=key.name,
            agents=[
                schemas.AgentOut(name=a.name, model=a.model, tools=[t.name for t in a.tools])
                for a in app.agents
                if key.may_use(a.name)
            ],
        )


def _probe_routes(api: FastAPI, gw: _Gateway) -> None:
    """The probes (/healthz, /readyz) and the console."""
    store, gateway = gw.store, gw.gateway

    @api.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        try:
            await asyncio.wait_for(operations.ping(store.redis), timeout=2.0)
        except Exception as exc:  # not ready whatever went wrong
            return JSONResponse(
                status_code=503, content={"status": "not ready", "detail": f"Redis: {type(exc).__name__}"}
            )
        return JSONResponse(content={"status": "ready"})

    if gateway.console:
        console_dir = resources.files("agentstream_services.gateway") / "console"
        api.mount("/console", StaticFiles(directory=str(console_dir), html=True), name="console")

        @api.get("/", include_in_schema=False)
        async def root() -> RedirectResponse:
            return RedirectResponse("/console/")


def _guard(api: FastAPI, gateway: GatewaySettings, keyring: KeyRing) -> None:
    """The perimeter, CORS and the error handlers."""
    # before any route: the key, then the body limit while it streams (and the security headers);
    # CORS is added after it, so it is outside: a preflight is answered without a key
    api.add_middleware(Perimeter, keyring=keyring, max_body_bytes=gateway.max_body_bytes)
    if gateway.cors_origin_list:
        api.add_middleware(
            CORSMiddleware,
            allow_origins=gateway.cors_origin_list,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            max_age=600,
        )

    async def redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("gateway request %s %s: %s", request.method, request.url.path, _redis_problem(exc))
        return JSONResponse(status_code=503, content={"detail": _redis_problem(exc)}, headers={"Retry-After": "1"})

    for lost in LOST_REDIS_ERRORS:
        api.add_exception_handler(lost, redis_unavailable)

    api.add_exception_handler(RequestValidationError, validation_problem)  # a 422 quotes bounded values

    @api.exception_handler(AgentStreamError)
    async def unreadable(request: Request, exc: AgentStreamError) -> JSONResponse:
        log.error("gateway request %s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=500, content={"detail": str(exc)})


async def _stream_events(
    gw: _Gateway,
    key: ApiKey,
    trace_id: str,
    turn_id: str | None,
    events: list[Event],
    position: str,
    delta_position: str,
    ended_early: Reply | None,
) -> AsyncIterator[ServerSentEvent]:
    """The server-sent events of :func:`_stream_route` after its checks: the stored events from
    ``position`` and the token deltas from ``delta_position``, until the turn ends (or, when it
    ended at or before ``position``, its reply alone). Gives back the stream the key held."""
    store, keys, block_ms, open_streams, may_see = gw.store, gw.keys, gw.block_ms, gw.open_streams, gw.may_see
    metrics.GATEWAY_STREAMS_OPEN.inc()
    try:
        if ended_early is not None:
            yield ServerSentEvent(
                event="end", id=f"{position},{delta_position}", data=codec.encode(ended_early).decode()
            )
            return
        seen = list(events)
        cleared = bool(events)  # checked above; else nothing is sent before a turn of the key's agents
        async for item in follow(
            store.redis, keys, trace_id, after=position, deltas_after=delta_position, block_ms=block_ms
        ):
            if not cleared and not isinstance(item.event, TurnInput):
                continue
            if item.delta is not None:
                delta_position = item.entry_id
                data = {"id": item.entry_id, **msgspec.structs.asdict(item.delta)}
                yield ServerSentEvent(event="delta", id=f"{position},{delta_position}", data=json.dumps(data))
                continue
            event = item.event
            assert event is not None
            position = item.entry_id
            seen.append(event)
            if isinstance(event, TurnInput):
                if not await may_see(key, trace_id, seen):
                    yield ServerSentEvent(
                        event="error", data=json.dumps({"detail": "this conversation is not among this key's"})
                    )
                    return
                cleared = True
            yield ServerSentEvent(
                event="trace",
                id=f"{position},{delta_position}",
                data=json.dumps({"id": position, "event": _event_json(event)}),
            )
            if turn_id and isinstance(event, (TurnEnded, TurnFailed)) and event.turn_id == turn_id:
                reply = reply_of(trace_id, seen, turn_id)
                yield ServerSentEvent(event="end", id=f"{position},{delta_position}", data=codec.encode(reply).decode())
                return
    except (AgentStreamError, *LOST_REDIS_ERRORS) as exc:
        # an entry that cannot be read, or Redis lost: the stream says why and ends
        yield ServerSentEvent(event="error", data=json.dumps({"detail": _redis_problem(exc)}))
    finally:
        metrics.GATEWAY_STREAMS_OPEN.dec()
        open_streams.give(key.name)


def _redis_problem(exc: Exception) -> str:
    """The 503's reason for a Redis error: its pool exhausted, or Redis not answering (another
    error: its own message)."""
    if not isinstance(exc, LOST_REDIS_ERRORS):
        return str(exc)
    if isinstance(exc, POOL_EXHAUSTED_ERROR):
        return "the gateway's Redis connections are all in use (too many requests in flight); retry shortly"
    return f"Redis is not answering ({type(exc).__name__}); retry shortly"


def _after(entry_id: str, position: str) -> bool:
    return _order(entry_id) > _order(position)


def _after_or_at(entry_id: str, position: str) -> bool:
    return _order(entry_id) >= _order(position)


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _add_wire_schemas(api: FastAPI) -> None:
    """Put the wire's TurnMessage and Reply JSON schemas (msgspec's) into the OpenAPI document's components."""
    base_openapi = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is not None:
            return api.openapi_schema
        document = base_openapi()
        _, components = msgspec.json.schema_components([TurnMessage, Reply], ref_template="#/components/schemas/{name}")
        document.setdefault("components", {}).setdefault("schemas", {}).update(components)
        api.openapi_schema = document
        return document

    api.openapi = openapi  # type: ignore[method-assign]
