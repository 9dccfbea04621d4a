"""`agentstream trace explain` on a trace stored in a real Redis."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.wire.events import ModelOutput, ToolCall, ToolOutput, TurnEnded, TurnInput

pytestmark = pytest.mark.integration


async def test_explain_prints_the_request_of_a_stored_call_and_its_shortened_results(
    store, redis_url, namespace, monkeypatch
):
    trace_id = "explain-me"
    events = []
    for index in range(12):
        turn = f"t{index}"
        events += [
            TurnInput(turn_id=turn, agent="calc", text=f"what is {index} + {index}?"),
            ModelOutput(
                turn_id=turn,
                step=0,
                tool_calls=(ToolCall(id=f"c{index}", name="calculator", arguments='{"expression": "1+1"}'),),
            ),
            ToolOutput(turn_id=turn, call_id=f"c{index}", name="calculator", text="2 " * 4000),
            ModelOutput(turn_id=turn, step=1, content=f"{index * 2}"),
            TurnEnded(turn_id=turn, answer=f"{index * 2}"),
        ]
    events.append(TurnInput(turn_id="last", agent="calc", text="and now?"))
    for event in events:
        await store.append(trace_id, event)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("AGENTSTREAM_NAMESPACE", namespace)
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke, cli, ["trace", "explain", trace_id, "--step", "0", "--app", "tests.support.apps:app"]
    )
    assert result.exit_code == 0, result.output
    assert "turn last, step 0: model call 24 of the trace, not made yet" in result.output
    assert "request body:" in result.output and '"and now?"' in result.output
    assert "stubbed by Stub(where=turns[:-4]" in result.output
    for spelling in (
        "--turn-id",
        "--turn",
    ):  # as `cancel --turn-id` and the gateway's ?turn_id=; --turn the old spelling
        result = await asyncio.to_thread(
            runner.invoke,
            cli,
            ["trace", "explain", trace_id, "--step", "1", spelling, "t3", "--app", "tests.support.apps:app", "--json"],
        )
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output)
        assert payload["made"] is True and payload["call"] == 7 and payload["body"]["messages"][-1]["role"] == "tool"
    result = await asyncio.to_thread(
        runner.invoke,
        cli,
        ["trace", "explain", trace_id, "--step", "5", "--turn", "t3", "--app", "tests.support.apps:app"],
    )
    assert result.exit_code == 2 and "neither one of them nor the next" in result.output
