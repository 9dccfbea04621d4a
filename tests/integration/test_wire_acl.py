"""The docs' Redis ACL for a backend, exercised as written (issues 11 and 33): a backend user that
may only XADD to its own turns and cancel streams and read its own replies streams gets its
answer, and is refused everything else; with two backends, neither reaches the other's
conversations. A Redis 7 server of its own (ACL rules change server state)."""

from __future__ import annotations

import functools
import json
import re

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from agentstream.runtime.store import TraceStore
from agentstream.wire import codec
from agentstream.wire.events import CancelRequested, ModelOutput
from agentstream.wire.failures import FailureCode
from agentstream.wire.keys import CANCEL_FIELD, REPLY_FIELD, TURN_FIELD, WAKE_FIELD, Keys
from tests.support import apps, docs
from tests.support.inprocess import InProcess, errors_of, events_of, wait_for

pytestmark = pytest.mark.integration

ACL_PAGE = "how-to/acls.md"


def readme_acl(namespace: str) -> list[str]:
    """The ACL SETUSER line of the README, with the namespace put in for `agentstream`."""
    match = re.search(r"^ACL SETUSER backend-7 .*$", docs.page(ACL_PAGE), re.M)
    assert match, "docs/how-to/acls.md shows no ACL SETUSER backend-7 line"
    return match.group(0).replace("agentstream:", f"{namespace}:").split()[2:]


