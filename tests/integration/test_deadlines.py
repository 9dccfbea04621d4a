"""Deadlines (issue 11, item 3): a server that keeps a stream open with an empty chunk every
half second never holds a model call past AGENTSTREAM_MODEL_DEADLINE_S, although each chunk
comes well within the per-read timeout; AGENTSTREAM_TURN_DEADLINE_S bounds a turn (and its model
call). Both end the turn with code ``deadline`` and a reason naming the variable."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentstream.wire.events import TurnFailed
from tests.support import apps
from tests.support.inprocess import InProcess, events_of, publish, wait_reply

pytestmark = pytest.mark.integration

EMPTY_CHUNK = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{}}]}\n\n'


class TricklingServer:
    """An OpenAI-compatible server that streams an empty chunk every ``every_s`` and never ends."""

    def __init__(self, every_s: float = 0.5):
        stopping = self.stopping = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    while not stopping.wait(every_s):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(EMPTY_CHUNK), EMPTY_CHUNK))
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trickling():
    server = TricklingServer()
    yield server
    server.close()


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"AGENTSTREAM_MODEL_DEADLINE_S": "2"}, "AGENTSTREAM_MODEL_DEADLINE_S"),
        ({"AGENTSTREAM_MODEL_DEADLINE_S": "60", "AGENTSTREAM_TURN_DEADLINE_S": "2"}, "AGENTSTREAM_TURN_DEADLINE_S"),
    ],
)
async def test_a_trickling_stream_cannot_hold_a_call_past_its_deadline(
    redis_url, namespace, redis, keys, store, trickling, env, variable
):
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        trickling.base_url,
        env={"AGENTSTREAM_MODEL_TIMEOUT_S": "3", "AGENTSTREAM_MODEL_RETRIES": "2", **env},
    )
    try:
        await services.start("p1", "agent-loop")
        started = time.monotonic()
        await publish(redis, keys, trace_id="slow", turn_id="t1", agent="calc", text="What is 1 + 1?")
        reply = await wait_reply(redis, keys, "t1", timeout_s=30)
        took_s = time.monotonic() - started
    finally:
        await services.stop_all()
    assert reply.status == "failed" and reply.code == "deadline", reply
    assert variable in reply.reason and "2 s" in reply.reason, reply.reason
    assert took_s < 10, took_s  # the per-read timeout (3 s) never fired: chunks came every 0.5 s
    (failed,) = [e for e in await events_of(store, "slow") if isinstance(e, TurnFailed)]
    assert failed.code == "deadline"


async def test_a_turn_past_its_deadline_is_not_given_another_model_call(
    redis_url, namespace, redis, keys, store, scripted_model
):
    services = InProcess(
        apps.app,
        redis_url,
        namespace,
        scripted_model.base_url,
        env={
            "AGENTSTREAM_TURN_DEADLINE_S": "1",
            "AGENTSTREAM_TEST_TOOL_DELAY_S": "1.5",
            "AGENTSTREAM_DEFAULT_MODEL_OPTIONS": json.dumps({"stream": False}),
        },
    )
    import os

    os.environ["AGENTSTREAM_TEST_TOOL_DELAY_S"] = "1.5"  # the tool runs in this process
    try:
        await services.start("p1", "agent-loop", "tool-worker")
        await publish(redis, keys, trace_id="late", turn_id="t1", agent="calc", text="What is 3 + 4?")
        reply = await wait_reply(redis, keys, "t1", timeout_s=30)
    finally:
        os.environ.pop("AGENTSTREAM_TEST_TOOL_DELAY_S", None)
        await services.stop_all()
    assert (
        reply.code == "deadline" and "AGENTSTREAM_TURN_DEADLINE_S" in reply.reason and "model call 1" in reply.reason
    ), reply
    assert len(scripted_model.requests) == 1  # the call after the slow tool was never made
