"""The third-party OpenAI-compatible mock server ``@dwmkerr/mock-llm`` (npm), for tests.

Installed with npm into ``.tools/mock-llm`` (git-ignored) the first time a test needs it, then
run with ``node`` on a free port with a YAML rules file (JMESPath-matched rules; the last
matching rule wins). See https://github.com/dwmkerr/mock-llm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from agentstream.cli.localmodel import free_port
from tests.support.procs import ROOT

VERSION = "0.1.29"
PREFIX = ROOT / ".tools" / "mock-llm"
MAIN = PREFIX / "node_modules" / "@dwmkerr" / "mock-llm" / "dist" / "main.js"


class MockLLMUnavailable(RuntimeError):
    """node/npm are missing or the package could not be installed."""


def install() -> Path:
    """The path of mock-llm's entry point, installing the package with npm when missing."""
    if MAIN.is_file():
        return MAIN
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise MockLLMUnavailable("node and npm are needed for @dwmkerr/mock-llm")
    PREFIX.mkdir(parents=True, exist_ok=True)
    if not (PREFIX / "package.json").exists():
        (PREFIX / "package.json").write_text('{"private": true}\n')
    proc = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", f"@dwmkerr/mock-llm@{VERSION}"],
        cwd=PREFIX,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not MAIN.is_file():
        raise MockLLMUnavailable(f"npm install @dwmkerr/mock-llm@{VERSION} failed: {proc.stderr[-2000:]}")
    return MAIN


class MockLLM:
    """``node main.js --config <rules>`` on a free loopback port (a context manager)."""

    def __init__(self, config_path: Path):
        self.config_path = config_path
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = config_path.with_suffix(".log")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> MockLLM:
        main = install()
        env = dict(os.environ, PORT=str(self.port), HOST="127.0.0.1")
        self._logfile = open(self._log, "wb")
        self._proc = subprocess.Popen(
            ["node", str(main), "--config", str(self.config_path)],
            env=env,
            stdout=self._logfile,
            stderr=subprocess.STDOUT,
            cwd=self.config_path.parent,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise MockLLMUnavailable(f"mock-llm exited: {self._log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise MockLLMUnavailable("mock-llm did not answer /health within 30 s")

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._logfile.close()
