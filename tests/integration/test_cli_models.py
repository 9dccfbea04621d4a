"""`run` and `dev` check the model endpoint before anything starts, as they check Redis (issue 38):
a dead endpoint, a remote one without a key and a refused key are one line and exit code 2, before
the embedded Redis or a service starts; the banner names the model that will be called."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentstream.cli.localmodel import free_port
from tests.support.procs import ROOT

pytestmark = pytest.mark.integration

AGENTSTREAM = [sys.executable, "-m", "agentstream"]
APP = ["--app", "tests.support.apps:app"]


def clean_env(tmp_path, **extra: str) -> dict[str, str]:
    """A fresh shell's environment (no Redis, model or agentstream settings), its cache in tmp_path."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "OPENAI_", "AGENTSTREAM_"))}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def agentstream(*args: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTSTREAM, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


class RefusingServer:
    """An OpenAI-compatible stand-in on loopback that answers 401 to everything (a wrong key)."""

    def __enter__(self) -> RefusingServer:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"error": {"message": "Incorrect API key provided"}}).encode()
                self.send_response(401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


COMMANDS = [["run", "hi", *APP, "--agent", "calc"], ["dev", *APP]]


def _one_line_before_anything(proc: subprocess.CompletedProcess, says: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert "embedded Redis" not in proc.stderr and not proc.stdout.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=["run", "dev"])
def test_a_dead_model_endpoint_is_one_line_before_anything_starts(tmp_path, command):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    ran = agentstream(*command, env=clean_env(tmp_path, OPENAI_BASE_URL=dead, OPENAI_MODEL="m"))
    _one_line_before_anything(ran, f"cannot reach the model endpoint 'default' at {dead} (OPENAI_BASE_URL): ")


@pytest.mark.parametrize("command", COMMANDS, ids=["run", "dev"])
def test_a_remote_model_endpoint_without_a_key_is_one_line_before_anything_starts(tmp_path, command):
    # .invalid never resolves: the key is checked before any request would go out
    remote = "https://models.example.invalid/v1"
    ran = agentstream(*command, env=clean_env(tmp_path, OPENAI_BASE_URL=remote))
    _one_line_before_anything(ran, "has no API key: set OPENAI_API_KEY")


def test_a_refused_key_is_one_line_before_anything_starts(tmp_path):
    with RefusingServer() as server:
        ran = agentstream(
            "run",
            "hi",
            *APP,
            "--agent",
            "calc",
            env=clean_env(tmp_path, OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="sk-wrong"),
        )
    _one_line_before_anything(ran, "refused the API key (HTTP 401): check OPENAI_API_KEY")
    assert "sk-wrong" not in ran.stderr


def test_the_banner_names_the_model_that_is_called_when_openai_model_is_unset(
    tmp_path, redis_url, namespace, scripted_model
):
    env = clean_env(
        tmp_path,
        REDIS_URL=redis_url,
        AGENTSTREAM_NAMESPACE=namespace,
        OPENAI_BASE_URL=scripted_model.base_url,
        AGENTSTREAM_DEFAULT_MODEL_OPTIONS='{"stream": false}',
        AGENTSTREAM_BLOCK_MS="100",
    )
    ran = agentstream("run", "What is 2 + 3?", *APP, "--agent", "calc", env=env, timeout_s=180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.search(rf"model gpt-4o-mini at {re.escape(scripted_model.base_url)}$", ran.stderr, re.M), ran.stderr
    sent = {json.loads(body)["model"] for body in scripted_model.requests}
    assert sent == {"gpt-4o-mini"}  # the banner's model is the one called
