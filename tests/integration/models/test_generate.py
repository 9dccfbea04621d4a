"""Structured generation against a failure-injecting OpenAI-compatible server."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pydantic
import pytest

from agentstream.errors import ConfigError, InvalidModelOutput, ModelConfigError, ModelInputRejected, ModelUnanswered
from agentstream.models.generate import Generator, generator
from tests.support.fault_server import FaultServer, Reply, chat

KEY = "sk-gen-secret-99887766"


class Plan(pydantic.BaseModel):
    steps: list[str]
    risky: bool


PLAN_SCHEMA = {
    "type": "object",
    "properties": {"steps": {"type": "array", "items": {"type": "string"}}, "risky": {"type": "boolean"}},
    "required": ["steps", "risky"],
    "additionalProperties": False,
}


def gen(server: FaultServer, **kw) -> Generator:
    async def no_wait(_s):
        return None

    g = generator(server.base_url, "gen-model", KEY, retries=2, **kw)
    g.model.sleep = no_wait
    return g


async def test_text_and_validated_values_and_the_record():
    good = json.dumps({"steps": ["read", "write"], "risky": False})
    with FaultServer([chat("SELECT 1;"), chat(good), chat("```json\n" + good + "\n```")]) as server:
        g = gen(server)
        text = await g.generate("Write one query.")
        plan = await g.generate(
            [{"role": "system", "content": "Plan."}, {"role": "user", "content": "Plan it."}], schema=Plan
        )
        checked = await g.generate("Plan it.", schema=PLAN_SCHEMA)
        await g.model.aclose()
    assert text.value == "SELECT 1;" and plan.value == Plan(steps=["read", "write"], risky=False)
    assert checked.value == {"steps": ["read", "write"], "risky": False}
    (output,) = plan.outputs
    assert output.request_sha256 == hashlib.sha256(server.requests[1].raw).hexdigest()
    assert output.model == "gen-model" and output.stop_reason == "stop" and output.content == good
    assert server.requests[1].json["messages"][0] == {"role": "system", "content": "Plan."}
    for request in server.requests:
        assert request.headers["authorization"] == f"Bearer {KEY}"
    recorded = msgspec.json.encode([a.output for a in plan.attempts + checked.attempts])
    assert KEY.encode() not in recorded  # the key is never recorded
    assert g.recheck(output, plan.value, schema=Plan) == []  # replay reads the recorded reply again
    assert g.recheck(output, Plan(steps=[], risky=True), schema=Plan)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (chat(None, refusal="I can't help with that."), "refused"),
        (chat(None, finish="content_filter"), "content filter"),
        (chat('{"steps": ["a", "b"', finish="length"), "cut off"),
        (chat("", finish="stop"), "empty"),
        (chat("Sure! Here is the plan: steps a, b."), "not JSON"),
        (chat('{"steps": ["a\\ud800"], "risky": false}'), "not Unicode JSON.*lone high UTF-16 surrogate"),
        (chat('{"steps": "a", "risky": false}'), "does not match the schema"),
        (chat('{"steps": [], "risky": false, "extra": 1}'), "does not match the schema"),
        (chat('{"steps": []}', finish="eos"), "does not know"),
    ],
)
async def test_rejected_replies_raise_with_the_reason_and_are_never_repaired(reply, reason):
    with FaultServer([reply]) as server:
        g = gen(server)
        with pytest.raises(InvalidModelOutput, match=reason) as info:
            await g.generate("Plan it.", schema=PLAN_SCHEMA)
        await g.model.aclose()
    assert len(server.requests) == 1  # an invalid reply is not asked again here
    assert info.value.output.request_sha256  # the reply is still on record


async def test_parse_functions_decide_too():
    with FaultServer([chat("answer: 42"), chat("no number here")]) as server:
        g = gen(server)
        number = await g.generate("n?", parse=lambda t: int(t.split(":")[1]) if ":" in t else None)
        with pytest.raises(InvalidModelOutput, match="parse function found no value"):
            await g.generate("n?", parse=lambda t: int(t.split(":")[1]) if ":" in t else None)
        await g.model.aclose()
    assert number.value == 42


async def test_retries_and_escalations():
    with FaultServer(
        [Reply(status=429, body={}, headers={"retry-after": "1"}), Reply(status=503, body={}), chat("ok")]
    ) as server:
        g = gen(server)
        assert (await g.generate("hi")).value == "ok"
        await g.model.aclose()
    assert len(server.requests) == 3
    for status, error in (
        (400, ModelInputRejected),
        (413, ModelInputRejected),
        (422, ModelInputRejected),
        (401, ModelConfigError),
        (404, ModelConfigError),
        (500, ModelUnanswered),
    ):
        with FaultServer([Reply(status=status, body={"error": {"message": KEY}})], repeat_last=True) as server:
            g = gen(server)
            with pytest.raises(error) as info:
                await g.generate("hi")
            await g.model.aclose()
        assert isinstance(info.value, ModelUnanswered) or status in (401, 404)
        assert KEY not in str(info.value)


async def test_sampling_k_replies():
    replies = [chat('{"steps": ["a"], "risky": false}'), chat("not json"), chat('{"steps": ["c"], "risky": true}')]
    with FaultServer(replies) as server:
        g = gen(server, workers=1)
        sampled = await g.sample("Plan it.", k=3, temperature=0.9, schema=Plan)
        await g.model.aclose()
    assert sampled.value == [Plan(steps=["a"], risky=False), None, Plan(steps=["c"], risky=True)]
    assert sampled.attempts[1].error and "not JSON" in sampled.attempts[1].error
    bodies = server.bodies()
    assert [(b["temperature"], b.get("seed")) for b in bodies] == [(0.0, None), (0.9, 1), (0.9, 2)]
    with FaultServer([chat("x")], repeat_last=True) as server:
        g = gen(server)
        with pytest.raises(InvalidModelOutput) as info:
            await g.sample("Plan it.", k=2, schema=Plan)
        await g.model.aclose()
    assert "all 2 replies failed" in str(info.value.__notes__)


async def test_response_formats_and_refused_extra_fields():
    with FaultServer([chat('{"steps": [], "risky": false}')] * 2) as server:
        g = gen(server, response_format="json_schema")
        await g.generate("Plan it.", schema=Plan, seed=7)
        g2 = gen(server, response_format="json_object")
        await g2.generate("Plan it.", schema=PLAN_SCHEMA)
        await g.model.aclose()
        await g2.model.aclose()
    first, second = server.bodies()
    assert first["response_format"]["type"] == "json_schema" and first["response_format"]["json_schema"]["schema"][
        "required"
    ] == ["steps", "risky"]
    assert first["seed"] == 7 and second["response_format"] == {"type": "json_object"}
    for field in ("model", "messages", "temperature", "max_tokens", "seed", "response_format", "stream"):
        with pytest.raises(ConfigError, match=field):
            generator("http://127.0.0.1:9/v1", "m", extra_body={field: 1})
    generator("http://127.0.0.1:9/v1", "m", extra_body={"reasoning": {"effort": "low"}})  # fine
    with pytest.raises(ConfigError, match="not valid"):
        g = generator("http://127.0.0.1:9/v1", "m")
        g.read("{}", schema={"type": "no-such-type"})


async def test_given_a_trace_each_reply_is_recorded_there_accepted_or_not(store):
    from tests.support.inprocess import events_of

    good = json.dumps({"steps": ["read"], "risky": False})
    with FaultServer([chat(good), chat("not json"), chat(good), chat("nope"), chat(good)]) as server:
        g = gen(server)
        one = await g.generate("Plan it.", schema=Plan, trace=store, trace_id="gen-1", turn_id="g1")
        with pytest.raises(InvalidModelOutput):
            await g.generate("Plan it.", schema=Plan, trace=store, trace_id="gen-1", turn_id="g2")
        many = await g.sample("Plan it.", k=3, schema=Plan, trace=store, trace_id="gen-2", turn_id="s1")
        with pytest.raises(ValueError, match="trace_id"):
            await g.generate("Plan it.", trace=store)
        await g.model.aclose()
    first = await events_of(store, "gen-1")
    assert [(e.turn_id, e.content) for e in first] == [("g1", good), ("g2", "not json")]
    assert first[0] == one.outputs[0]
    sampled = await events_of(store, "gen-2")
    assert [(e.turn_id, e.step) for e in sampled] == [("s1", 0), ("s1", 1), ("s1", 2)]
    assert [e.request_sha256 for e in sampled] == [o.request_sha256 for o in many.outputs]
