"""Against a server nobody here wrote: llama.cpp's OpenAI-compatible server (llama-cpp-python)
with the local SmolLM2-135M model, streaming and not, with the quirks it needs (see
``agentstream.cli.localmodel.LLAMA_CPP_QUIRKS``) checked to be real: each quirk's absence fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from agentstream.cli.localmodel import LLAMA_CPP_QUIRKS, LocalModelServer
from agentstream.context.request import AssistantMessage, ChatRequest, ToolDefinition, ToolResultMessage, UserMessage
from agentstream.errors import ConfigError, ModelUnanswered
from agentstream.models import build_model, formats
from agentstream.models.endpoints import ModelEndpoint, Quirks
from agentstream.runtime.deltas import PartialReplies
from agentstream.wire.deltas import ListSink
from agentstream.wire.events import ToolCall
from tests.support.procs import ROOT

pytestmark = [pytest.mark.local_model, pytest.mark.integration, pytest.mark.slow]

CALC = ToolDefinition(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


@pytest.fixture(scope="module")
def llama():
    server = LocalModelServer(n_ctx=2048)
    try:
        server.start()
    except ConfigError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


def model_on(llama, *, stream: bool, retries: int = 0, **quirks):
    endpoint = ModelEndpoint(
        id="local",
        provider="openai",
        base_url=llama.base_url,
        model=llama.model,
        stream=stream,
        quirks=Quirks(**{**LLAMA_CPP_QUIRKS, **quirks}),
    )
    return build_model(endpoint, retries=retries, timeout_s=120)


HELLO = ChatRequest(
    system="You are brief.",
    messages=(UserMessage(text="Say hello to Ada in one short sentence."),),
    max_output_tokens=24,
)


async def test_a_reply_without_streaming(llama):
    model = model_on(llama, stream=False)
    sink = ListSink()
    output = await model.complete(HELLO, turn_id="t", step=0, deltas=sink)
    await model.aclose()
    assert output.content.strip() and output.stop_reason in ("stop", "length")
    assert output.request_sha256 == formats.fingerprint(formats.request_body(HELLO, model.endpoint))
    assert output.usage.completion_tokens and output.model == llama.model
    assert sink.deltas == []  # a whole answer publishes no delta: its ModelOutput is in the trace


async def test_a_streamed_reply_arrives_token_by_token(llama):
    model = model_on(llama, stream=True)
    sink = ListSink()
    output = await model.complete(HELLO, turn_id="t", step=0, deltas=sink)
    await model.aclose()
    texts = [d.text for d in sink.deltas if d.kind == "text"]
    assert len(texts) >= 2 and "".join(texts) == output.content  # pieces, in order, add up to the reply
    assert {d.attempt for d in sink.deltas} == {output.attempt_id}
    partial = PartialReplies()
    for d in sink.deltas:
        partial.feed(d)
    assert partial.get("t", 0).done and partial.get("t", 0).text == output.content


async def test_a_forced_tool_call_streams_and_its_arguments_are_kept_as_written(llama):
    request = ChatRequest(
        system="Use the calculator.",
        messages=(UserMessage(text="What is 17 * 23?"),),
        tools=(CALC,),
        tool_choice="required",
        max_output_tokens=48,
    )
    model = model_on(llama, stream=True)
    assert formats.streams(request, model.endpoint)  # one tool forced by name: llama.cpp streams it
    sink = ListSink()
    output = await model.complete(request, turn_id="t", step=0, deltas=sink)
    await model.aclose()
    (tool_call,) = output.tool_calls
    assert tool_call.name == "calculator" and output.stop_reason in ("tool_calls", "length")
    pieces = [d for d in sink.deltas if d.kind == "tool_call"]
    assert "".join(d.text for d in pieces) == tool_call.arguments  # the raw text, even if it is not JSON


async def test_the_llama_cpp_quirks_are_real(llama):
    history = ChatRequest(
        system="Answer briefly.",
        max_output_tokens=16,
        messages=(
            UserMessage(text="What is 17 * 23?"),
            AssistantMessage(tool_calls=(ToolCall(id="c1", name="calculator", arguments='{"expression": "17*23"}'),)),
            ToolResultMessage(call_id="c1", name="calculator", text="391"),
        ),
    )
    # a null content beside tool calls: HTTP 500; the empty string the quirk sends: fine
    broken = model_on(llama, stream=False, tool_call_content="null")
    with pytest.raises(ModelUnanswered) as info:
        await broken.complete(history, turn_id="t", step=1)
    await broken.aclose()
    assert info.value.status_code == 500
    fine = model_on(llama, stream=False)
    assert (await fine.complete(history, turn_id="t", step=1)).stop_reason in ("stop", "length")
    # tool choice "required" as OpenAI spells it: HTTP 500; sent as the one tool by name: a call
    forced = ChatRequest(
        system="S",
        messages=(UserMessage(text="What is 2+2?"),),
        tools=(CALC,),
        tool_choice="required",
        max_output_tokens=32,
    )
    spelled = model_on(llama, stream=False, required_tool_choice="required")
    with pytest.raises(ModelUnanswered) as info:
        await spelled.complete(forced, turn_id="t", step=0)
    await spelled.aclose()
    assert info.value.status_code == 500
    assert (await fine.complete(forced, turn_id="t", step=0)).tool_calls
    # streaming with tool choice "auto": an empty stream (no finish), never taken for a reply
    auto = ChatRequest(system="S", messages=(UserMessage(text="What is 2+2?"),), tools=(CALC,), max_output_tokens=32)
    streams_all = model_on(llama, stream=True, stream_tools="always", retries=1)
    with pytest.raises(ModelUnanswered, match="ended before the reply finished|Error"):
        await streams_all.complete(auto, turn_id="t", step=0)
    await streams_all.aclose()
    quirky = model_on(llama, stream=True, retries=2)  # stream_tools "forced": this request is not streamed
    assert not formats.streams(auto, quirky.endpoint)
    assert (await quirky.complete(auto, turn_id="t", step=0)).stop_reason in ("stop", "tool_calls", "length")
    await quirky.aclose()
    await fine.aclose()


@pytest.mark.e2e
def test_agentstream_run_shows_the_tokens_of_the_local_model(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path)  # the embedded Redis keeps its data under the cache: this test's own
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentstream",
            "run",
            "What is 1234 * 5678?",
            "--app",
            "tests.support.local_apps:app",
            "--agent",
            "local",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr[-3000:]}"
    assert re.search(r"→ tool call calculator\(", out), out
    streamed = [line for line in out.splitlines() if line.startswith("  ▸ ")]
    assert streamed, out  # the answer's tokens were printed as they arrived, before its summary line
    assert "✓ answer:" in out
    assert re.search(r"fingerprints: (\d+)/\1 model calls rebuilt from the stored trace match", proc.stderr), (
        proc.stderr
    )


async def test_two_concurrent_streamed_requests_both_complete(llama):
    # llama_cpp.server's interrupt_requests (on by default) ends a running stream with [DONE] and
    # no finish reason when another request arrives; the local server turns it off, so both
    # replies finish (no retries here: an interrupted stream would fail its call).
    import asyncio

    model = model_on(llama, stream=True, retries=0)
    long = ChatRequest(
        system="You are brief.",
        messages=(UserMessage(text="Count from one to twenty in words."),),
        max_output_tokens=48,
    )
    sinks = [ListSink(), ListSink()]
    first = asyncio.create_task(model.complete(long, turn_id="a", step=0, deltas=sinks[0]))
    while not any(d.kind == "text" for d in sinks[0].deltas):  # the first is streaming
        await asyncio.sleep(0.01)
    second = await model.complete(HELLO, turn_id="b", step=0, deltas=sinks[1])
    first_out = await first
    await model.aclose()
    for output in (first_out, second):
        assert output.stop_reason in ("stop", "length") and output.content.strip()
    assert all("abort" not in [d.kind for d in sink.deltas] for sink in sinks)