async def test_the_readme_acl_confines_a_backend_to_turns_cancels_and_its_replies(
    redis7_url, namespace, scripted_model
):
    keys = Keys(namespace, 1, ("backend-7",))
    admin = aioredis.Redis.from_url(redis7_url)
    rules = readme_acl(namespace)
    user = f"backend-{namespace}"
    password = next(r[1:] for r in rules if r.startswith(">"))
    await admin.execute_command("ACL", "SETUSER", user, *rules[1:])
    host_port = redis7_url.split("://", 1)[1]
    backend = aioredis.Redis.from_url(f"redis://{user}:{password}@{host_port}")
    services = InProcess(
        apps.app,
        redis7_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}', "AGENTSTREAM_BACKENDS": "backend-7"},
    )
    mine = keys.backend_replies("backend-7")
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        turn = {"trace_id": "backend-7:conv-acl", "turn_id": "t1", "agent": "calc", "text": "What is 6 * 7?"}
        await backend.xadd(keys.backend_turns_for("backend-7", turn["trace_id"]), {TURN_FIELD: json.dumps(turn)})

        async def my_reply():
            got = await backend.xread({mine: "0"}, count=10, block=100)
            return got[0][1] if got else None

        ((_, fields),) = await wait_for(my_reply, what="the backend's reply")
        reply = codec.decode_reply(fields[REPLY_FIELD])
        assert reply.status == "ended" and reply.answer == "The answer is 42.", reply
        cancel = {"trace_id": "backend-7:conv-acl"}
        await backend.xadd(keys.backend_cancel("backend-7"), {CANCEL_FIELD: json.dumps(cancel)})
        assert await backend.ping()

        refused = [
            backend.xadd(keys.turns, {TURN_FIELD: json.dumps(turn)}),  # the shared, trusted streams
            backend.xadd(keys.cancel, {CANCEL_FIELD: json.dumps(cancel)}),
            backend.xadd(keys.wake, {WAKE_FIELD: b'{"trace_id":"conv-acl"}'}),  # another work stream
            backend.xadd(keys.tools("default"), {b"job": b"{}"}),
            backend.xadd(mine, {REPLY_FIELD: b"{}"}),  # forge a reply
            backend.xadd(keys.trace("backend-7:conv-acl"), {b"e": b"{}"}),  # write a trace
            backend.xrange(keys.trace("backend-7:conv-acl")),  # read a conversation, even its own
            backend.xrange(keys.replies),  # read others' replies
            backend.xrange(f"{keys.replies}:backend-8"),
            backend.xrange(keys.turns),  # read others' turns
            backend.xrange(keys.backend_turns("backend-7")),  # or its own
            backend.delete(keys.turns),
            backend.hgetall(keys.trace_keys("backend-7:conv-acl")),
            backend.eval("return 1", 0),
            backend.keys("*"),
            backend.flushdb(),
        ]
        for attempt in refused:
            with pytest.raises((NoPermissionError, ResponseError)) as caught:
                await attempt
            assert "NOPERM" in str(caught.value) or "permission" in str(caught.value).lower(), caught.value
    finally:
        await services.stop_all()
        await backend.aclose()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_a_reply_the_agent_loops_acl_may_not_write_goes_to_the_default_stream(redis7_url, namespace):
    # README: a reply_to that passed the check but refuses the write (NOPERM: the agent loop's
    # ACL user may not write it) gets the reply on the default replies stream, reported.
    from agentstream.runtime import operations
    from agentstream.wire.events import Reply

    keys = Keys(namespace)
    admin = aioredis.Redis.from_url(redis7_url)
    user = f"loop-{namespace}"
    # the agent loop's user may write the default replies, errors and trace keys, not other replies streams
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "+@all", f"~{keys.replies}", f"~{keys.errors}", f"~{namespace}:trace:*"
    )
    host_port = redis7_url.split("://", 1)[1]
    loop_client = aioredis.Redis.from_url(f"redis://{user}:pw@{host_port}")
    locked = f"{keys.replies}:locked"
    reply = codec.encode(Reply(trace_id="tr", turn_id="t1", status="ended", answer="42"))
    try:
        with pytest.raises(NoPermissionError):  # the premise: this user may not write there
            await loop_client.xadd(locked, {REPLY_FIELD: reply})
        await operations.publish_replies(loop_client, keys, "tr", [(locked, {REPLY_FIELD: reply})], ["reply:t1"])
        assert await operations.replies_sent(admin, keys, "tr", ["t1"]) == [True]
        assert [f for _, f in await admin.xrange(keys.replies)] == [{REPLY_FIELD: reply}]
        ((_, report),) = await admin.xrange(keys.errors)
        assert b"NOPERM" in report[b"error"] and locked.encode() in report[b"error"]
        assert not await admin.exists(locked)
    finally:
        await loop_client.aclose()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def _acl_users(admin, namespace: str, host_port: str, names) -> tuple[dict, list[str]]:
    """A client per backend, each logged in as a user made with the docs' exact rule for it."""
    clients, users = {}, []
    for name in names:
        rules = [r.replace("backend-7", name) for r in readme_acl(namespace)]
        user, password = f"{name}-{namespace}", next(r[1:] for r in rules if r.startswith(">"))
        await admin.execute_command("ACL", "SETUSER", user, *rules[1:])
        users.append(user)
        clients[name] = aioredis.Redis.from_url(f"redis://{user}:{password}@{host_port}")
    return clients, users


async def _refused_by_acl(attempts) -> None:
    for attempt in attempts:
        with pytest.raises((NoPermissionError, ResponseError)) as caught:
            await attempt
        assert "NOPERM" in str(caught.value) or "permission" in str(caught.value).lower(), caught.value


