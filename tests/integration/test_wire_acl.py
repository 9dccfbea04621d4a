"""The README's Redis ACL for a backend, exercised as written (issue 11): a backend user that may
only XADD to the turns and cancel streams and read its own replies stream gets its answer, and
is refused everything else. A Redis 7 server of its own (ACL rules change server state)."""

from __future__ import annotations

import json
import re

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from agentstream.wire import codec
from agentstream.wire.keys import CANCEL_FIELD, REPLY_FIELD, TURN_FIELD, WAKE_FIELD, Keys
from tests.support import apps, docs
from tests.support.inprocess import InProcess, wait_for

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
    keys = Keys(namespace)
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
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    mine = f"{keys.replies}:backend-7"
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        turn = {"trace_id": "conv-acl", "turn_id": "t1", "agent": "calc", "text": "What is 6 * 7?", "reply_to": mine}
        await backend.xadd(keys.turns, {TURN_FIELD: json.dumps(turn)})

        async def my_reply():
            got = await backend.xread({mine: "0"}, count=10, block=100)
            return got[0][1] if got else None

        ((_, fields),) = await wait_for(my_reply, what="the backend's reply")
        reply = codec.decode_reply(fields[REPLY_FIELD])
        assert reply.status == "ended" and reply.answer == "The answer is 42.", reply
        await backend.xadd(keys.cancel, {CANCEL_FIELD: json.dumps({"trace_id": "conv-acl"})})
        assert await backend.ping()

        refused = [
            backend.xadd(keys.wake, {WAKE_FIELD: b'{"trace_id":"conv-acl"}'}),  # another work stream
            backend.xadd(keys.tools("default"), {b"job": b"{}"}),
            backend.xadd(mine, {REPLY_FIELD: b"{}"}),  # forge a reply
            backend.xadd(keys.trace("conv-acl"), {b"e": b"{}"}),  # write a trace
            backend.xrange(keys.trace("conv-acl")),  # read a conversation
            backend.xrange(keys.replies),  # read others' replies
            backend.xrange(f"{keys.replies}:backend-8"),
            backend.xrange(keys.turns),  # read others' turns
            backend.delete(keys.turns),
            backend.hgetall(keys.trace_keys("conv-acl")),
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


async def test_two_backends_under_the_readme_acl(redis7_url, namespace, scripted_model):
    """Issue 33, item 2: two backends, each with the README's exact rule for its own replies
    stream. Every direct access to the other's replies stream or conversation is refused; what
    the README says the ACL does not separate (the shared turns and cancel streams) is shown too,
    so the README's sentence stays true."""
    keys = Keys(namespace)
    admin = aioredis.Redis.from_url(redis7_url)
    host_port = redis7_url.split("://", 1)[1]
    clients, users = {}, []
    for name in ("backend-7", "backend-8"):
        rules = [r.replace("backend-7", name) for r in readme_acl(namespace)]
        user, password = f"{name}-{namespace}", next(r[1:] for r in rules if r.startswith(">"))
        await admin.execute_command("ACL", "SETUSER", user, *rules[1:])
        users.append(user)
        clients[name] = aioredis.Redis.from_url(f"redis://{user}:{password}@{host_port}")
    a, b = clients["backend-7"], clients["backend-8"]
    mine, theirs = f"{keys.replies}:backend-7", f"{keys.replies}:backend-8"
    services = InProcess(
        apps.app,
        redis7_url,
        namespace,
        scripted_model.base_url,
        env={"AGENTSTREAM_DEFAULT_MODEL_OPTIONS": '{"stream": false}'},
    )
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        turn = {"trace_id": "b-private", "turn_id": "t1", "agent": "calc", "text": "What is 6 * 7?", "reply_to": theirs}
        await b.xadd(keys.turns, {TURN_FIELD: json.dumps(turn)})

        async def b_reply():
            got = await b.xread({theirs: "0"}, count=10, block=100)
            return got[0][1] if got else None

        await wait_for(b_reply, what="backend-8's reply")
        for attempt in [
            a.xrange(theirs),  # read the other's replies
            a.xread({theirs: "0"}),
            a.xadd(theirs, {REPLY_FIELD: b"{}"}),  # forge a reply into the other's stream
            a.xadd(mine, {REPLY_FIELD: b"{}"}),  # or into its own
            a.xrange(keys.trace("b-private")),  # read the other's conversation
            a.hgetall(keys.trace_keys("b-private")),
            a.xrange(keys.turns),  # read the other's turns
            a.xrange(keys.cancel),  # read the other's cancels
            b.xrange(mine),  # and the other way round
            b.xadd(mine, {REPLY_FIELD: b"{}"}),
        ]:
            with pytest.raises((NoPermissionError, ResponseError)) as caught:
                await attempt
            assert "NOPERM" in str(caught.value) or "permission" in str(caught.value).lower(), caught.value
        # what the README says the ACL does not separate: the shared turns stream (a turn into the
        # other's conversation, answered on its own replies stream), the shared cancel stream
        intruding = {**turn, "turn_id": "t2", "reply_to": mine}
        await a.xadd(keys.turns, {TURN_FIELD: json.dumps(intruding)})

        async def a_reply():
            got = await a.xread({mine: "0"}, count=10, block=100)
            return got[0][1] if got else None

        ((_, fields),) = await wait_for(a_reply, what="backend-7's reply in backend-8's conversation")
        assert codec.decode_reply(fields[REPLY_FIELD]).trace_id == "b-private"
        assert await a.xadd(keys.cancel, {CANCEL_FIELD: json.dumps({"trace_id": "b-private", "by": "backend-8"})})
    finally:
        await services.stop_all()
        for client in clients.values():
            await client.aclose()
        for user in users:
            await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
