"""The JSON log lines of the services: failed turns and retries are logged, and every line made
while an entry of a trace is handled carries the trace's id (and the turn's, the call's)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from agentstream.ops import logs
from agentstream.runtime.consumer import ConsumerConfig, StreamConsumer
from tests.support import apps
from tests.support.fault_server import FaultServer, Reply
from tests.support.inprocess import InProcess, publish, wait_reply

pytestmark = pytest.mark.integration


@pytest.fixture
def json_logs():
    """The root logger's JSON lines (as ``agentstream serve`` writes them), parsed on demand."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    buffer = io.StringIO()
    logs.setup("INFO", fmt="json", stream=buffer)

    def lines() -> list[dict]:
        return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]

    yield lines
    root.handlers[:], level = saved
    root.setLevel(level)


async def test_a_failed_turn_logs_one_warning_retries_log_at_info_and_lines_carry_the_trace(
    redis, keys, redis_url, namespace, json_logs, monkeypatch
):
    down = Reply(status=503, body={"error": {"message": "overloaded", "type": "server_error"}})
    with FaultServer([down], repeat_last=True) as server:
        monkeypatch.setenv("REDIS_URL", redis_url)
        services = InProcess(apps.app, redis_url, namespace, server.base_url, env={"AGENTSTREAM_MODEL_RETRIES": "1"})
        try:
            await services.start("p1", "agent-loop")
            await publish(redis, keys, trace_id="log-c1", turn_id="log-t1", agent="plan", text="hello")
            reply = await wait_reply(redis, keys, "log-t1")
        finally:
            await services.stop_all()
    assert reply.code == "model_error"
    lines = json_logs()
    failed = [x for x in lines if x["level"] == "WARNING" and "failed" in x["message"] and "log-t1" in x["message"]]
    assert len(failed) == 1, lines
    assert "model_error" in failed[0]["message"] and "overloaded" in failed[0]["message"]
    retries = [
        x for x in lines if x["level"] == "INFO" and "retrying" in x["message"] and x["logger"] == "agentstream.models"
    ]
    assert len(retries) == 1 and "HTTP 503" in retries[0]["message"]
    for line in [*failed, *retries]:
        assert (line["trace_id"], line["turn_id"]) == ("log-c1", "log-t1"), line
    about = [x for x in lines if "log-c1" in x["message"]]
    assert about and all(x["trace_id"] == "log-c1" for x in about), about


async def test_the_consumers_own_lines_about_an_entry_carry_its_ids(redis, keys, json_logs):
    stream = f"{keys.namespace}:tools:default"

    async def failing(entry_id, fields):
        raise RuntimeError("tool worker crashed")

    consumer = StreamConsumer(
        redis,
        stream=stream,
        group="g",
        consumer="w1",
        handler=failing,
        dead_stream=keys.dead(stream),
        config=ConsumerConfig(block_ms=50, retry_delay_s=0.05),
    )
    await consumer.ensure_group()
    job = {"trace_id": "log-c2", "turn_id": "log-t2", "call_id": "call-9", "name": "work", "arguments": "{}"}
    await redis.xadd(stream, {b"job": json.dumps(job).encode()})
    await consumer.run_until_idle()
    (line,) = [x for x in json_logs() if "handler failed" in x["message"]]
    assert (line["trace_id"], line["turn_id"], line["call_id"]) == ("log-c2", "log-t2", "call-9")


def test_log_lines_carry_iso_8601_utc_times_whatever_the_local_zone(json_logs, monkeypatch):
    import re
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: a local time would show it
    time.tzset()
    try:
        before = time.time()
        logging.getLogger("agentstream.test").warning("stamped")
        (line,) = [x for x in json_logs() if x["message"] == "stamped"]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]), line["time"]
    from datetime import datetime

    stamped = datetime.fromisoformat(line["time"].replace("Z", "+00:00")).timestamp()
    assert abs(stamped - before) < 5


def test_text_lines_carry_iso_8601_utc_times():
    import re

    buffer = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logs.setup("INFO", fmt="text", stream=buffer)
        logging.getLogger("agentstream.test").info("plain")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO agentstream.test: plain$", buffer.getvalue().strip())


def test_an_unknown_log_level_is_refused():
    with pytest.raises(ValueError, match="LOUD"):
        logs.setup("LOUD")