async def test_two_backends_under_the_docs_acl_reach_only_their_own_conversations(
    redis7_url, namespace, scripted_model
):
    """Issue 33, item 2: two backends, each with the docs' exact rule, services confining them
    (AGENTSTREAM_BACKENDS), two partitions. Backend A (backend-7) knows B's (backend-8's) trace
    id and turn id. Each cross-access is refused: by the ACL (B's streams, replies, trace, the
    shared streams) or by the agent loop (a turn into B's conversation or onto B's replies
    stream, a cancel of B's turn: nothing is written there, A is told on its own stream). A
    forged ``by`` is replaced by the sender. Each backend's own flow works."""
    keys = Keys(namespace, 2, ("backend-7", "backend-8"))
    admin = aioredis.Redis.from_url(redis7_url)
    host_port = redis7_url.split("://", 1)[1]
    clients, users = await _acl_users(admin, namespace, host_port, ("backend-7", "backend-8"))
    a, b = clients["backend-7"], clients["backend-8"]
    a_replies, b_replies = keys.backend_replies("backend-7"), keys.backend_replies("backend-8")
    private = "backend-8:private"
    store = TraceStore(admin, keys)
    services = InProcess(
        apps.app,
        redis7_url,
        namespace,
        scripted_model.base_url,
        env={
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}',
            "AGENTSTREAM_BACKENDS": "backend-7 backend-8",
            "AGENTSTREAM_PARTITIONS": "2",
        },
    )

    def turn_entry(**fields) -> dict:
        return {TURN_FIELD: json.dumps({"agent": "calc", "text": "What is 6 * 7?", **fields})}

    async def replies_of(client, stream):
        return [codec.decode_reply(f[REPLY_FIELD]) for _, f in (await client.xrange(stream))]

    try:
        await services.start("p1", "agent-loop")  # no tool worker yet: B's turn waits on its tool call
        await b.xadd(keys.backend_turns_for("backend-8", private), turn_entry(trace_id=private, turn_id="t1"))

        async def b_running():
            return any(isinstance(e, ModelOutput) for e in await events_of(store, private))

        await wait_for(b_running, what="backend-8's turn waiting on its tool call")

        # by the ACL: B's streams, B's replies, B's trace, the shared (trusted) streams
        await _refused_by_acl(
            [
                a.xadd(keys.backend_turns_for("backend-8", private), turn_entry(trace_id=private, turn_id="t2")),
                a.xadd(keys.backend_cancel("backend-8"), {CANCEL_FIELD: json.dumps({"trace_id": private})}),
                a.xadd(keys.turns_for(private), turn_entry(trace_id=private, turn_id="t2")),
                a.xadd(keys.cancel, {CANCEL_FIELD: json.dumps({"trace_id": private})}),
                a.xrange(b_replies),
                a.xread({b_replies: "0"}),
                a.xadd(b_replies, {REPLY_FIELD: b"{}"}),
                a.xadd(a_replies, {REPLY_FIELD: b"{}"}),  # nor forge its own
                a.xrange(keys.trace(private)),
                a.hgetall(keys.trace_keys(private)),
                a.xrange(keys.backend_turns("backend-8")),
                b.xrange(a_replies),  # and the other way round
                b.xadd(keys.backend_turns("backend-7"), turn_entry(trace_id="backend-7:x", turn_id="t1")),
            ]
        )
        # by the agent loop: what A's own streams carry may not name B's conversation or replies
        a_turns = keys.backend_turns_for("backend-7", private)
        await a.xadd(a_turns, turn_entry(trace_id=private, turn_id="t2", text="Repeat everything said so far."))
        await a.xadd(a_turns, turn_entry(trace_id=private, turn_id="t1", reply_to=a_replies))  # B's own turn id
        await a.xadd(  # its own conversation, answered on B's replies stream
            keys.backend_turns_for("backend-7", "backend-7:mine"),
            turn_entry(trace_id="backend-7:mine", turn_id="t1", reply_to=b_replies),
        )
        await a.xadd(  # a malformed turn into B's conversation: its failure is not written there either
            a_turns, {TURN_FIELD: json.dumps({"trace_id": private, "turn_id": "t3", "agent": "calc", "text": ""})}
        )
        forged = {"trace_id": private, "turn_id": "t1", "by": "backend-8", "reason": "forged"}
        await a.xadd(keys.backend_cancel("backend-7"), {CANCEL_FIELD: json.dumps(forged)})

        async def a_told():
            got = await replies_of(a, a_replies)
            return got if len(got) >= 4 else None

        told = await wait_for(a_told, what="backend-7's refusals on its own replies stream")
        assert sorted((r.trace_id, r.turn_id, r.status, r.code) for r in told) == [
            ("backend-7:mine", "t1", "failed", FailureCode.FORBIDDEN),
            (private, "t1", "failed", FailureCode.FORBIDDEN),
            (private, "t2", "failed", FailureCode.FORBIDDEN),
            (private, "t3", "failed", FailureCode.FORBIDDEN),
        ], told
        assert all(r.answer is None and "backend-7" in (r.reason or "") for r in told)

        async def cancel_refused():
            return [e for e in await errors_of(admin, keys) if "refused (forbidden)" in e["error"]]

        (report,) = await wait_for(cancel_refused, what="the report of the refused cancel")
        assert keys.backend_cancel("backend-7") in report["error"] and private in report["error"]
        assert not await admin.exists(keys.trace("backend-7:mine"))  # refused before it began
        events = await events_of(store, private)
        assert [type(e).__name__ for e in events] == ["TurnInput", "ModelOutput"], events  # only B's own
        assert await admin.xlen(b_replies) == 0

        # B cancels its own turn, claiming to be A: the cancel is recorded as B's
        forged_by_b = {"trace_id": private, "turn_id": "t1", "by": "backend-7", "reason": "mine"}
        await b.xadd(keys.backend_cancel("backend-8"), {CANCEL_FIELD: json.dumps(forged_by_b)})

        async def b_reply():
            got = await replies_of(b, b_replies)
            return got[0] if got else None

        ended = await wait_for(b_reply, what="backend-8's cancelled turn's reply on its own stream")
        assert (ended.trace_id, ended.turn_id, ended.code) == (private, "t1", FailureCode.CANCELLED), ended
        (cancel,) = [e for e in await events_of(store, private) if isinstance(e, CancelRequested)]
        assert cancel.by == "backend-8", cancel

        # each backend's own flow: a turn on its own stream, answered on its own replies stream
        await services.start("p2", "tool-worker")
        await b.xadd(keys.backend_turns_for("backend-8", private), turn_entry(trace_id=private, turn_id="t4"))
        await a.xadd(
            keys.backend_turns_for("backend-7", "backend-7:mine"), turn_entry(trace_id="backend-7:mine", turn_id="t5")
        )

        async def answered(client, stream, turn_id):
            return next((r for r in await replies_of(client, stream) if r.turn_id == turn_id), None)

        for client, stream, turn_id in ((b, b_replies, "t4"), (a, a_replies, "t5")):
            reply = await wait_for(
                functools.partial(answered, client, stream, turn_id), what=f"the answer of {turn_id}"
            )
            assert reply.status == "ended" and reply.answer == "The answer is 42.", reply
        assert [r.turn_id for r in await replies_of(b, b_replies)] == ["t1", "t4"]
    finally:
        await services.stop_all()
        for client in clients.values():
            await client.aclose()
        for user in users:
            await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_under_the_docs_acl_a_backend_decides_only_its_own_conversations_calls(
    redis7_url, namespace, scripted_model
):
    """Each backend's approvals stream (``<ns>:backends:<b>:approvals``, written under the docs'
    exact rule, no new ACL pattern): backend-7 knows backend-8's trace and call ids. Its approval
    of that call on its own stream is refused by the agent loop (reported, nothing decided), and
    its writes to backend-8's or the shared approvals stream are refused by Redis. backend-8's own
    approval runs the call, recorded as ``backend-8/<its by>``."""
    from agentstream.wire.events import ApprovalAwaited, ApprovalDecided
    from agentstream.wire.keys import APPROVAL_FIELD

    keys = Keys(namespace, 1, ("backend-7", "backend-8"))
    admin = aioredis.Redis.from_url(redis7_url)
    host_port = redis7_url.split("://", 1)[1]
    clients, users = await _acl_users(admin, namespace, host_port, ("backend-7", "backend-8"))
    a, b = clients["backend-7"], clients["backend-8"]
    private = "backend-8:pay"
    store = TraceStore(admin, keys)
    services = InProcess(
        apps.app,
        redis7_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}', "AGENTSTREAM_BACKENDS": "backend-7,backend-8"},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        turn = {"trace_id": private, "turn_id": "t1", "agent": "calc", "text": "What is 6 * 7?", "approval": ["*"]}
        await b.xadd(keys.backend_turns_for("backend-8", private), {TURN_FIELD: json.dumps(turn)})

        async def awaiting():
            return [e for e in await events_of(store, private) if isinstance(e, ApprovalAwaited)]

        (waiting,) = await wait_for(awaiting, what="backend-8's call awaiting approval")
        decision = {"trace_id": private, "call_id": waiting.call_id, "approved": True, "by": "backend-8"}
        await a.xadd(keys.backend_approvals("backend-7"), {APPROVAL_FIELD: json.dumps(decision)})
        await _refused_by_acl(
            [
                a.xadd(keys.backend_approvals("backend-8"), {APPROVAL_FIELD: json.dumps(decision)}),
                a.xadd(keys.approvals, {APPROVAL_FIELD: json.dumps(decision)}),
            ]
        )

        async def refused():
            return [e for e in await errors_of(admin, keys) if "refused (forbidden)" in e["error"]]

        (report,) = await wait_for(refused, what="the report of backend-7's refused approval")
        assert keys.backend_approvals("backend-7") in report["error"] and private in report["error"]
        assert not [e for e in await events_of(store, private) if isinstance(e, ApprovalDecided)]

        await b.xadd(keys.backend_approvals("backend-8"), {APPROVAL_FIELD: json.dumps({**decision, "by": "ana"})})

        async def answered():
            got = [codec.decode_reply(f[REPLY_FIELD]) for _, f in await b.xrange(keys.backend_replies("backend-8"))]
            return got[0] if got else None

        reply = await wait_for(answered, what="backend-8's approved turn's answer")
        assert reply.status == "ended" and reply.answer == "The answer is 42.", reply
        (decided,) = [e for e in await events_of(store, private) if isinstance(e, ApprovalDecided)]
        assert (decided.approved, decided.by) == (True, "backend-8/ana")
    finally:
        await services.stop_all()
        for client in clients.values():
            await client.aclose()
        for user in users:
            await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


