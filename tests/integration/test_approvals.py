"""Tool calls that wait for a person, on a real Redis with every service in a test bed: approve,
deny, edited arguments, the timeout, duplicates, hostile approval messages, and approvals
published before and after the agent loop restarts (issue 36 item 1)."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentstream import Agent, App, tool
from agentstream.runtime import operations
from agentstream.runtime.connection import connect
from agentstream.testing import FunctionModel, TestBed, call
from agentstream.wire.events import (
    ApprovalAwaited,
    ApprovalDecided,
    ApprovalMessage,
    ModelOutput,
    ToolOutput,
)
from agentstream.wire.keys import APPROVAL_FIELD

pytestmark = pytest.mark.integration

RUNS: list[tuple[str, int]] = []  # (tool, amount) of every run, in this process


@tool(needs_approval=True, approval_edits=True)
def pay(amount: int) -> str:
    """Pay an amount."""
    RUNS.append(("pay", amount))
    return f"paid {amount}"


@tool
def look(q: str) -> str:
    """Look something up."""
    RUNS.append(("look", 0))
    return f"found {q}"


@tool(needs_approval=True)
def wipe(path: str) -> str:
    """Wipe a path (its arguments may not be edited)."""
    RUNS.append(("wipe", 0))
    return f"wiped {path}"


def shop(timeout_s: float = 3600.0) -> App:
    return App(agents=[Agent(name="shop", system_prompt="S", tools=[pay, look, wipe], approval_timeout_s=timeout_s)])


def rule(request, info):
    """Pay 5 (and look something up) on the first call; then answer with what the tools said."""
    if not info.results:
        if "wipe" in info.user_text:
            return call("wipe", {"path": "/tmp"})
        return [call("pay", {"amount": 5}), call("look", {"q": "price"})]
    return " | ".join(r.text for r in info.results)


@pytest.fixture(autouse=True)
def _runs_cleared():
    RUNS.clear()
    yield
    RUNS.clear()


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


async def test_an_approved_call_runs_once_and_the_trace_says_who_approved_it(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        assert waiting.name == "pay" and waiting.editable
        await bed.run_until_idle()
        assert RUNS == []  # nothing ran, not even the call that needs no approval (they run together)
        assert not await bed._started()[0].exists(bed.keys.lease(turn.trace_id))  # no lease is held meanwhile
        decision = await bed.approve(turn.trace_id, waiting.call_id, by="ana", reason="fine")
        reply = await bed.reply(turn)
        events = await bed.trace(turn.trace_id)
    assert (decision.approved, decision.by, decision.reason) == (True, "ana", "fine")
    assert reply.status == "ended" and reply.answer == "paid 5 | found price"
    assert sorted(RUNS) == [("look", 0), ("pay", 5)]
    assert len(of(events, ApprovalDecided)) == 1 and len(of(events, ToolOutput)) == 2


async def test_a_denied_call_does_not_run_and_the_model_sees_an_error_result_with_the_reason(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        await bed.deny(turn.trace_id, waiting.call_id, by="bob", reason="over budget")
        reply = await bed.reply(turn)
        events = await bed.trace(turn.trace_id)
    assert RUNS == [("look", 0)]
    denied = next(r for r in of(events, ToolOutput) if r.name == "pay")
    assert denied.error == "denied" and "denied by bob" in denied.text and "over budget" in denied.text
    assert "denied by bob (over budget)" in reply.answer  # what the model was shown


async def test_an_approval_with_edited_arguments_runs_the_call_with_them(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        decision = await bed.approve(turn.trace_id, waiting.call_id, by="ana", arguments={"amount": 3})
        reply = await bed.reply(turn)
        events = await bed.trace(turn.trace_id)
    assert decision.arguments == '{"amount": 3}'
    assert ("pay", 3) in RUNS and ("pay", 5) not in RUNS
    # the model is told: its call keeps {"amount": 5} in the context, and the result says what ran
    assert reply.answer.startswith(
        '[A person approved this call with edited arguments; it ran with: {"amount": 3}]\npaid 3'
    )
    [made] = [c for o in of(events, ModelOutput) for c in o.tool_calls if c.name == "pay"]
    assert json.loads(made.arguments) == {"amount": 5}  # the trace keeps what the model asked for


async def test_an_edit_off_the_tools_schema_is_refused_and_the_call_still_awaits_a_decision(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        bad = ApprovalMessage(
            trace_id=turn.trace_id, call_id=waiting.call_id, approved=True, arguments='{"amount": "x"}'
        )
        await operations.publish_approval(bed._started()[0], bed.keys, bad)
        await bed.run_until_idle()
        errors = await errors_of(bed)
        assert of(await bed.trace(turn.trace_id), ApprovalDecided) == []  # the bad edit used up nothing
        await bed.approve(turn.trace_id, waiting.call_id, by="ana", arguments={"amount": 4})
        reply = await bed.reply(turn)
    assert len(errors) == 1 and "$.amount" in errors[0] and "do not match the tool's schema" in errors[0]
    assert "\npaid 4 |" in reply.answer and ("pay", "x") not in RUNS


async def test_a_call_nobody_decides_is_denied_at_its_timeout(redis_url):
    settings = {"watchdog_interval_ms": 200}
    async with TestBed(shop(timeout_s=0.5), model=FunctionModel(rule), redis_url=redis_url, settings=settings) as bed:
        turn = await bed.send("Pay 5")
        await bed.awaiting(turn.trace_id)
        reply = await bed.reply(turn, timeout_s=15)
        events = await bed.trace(turn.trace_id)
        due = await bed._started()[0].zcard(bed.keys.approvals_due())
    [decision] = of(events, ApprovalDecided)
    assert (decision.approved, decision.by, decision.timed_out) == (False, "timeout", True)
    assert "nobody approved it in time" in reply.answer and ("pay", 5) not in RUNS
    assert due == 0  # the trace left the approvals-due set


async def test_an_approval_published_twice_or_contradicted_is_recorded_once_and_runs_once(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        redis = bed._started()[0]
        for approved, by in [(True, "ana"), (True, "ana"), (False, "bob")]:
            message = ApprovalMessage(trace_id=turn.trace_id, call_id=waiting.call_id, approved=approved, by=by)
            await operations.publish_approval(redis, bed.keys, message)
        reply = await bed.reply(turn)
        late = await bed.deny(turn.trace_id, waiting.call_id, by="carol")  # after the turn: the first still stands
        events = await bed.trace(turn.trace_id)
    assert reply.status == "ended" and RUNS.count(("pay", 5)) == 1
    assert [(d.approved, d.by) for d in of(events, ApprovalDecided)] == [(True, "ana")]
    assert (late.approved, late.by) == (True, "ana")


async def errors_of(bed) -> list[str]:
    redis = bed._started()[0]
    return [fields[b"error"].decode() for _, fields in await redis.xrange(bed.keys.errors)]


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (b"{not json", "malformed approval"),
        (b'{"trace_id": "x", "call_id": "c", "approved": true, "by": "' + b"b" * 1000 + b'"}', "malformed approval"),
        (b'{"trace_id": "x", "call_id": "c", "approved": true, "pad": "' + b"p" * 600_000 + b'"}', "MAX_TURN_BYTES"),
        (b'{"trace_id": "nosuch", "call_id": "c1", "approved": true}', "does not await approval"),
    ],
)
async def test_a_hostile_approval_message_is_reported_and_decides_nothing(redis_url, payload, said):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        redis = bed._started()[0]
        await redis.xadd(bed.keys.approvals, {APPROVAL_FIELD: payload})
        await bed.run_until_idle()
        errors = await errors_of(bed)
    assert len(errors) == 1 and said in errors[0]


async def test_an_approval_naming_another_conversations_call_or_editing_a_locked_tool_is_refused(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        other = await bed.send("wipe it")
        [locked] = await bed.awaiting(other.trace_id)
        redis = bed._started()[0]
        for message in (
            # the call id of one conversation under another's trace id
            ApprovalMessage(trace_id=other.trace_id, call_id=waiting.call_id, approved=True, by="x"),
            ApprovalMessage(trace_id=other.trace_id, call_id=locked.call_id, approved=True, arguments='{"path": "/"}'),
        ):
            await operations.publish_approval(redis, bed.keys, message)
        await bed.run_until_idle()
        errors = await errors_of(bed)
        assert of(await bed.trace(other.trace_id), ApprovalDecided) == []
        assert of(await bed.trace(turn.trace_id), ApprovalDecided) == []
        await bed.deny(turn.trace_id, waiting.call_id)
        await bed.deny(other.trace_id, locked.call_id)
        await bed.reply(turn)
        await bed.reply(other)
    assert len(errors) == 2
    assert "does not await approval" in errors[0] and "does not let its arguments be edited" in errors[1]
    assert ("wipe", 0) not in RUNS


@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_approval_published_before_or_after_the_agent_loop_restarts_runs_the_call_once(redis_url, when):
    app = shop()
    namespace = f"test-restart-{when}"
    async with TestBed(app, model=FunctionModel(rule), redis_url=redis_url, namespace=namespace) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        await bed.run_until_idle()
        keys = bed.keys
    # every service is stopped: nothing holds the call, the trace says it waits
    message = ApprovalMessage(trace_id=turn.trace_id, call_id=waiting.call_id, approved=True, by="ana")
    redis = connect(redis_url)
    try:
        assert not await redis.exists(keys.lease(turn.trace_id))
        if when == "before":
            await operations.publish_approval(redis, keys, message)
    finally:
        await redis.aclose()
    assert RUNS == []
    async with TestBed(app, model=FunctionModel(rule), redis_url=redis_url, namespace=namespace) as bed:
        if when == "after":
            await operations.publish_approval(bed._started()[0], bed.keys, message)
        reply = await bed.reply(turn, timeout_s=20)
        events = await bed.trace(turn.trace_id)
    assert reply.status == "ended" and RUNS.count(("pay", 5)) == 1
    assert len(of(events, ApprovalAwaited)) == 1 and len(of(events, ApprovalDecided)) == 1


async def test_the_tool_worker_refuses_a_job_of_a_call_that_awaits_approval(redis_url):
    from agentstream.runtime.store import TraceStore

    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url) as bed:
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        store = TraceStore(bed._started()[0], bed.keys)
        state = await store.begin_call(
            turn.trace_id, waiting.turn_id, waiting.call_id, "forged/1-0", name="pay", arguments='{"amount": 5}'
        )
        assert "awaits a person's approval" in state.problem
        await bed.deny(turn.trace_id, waiting.call_id)
        await bed.reply(turn)
        state = await store.begin_call(
            turn.trace_id, waiting.turn_id, waiting.call_id, "forged/2-0", name="pay", arguments='{"amount": 5}'
        )
        assert "awaits a person's approval, or was denied it" in state.problem
    assert ("pay", 5) not in RUNS
    await asyncio.sleep(0)


async def test_the_how_to_example_runs_as_written(redis_url):
    from tests.support import docs

    [code] = docs.blocks(docs.page("how-to/approvals.md"), "python")
    module: dict = {}
    exec(
        compile(code.replace("TestBed(app,", f"TestBed(app, redis_url={redis_url!r},"), "approvals.md", "exec"), module
    )
    await module["test_a_large_payment_waits_for_a_person"]()


APP = shop()  # for the CLI's --app


def invoke(args: list[str], env: dict[str, str]):
    from typer.testing import CliRunner

    from agentstream.cli.commands import cli

    return CliRunner().invoke(cli, args, env=env)


async def test_the_cli_approves_and_denies_and_trace_show_and_explain_say_who_decided(redis_url):
    async with TestBed(APP, model=FunctionModel(rule), redis_url=redis_url) as bed:
        env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": bed.namespace, "USER": "ops"}
        turn = await bed.send("Pay 5")
        [waiting] = await bed.awaiting(turn.trace_id)
        unknown = await asyncio.to_thread(invoke, ["approve", turn.trace_id, "nosuch", "--wait-s", "0"], env)
        not_object = await asyncio.to_thread(
            invoke, ["approve", turn.trace_id, waiting.call_id, "--arguments", "[1]", "--wait-s", "0"], env
        )
        # an edit the agent loop would refuse is refused here, by the same rule, before it is published
        # (it used to be published, refused on the errors stream, and waited for 30 s)
        off_schema = await asyncio.to_thread(
            invoke, ["approve", turn.trace_id, waiting.call_id, "--arguments", '{"amount": "lots"}'], env
        )
        extra = await asyncio.to_thread(
            invoke, ["approve", turn.trace_id, waiting.call_id, "--arguments", '{"amount": 1, "x": 1}'], env
        )
        long_reason = await asyncio.to_thread(
            invoke, ["deny", turn.trace_id, waiting.call_id, "--reason", "x" * 3000, "--wait-s", "0"], env
        )
        probe = connect(redis_url)
        try:
            published_before = await probe.xlen(bed.keys.approvals)
        finally:
            await probe.aclose()
        approved = await asyncio.to_thread(
            invoke,
            ["approve", turn.trace_id, waiting.call_id, "--reason", "looks right", "--arguments", '{"amount": 4}'],
            env,
        )
        again = await asyncio.to_thread(invoke, ["deny", turn.trace_id, waiting.call_id, "--wait-s", "1"], env)
        await bed.reply(turn)
        shown = await asyncio.to_thread(invoke, ["trace", "show", turn.trace_id], env)
        explained = await asyncio.to_thread(
            invoke,
            ["trace", "explain", turn.trace_id, "--step", "1", "--app", "tests.integration.test_approvals:APP"],
            {**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_MODEL": "m"},  # nothing is sent
        )
    assert unknown.exit_code != 0 and "holds no call 'nosuch' awaiting approval" in unknown.output
    assert approved.exit_code == 0, approved.output
    assert "approved by ops, with arguments" in approved.output and "looks right" in approved.output
    assert again.exit_code == 1 and "was decided already" in again.output  # the first decision stands
    assert ("pay", 4) in RUNS
    assert "awaits approval (tool 'pay' asks approval for every call)" in shown.output, shown.output
    assert "approved by ops" in shown.output
    assert "who decided what, and when" in explained.output, explained.output
    assert "approved by ops" in explained.output
    assert not_object.exit_code == 2 and "must hold a JSON object" in not_object.output
    assert off_schema.exit_code == 2 and "do not match the tool's schema at $.amount" in off_schema.output
    assert extra.exit_code == 2 and "do not match the tool's schema" in extra.output, extra.output
    assert published_before == 0  # neither refused edit reached the approvals stream
    assert long_reason.exit_code == 2 and "--reason: Expected `str` of length <= 2000" in long_reason.output


GATEWAY_KEYS = {
    "shop": "ask_test-shopkey-0123456789abcdef0123456789abcdef",
    "calc": "ask_test-calckey-0123456789abcdef0123456789abcdef",
}


async def test_the_gateway_approves_under_the_key_scopes_with_the_keys_name(redis_url):
    import httpx

    from agentstream.ops.apikeys import hash_key, load_keys
    from agentstream_services.gateway.api import create_api
    from agentstream_services.gateway.settings import GatewaySettings
    from tests.support.gateway import auth

    document = json.dumps(
        {"keys": [{"name": n, "sha256": hash_key(k), "agents": [n]} for n, k in GATEWAY_KEYS.items()]}
    )
    async with TestBed(APP, model=FunctionModel(rule), redis_url=redis_url) as bed:
        api = create_api(APP, bed.config, GatewaySettings(keys=document), bed._started()[1], load_keys(text=document))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gateway") as client:
            turn = await bed.send("Pay 5")
            [waiting] = await bed.awaiting(turn.trace_id)
            path = f"/v1/traces/{turn.trace_id}/approvals"
            shop, calc = auth(GATEWAY_KEYS["shop"]), auth(GATEWAY_KEYS["calc"])
            body = {"call_id": waiting.call_id, "approved": True, "reason": "ok", "arguments": {"amount": 2}}
            refusals = {
                "no key": await client.post(path, json=body),
                "another agent's key": await client.post(path, json=body, headers=calc),
                "unknown call": await client.post(path, json={**body, "call_id": "nosuch"}, headers=shop),
                "not an object": await client.post(path, json={**body, "arguments": [1]}, headers=shop),
                "unknown field": await client.post(path, json={**body, "by": "someone else"}, headers=shop),
                # not read as true: the stream's decoder refuses it too
                "approved as text": await client.post(path, json={**body, "approved": "yes"}, headers=shop),
                "oversized reason": await client.post(path, json={**body, "reason": "r" * 3000}, headers=shop),
                # the tool's schema says an integer: refused before anything is decided
                "edit off schema": await client.post(path, json={**body, "arguments": {"amount": "all"}}, headers=shop),
                "malformed": await client.post(
                    path, content=b"{nope", headers={**shop, "Content-Type": "application/json"}
                ),
            }
            accepted = await client.post(path, json=body, headers=shop)
            reply = await bed.reply(turn)
            twice = await client.post(path, json=body, headers=shop)
            events = await bed.trace(turn.trace_id)
    assert {k: r.status_code for k, r in refusals.items()} == {
        "no key": 401,
        "another agent's key": 404,
        "unknown call": 404,
        "not an object": 422,
        "unknown field": 422,
        "approved as text": 422,
        "oversized reason": 422,
        "edit off schema": 422,
        "malformed": 422,
    }, {k: r.text[:200] for k, r in refusals.items()}
    assert "$.amount" in refusals["edit off schema"].json()["detail"]
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["by"] == "gateway:shop"
    [decided] = of(events, ApprovalDecided)
    assert (decided.by, decided.approved, decided.arguments, decided.reason) == (
        "gateway:shop",
        True,
        '{"amount": 2}',
        "ok",
    )
    assert reply.answer.endswith('{"amount": 2}]\npaid 2 | found price') and RUNS.count(("pay", 2)) == 1
    assert twice.status_code == 409 and "that decision stands" in twice.json()["detail"]
