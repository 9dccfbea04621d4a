"""The CLI's failures are one clean line and exit code 2; `trace verify` and `trace explain`
rebuild with the configured endpoint settings and agree; `agentstream dev` prints what another
shell needs; `ask` rides out a Redis restart."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.exceptions
from typer.testing import CliRunner

from agentstream import codec
from agentstream import cli as cli_module
from agentstream.cli import cli, environment_lines
from agentstream.compacting import sent_request
from agentstream.deltas import follow
from agentstream.events import ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnInput
from agentstream.keys import Keys
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint, Quirks
from tests.support import apps

pytestmark = pytest.mark.integration

APP = ["--app", "tests.support.apps:app"]


def invoke(args, env):
    result = CliRunner().invoke(cli, args, env=env)
    return result


@pytest.mark.parametrize("command", [["trace", "show", "x"], ["trace", "verify", "x", *APP], ["trace", "explain", "x", "--step", "0", *APP]])
@pytest.mark.parametrize(
    "url, says",
    [
        (None, "REDIS_URL is not set"),
        ("not-a-url", "is not a Redis URL"),
        ("redis://127.0.0.1:notaport", "is not a Redis URL"),
        ("redis://:hunter2@127.0.0.1:1", "cannot reach Redis at redis://:***@127.0.0.1:1"),
    ],
)
def test_trace_commands_fail_with_one_line_when_redis_is_not_reachable(command, url, says, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    result = invoke(command, {"REDIS_URL": url} if url else {})
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert "hunter2" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_verify_of_a_missing_trace_fails_like_show(redis_url, namespace):
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace}
    for command in (["trace", "show", "nope"], ["trace", "verify", "nope", *APP]):
        result = invoke(command, env)
        assert result.exit_code == 2 and "trace 'nope' has no events" in result.output, result.output


def test_bad_option_values_are_refused():
    assert invoke(["ask", "hi", "--timeout-s", "0"], {}).exit_code == 2
    assert invoke(["ask", "hi", "--timeout-s", "-5"], {}).exit_code == 2
    result = invoke(["serve", "tool-worker", "--queue", ""], {})
    assert result.exit_code == 2 and "queue name cannot be empty" in result.output


LLAMA_LIKE = Quirks(tool_call_content="null", required_tool_choice="named", stream_tools="forced")


async def test_explain_and_verify_rebuild_with_the_configured_endpoint_and_agree(store, redis_url, namespace):
    options = {"stream": False, "window_tokens": 16000, "quirks": LLAMA_LIKE.model_dump(exclude_defaults=True)}
    endpoint = ModelEndpoint(id="default", provider="openai", base_url="http://127.0.0.1:9/v1", model="m",
                             stream=False, window_tokens=16000, quirks=LLAMA_LIKE)
    calc = apps.app.agent("calc")
    from agentstream.delegation import offered_agent

    turn = TurnInput(turn_id="t1", agent="calc", text="what is 2 + 3?")
    agent = offered_agent(calc, turn, {"default": endpoint})
    events: list = [turn]
    for step, output in enumerate([
        ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="calculator", arguments='{"expression": "2+3"}'),)),
        ModelOutput(turn_id="t1", step=1, content="5"),
    ]):
        body = formats.request_body(sent_request(events, agent, turn_id="t1", step=step), endpoint)
        events.append(type(output)(**{**{f: getattr(output, f) for f in output.__struct_fields__}, "request_sha256": formats.fingerprint(body)}))
        if step == 0:
            events.append(ToolOutput(turn_id="t1", call_id="c1", name="calculator", text="5"))
    events.append(TurnEnded(turn_id="t1", answer="5"))
    for event in events:
        await store.append("q", event)
    env = {"REDIS_URL": redis_url, "AGENTSTREAM_NAMESPACE": namespace, "OPENAI_BASE_URL": endpoint.base_url,
           "OPENAI_MODEL": "m", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps(options)}
    verified = await asyncio.to_thread(invoke, ["trace", "verify", "q", *APP], env)
    assert verified.exit_code == 0, verified.output
    explained = await asyncio.to_thread(invoke, ["trace", "explain", "q", "--step", "1", "--turn", "t1", *APP], env)
    assert explained.exit_code == 0 and " matches the recorded" in explained.output, explained.output
    assert '"content": null' in explained.output  # the body as sent (the endpoint's quirk), not the default one

    # without the quirks, both say so, and which settings they used
    plain = {k: v for k, v in env.items() if k != "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"}
    verified = await asyncio.to_thread(invoke, ["trace", "verify", "q", *APP], plain)
    assert verified.exit_code == 1 and "rebuilt with endpoint 'default'" in verified.output, verified.output
    assert "AGENTSTREAM_DEFAULT_MODEL_OPTIONS" in verified.output
    explained = await asyncio.to_thread(invoke, ["trace", "explain", "q", "--step", "1", "--turn", "t1", *APP], plain)
    assert "DOES NOT match" in explained.output and "quirks default" in explained.output, explained.output


def test_dev_prints_the_environment_another_shell_needs(monkeypatch, redis_url):
    served = []

    async def no_services(services, app_path, queues, settings):
        served.append(settings)

    monkeypatch.setattr(cli_module, "_serve", no_services)
    options = json.dumps({"quirks": {"tool_call_content": "null"}})
    env = {"REDIS_URL": redis_url, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_MODEL": "smol model",
           "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": options}
    result = invoke(["dev", *APP], env)
    assert result.exit_code == 0 and served, result.output
    lines = result.output.splitlines()
    assert f"export REDIS_URL={redis_url}" in lines
    assert "export OPENAI_BASE_URL=http://127.0.0.1:9/v1" in lines
    assert "export OPENAI_MODEL='smol model'" in lines
    assert f"export AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{options}'" in lines
    assert environment_lines({"REDIS_URL": "redis://x"}) == ["export REDIS_URL=redis://x"]


class FlakyRedis:
    """A client whose reads fail (a Redis restart) before they return the turn's ending."""

    def __init__(self, keys: Keys, trace_id: str, failures: int):
        self.keys, self.trace_id, self.failures, self.reads = keys, trace_id, failures, 0

    async def xread(self, positions, block, count):
        self.reads += 1
        if self.reads <= self.failures:
            raise redis.exceptions.ConnectionError("Connection refused")
        assert positions[self.keys.trace(self.trace_id)] == "5-0"  # the same position after the outage
        return [(self.keys.trace(self.trace_id).encode(), [(b"6-0", codec.encode_entry(TurnEnded(turn_id="t", answer="ok")))])]


async def test_following_a_turn_rides_out_a_redis_restart():
    keys = Keys("k")
    flaky = FlakyRedis(keys, "c", failures=3)
    items = []
    async for item in follow(flaky, keys, "c", after="5-0", block_ms=10, outage_s=30):  # type: ignore[arg-type]
        items.append(item)
        break
    assert isinstance(items[0].event, TurnEnded) and flaky.reads == 4
    with pytest.raises(redis.exceptions.ConnectionError):  # without outage_s, as before: the error at once
        async for _ in follow(FlakyRedis(keys, "c", failures=3), keys, "c", after="5-0", block_ms=10):  # type: ignore[arg-type]
            pass