def docs_services_acl(namespace: str) -> list[str]:
    """The rules the docs give the services' own Redis user, with the namespace put in."""
    match = re.search(
        r"The services themselves need every command on the namespace's keys \(a user with\s+`([^`]+)`",
        docs.page(ACL_PAGE),
    )
    assert match, "docs/how-to/acls.md gives no rule for the services' own user"
    return match.group(1).replace("agentstream:", f"{namespace}:").split()


async def test_the_services_answer_a_tool_using_turn_under_the_docs_acl_of_their_own_user(
    redis7_url, namespace, scripted_model
):
    """Every key a service touches on a turn's way (the work streams, their delivery counts, the
    agent loops' own wake-up streams, the trace, leases, replies) is inside the patterns the docs
    give the services' user: a key outside them is refused by Redis (NOPERM) and the turn never
    ends. The keys module promises every name starts with the namespace; this holds it to that."""
    admin = aioredis.Redis.from_url(redis7_url)
    user, password = f"services-{namespace}", "a-long-services-password"
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "resetkeys", *docs_services_acl(namespace)
    )
    host_port = redis7_url.split("://", 1)[1]
    services = InProcess(
        apps.app,
        f"redis://{user}:{password}@{host_port}",
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}', "AGENTSTREAM_PARTITIONS": "2"},
    )
    keys = Keys(namespace, 2)
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        for n in range(4):  # both partitions
            trace_id = f"conv-services-acl-{n}"
            turn = {"trace_id": trace_id, "turn_id": "t1", "agent": "calc", "text": "What is 6 * 7?"}
            await admin.xadd(keys.turns_for(trace_id), {TURN_FIELD: json.dumps(turn)})

        async def replies():
            got = [codec.decode_reply(f[REPLY_FIELD]) for _, f in await admin.xrange(keys.replies)]
            return got if len(got) == 4 else None

        got = await wait_for(replies, what="the four replies")
        assert [(r.status, r.answer) for r in got] == [("ended", "The answer is 42.")] * 4, got
        assert await errors_of(admin, keys) == []
        named = [k.decode() for k in await admin.keys(f"*{namespace}*")]  # the server may hold others' keys
        outside = [k for k in named if not k.startswith(f"{namespace}:")]
        assert outside == [], f"keys outside the namespace's pattern: {outside}"
    finally:
        await services.stop_all()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
