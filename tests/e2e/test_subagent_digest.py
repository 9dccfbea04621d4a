"""A subagent that ends without usable text hands back a digest of what it did (issue 11 item 9):
its parent learns that a file was written. The agent loop, a tool worker and the delegation
service as separate OS processes, a real Redis and a scripted model."""

from __future__ import annotations

import json

import pytest

from tests.support import digest_apps
from tests.support.procs import Services, publish_turn, wait_replies

pytestmark = pytest.mark.e2e


def test_the_parent_learns_from_the_digest_that_its_silent_subagent_wrote_a_file(
    client, redis_url, namespace, keys, scripted_model, tmp_path
):
    scripted_model.rule = digest_apps.rule
    notes = tmp_path / "notes"
    notes.mkdir()
    services = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=scripted_model.base_url,
        app="tests.support.digest_apps:app",
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_TEST_NOTES_DIR": str(notes), "AGENTSTREAM_SHUTDOWN_GRACE_S": "2"},
    )
    try:
        services.start("loop-1", "agent-loop")
        services.start("tools-1", "tool-worker")
        services.start("delegation-1", "delegation")
        publish_turn(client, keys, trace_id="ed1", turn_id="t1", agent="editor", text="buy milk")
        (reply,) = wait_replies(client, keys, 1, timeout_s=60)
    finally:
        services.stop_all()
    assert (notes / "notes.txt").read_text() == "buy milk"
    # the editor's model read the digest as the delegation's result: how the scribe ended, and the call it made
    parent_calls = [json.loads(raw) for raw in scripted_model.requests]
    parent_calls = [b for b in parent_calls if b["messages"][0]["content"].startswith("EDITOR")]
    result = parent_calls[-1]["messages"][-1]
    assert result["role"] == "tool", result
    text = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert "empty_reply" in text and "last stop reason stop" in text, text
    assert 'write_file({"path": "notes.txt", "content": "buy milk"}) -> ok: wrote 8 bytes to notes.txt' in text, text
    assert reply.status == "ended" and "wrote 8 bytes to notes.txt" in reply.answer
