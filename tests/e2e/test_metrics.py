"""A service's /metrics after a turn carries the agent-level metrics (issue 7)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.procs import Services, publish_turn, wait_replies
from tests.support.redis_server import free_port, sync_client

pytestmark = pytest.mark.e2e


def scrape(port: int, deadline_s: float = 20.0) -> str:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.TransportError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def test_metrics_after_a_turn(redis_url, namespace, keys, scripted_model, tmp_path):
    client = sync_client(redis_url)
    loop_port, tools_port = free_port(), free_port()
    services = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    services.env["AGENTSTREAM_METRICS_INTERVAL_S"] = "0.2"
    try:
        services.env["AGENTSTREAM_METRICS_PORT"] = str(loop_port)
        services.start("loop-1", "agent-loop")
        services.env["AGENTSTREAM_METRICS_PORT"] = str(tools_port)
        services.start("tools-1", "tool-worker")
        publish_turn(client, keys, trace_id="m1", turn_id="t1", agent="calc", text="What is 2*2?")
        publish_turn(client, keys, trace_id="m2", turn_id="t2", agent="calc", text="What is 3-(")  # bad expression
        wait_replies(client, keys, 2)
        deadline = time.monotonic() + 20
        # the gauges are read every 0.2 s: wait for a reading taken after both turns were taken
        while f'agentstream_consumer_lag{{group="agent-loop",stream="{keys.turns}"}} 0.0' not in scrape(loop_port):
            assert time.monotonic() < deadline, "stream gauges never observed"
            time.sleep(0.2)
        loop_text = scrape(loop_port)
        tools_text = scrape(tools_port)
        assert httpx.get(f"http://127.0.0.1:{loop_port}/healthz").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{tools_port}/readyz").status_code == 200
    finally:
        services.stop_all()
        client.close()
    assert 'agentstream_turns_started_total{agent="calc"} 2.0' in loop_text
    assert 'agentstream_turns_ended_total{agent="calc"}' in loop_text
    assert 'agentstream_model_call_seconds_count{model="default"}' in loop_text
    assert 'agentstream_model_tokens_total{kind="prompt",model="default"}' in loop_text
    assert 'agentstream_tool_call_seconds_count{tool="calculator"} 2.0' in tools_text
    assert 'agentstream_tool_errors_total{error="tool_error",tool="calculator"} 1.0' in tools_text
    # one name for the tool workers' service, as the chart's component label and build_info say
    assert 'agentstream_handlers_in_flight{service="tool-worker",' in tools_text
    assert 'service="tool-workers"' not in tools_text and 'service="tool-worker"' in tools_text
    assert f'agentstream_stream_length{{stream="{keys.turns}"}} 2.0' in loop_text
    assert f'agentstream_consumer_lag{{group="agent-loop",stream="{keys.turns}"}} 0.0' in loop_text, [
        line for line in loop_text.splitlines() if "lag" in line or "length" in line
    ]
    for name in ("agentstream_reclaims_total", "agentstream_dead_letters_total"):
        assert f"# TYPE {name} counter" in loop_text, name


def get(port: int, path: str, **headers: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=5)


def test_metrics_endpoint_paths_formats_freshness_and_operations_metrics(
    redis_url, namespace, keys, scripted_model, tmp_path
):
    """/metrics exactly (a query string ignored, other paths 404), OpenMetrics when asked,
    stream gauges read at the scrape although the background interval is 10 minutes, build
    info, handlers in flight and the live consumers of a tool queue nobody consumes."""
    client = sync_client(redis_url)
    port = free_port()
    services = Services(redis_url=redis_url, namespace=namespace, model_url=scripted_model.base_url, log_dir=tmp_path)
    services.env["AGENTSTREAM_METRICS_INTERVAL_S"] = "600"
    services.env["AGENTSTREAM_METRICS_PORT"] = str(port)
    # the turn stays on its stream once acknowledged: the first trim would otherwise come at a
    # random moment in the first minute and could empty the stream before the scrape
    services.env["AGENTSTREAM_TRIM_INTERVAL_MS"] = "0"
    try:
        services.start("loop-1", "agent-loop")
        scrape(port)  # up: the first background reading is done
        time.sleep(5.5)  # older than FRESH_S: the next scrape reads again
        # a turn for a tool that no worker consumes: its job waits on the tool queue
        publish_turn(client, keys, trace_id="f1", turn_id="t1", agent="calc", text="What is 2*2?")
        tools = keys.tools("default")
        deadline = time.monotonic() + 20
        while not client.exists(tools) or client.xlen(tools) == 0:
            assert time.monotonic() < deadline, "no tool job published"
            time.sleep(0.1)
        text = get(port, "/metrics?x=1").text
        open_metrics = get(port, "/metrics", Accept="application/openmetrics-text; version=1.0.0; charset=utf-8")
        assert get(port, "/metricsfoo").status_code == 404
        assert get(port, "/healthzzz").status_code == 404
        assert get(port, "/healthz?probe=1").status_code == 200
    finally:
        services.stop_all()
        client.close()
    # fresh at the scrape: the turn was published after the last background reading
    assert f'agentstream_stream_length{{stream="{keys.turns}"}} 1.0' in text, [
        line for line in text.splitlines() if "length" in line
    ]
    assert f'agentstream_consumer_lag{{group="tool-workers",stream="{tools}"}} 1.0' in text
    assert f'agentstream_stream_consumers{{group="tool-workers",stream="{tools}"}} 0.0' in text
    assert f'agentstream_stream_consumers{{group="agent-loop",stream="{keys.turns}"}} 1.0' in text
    assert "agentstream_stream_observed_timestamp_seconds " in text
    assert 'agentstream_build_info{python="' in text and 'service="agent-loop"' in text
    assert f'agentstream_handlers_in_flight{{service="agent-loop",stream="{keys.turns}"}} 0.0' in text
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")
