"""The Python and Node snippets of docs/how-to/publish-a-turn.md, run as written against the
services: each publishes its turn with its own Redis client and reads the reply of that turn.

Only the Redis URL and the namespace (``agentstream:`` → the test bed's own) are put in. Node's
client (``redis`` from the npm registry) is installed once into ``.tools/docs-node``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import subprocess
import uuid

import pytest

from agentstream import Agent, App
from agentstream.testing import FunctionModel, TestBed
from tests.support import docs

pytestmark = pytest.mark.integration

PAGE = "how-to/publish-a-turn.md"
NODE_DIR = docs.ROOT / ".tools" / "docs-node"
APP = App(agents=[Agent(name="demo", system_prompt="You do arithmetic.")])


def snippet(language: str, redis_url: str, namespace: str) -> str:
    """The page's ``language`` block, pointed at ``redis_url`` and ``namespace``."""
    (body,) = docs.blocks(docs.page(PAGE), language)
    assert body.count("redis://localhost:6379/0") == 1, f"{PAGE}: the {language} snippet's Redis URL moved"
    return body.replace("redis://localhost:6379/0", redis_url).replace('"agentstream:', f'"{namespace}:')


def bed(redis_url: str) -> TestBed:
    return TestBed(APP, model=FunctionModel(lambda request, info: "144"), redis_url=redis_url)


async def test_the_python_snippet_publishes_a_turn_and_reads_its_reply(redis_url):
    async with bed(redis_url) as running:
        code = snippet("python", redis_url, running.namespace)
        printed = io.StringIO()

        def run() -> None:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"docs/{PAGE}", "exec"), {})

        await asyncio.wait_for(asyncio.to_thread(run), timeout=60)
    assert printed.getvalue() == "ended 144\n"


def node_client() -> str:
    """The node binary, with node-redis installed beside the scripts this test writes."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed (apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        installed = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "redis@5"], cwd=NODE_DIR, capture_output=True, text=True
        )
        assert installed.returncode == 0, installed.stderr
    return node


async def test_the_node_snippet_publishes_a_turn_and_reads_its_reply(redis_url):
    node = node_client()
    async with bed(redis_url) as running:
        script = NODE_DIR / f"publish-{uuid.uuid4().hex[:8]}.mjs"  # beside node_modules, where imports resolve
        script.write_text(snippet("javascript", redis_url, running.namespace))
        try:
            process = await asyncio.create_subprocess_exec(
                node, str(script), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        finally:
            script.unlink()
    assert process.returncode == 0, err.decode()
    assert out.decode() == "ended 144\n"
