"""The gateway shows subagent runs: a conversation's child traces, readable with a key for the
root conversation's agent (the subagent's own name need not be among the key's agents)."""

from __future__ import annotations

import httpx
import pytest

from tests.support import delegation_apps
from tests.support.gateway import CALC_KEY, LEAD_KEY, auth, start_gateway, turn
from tests.support.procs import Services

pytestmark = pytest.mark.e2e


def test_child_traces_are_listed_and_readable_through_the_root(redis_url, namespace, scripted_model, tmp_path):
    scripted_model.rule = delegation_apps.rule
    services = Services(
        redis_url=redis_url,
        namespace=namespace,
        model_url=scripted_model.base_url,
        app="tests.support.delegation_apps:app",
        log_dir=tmp_path,
    )
    try:
        services.start("loop-1", "agent-loop")
        services.start("tools-1", "tool-worker", "--queue", "default")
        services.start("delegation-1", "delegation")
        url = start_gateway(services)
        with httpx.Client(base_url=url, timeout=60) as gw:
            accepted = gw.post(
                "/v1/turns", json=turn("p1", "t1", "Compare A and B", agent="lead"), headers=auth(LEAD_KEY)
            )
            assert accepted.status_code == 202, accepted.text
            reply = gw.get(accepted.json()["reply_url"], params={"timeout_s": 60}, headers=auth(LEAD_KEY)).json()
            assert reply["status"] == "ended", reply
            parent = gw.get("/v1/traces/p1", headers=auth(LEAD_KEY)).json()
            calls = [
                c["id"]
                for e in parent["events"]
                if e["event"]["type"] == "model_output"
                for c in e["event"]["tool_calls"]
            ]
            assert parent["children"] == sorted(f"p1/{c}" for c in calls) and len(calls) == 2
            child_id = parent["children"][0]
            child = gw.get(f"/v1/traces/{child_id}", headers=auth(LEAD_KEY))
            assert child.status_code == 200, child.text
            body = child.json()
            assert body["root_trace_id"] == "p1" and body["events"][0]["event"]["type"] == "task_input"
            assert body["state"]["state"] == "ended" and body["state"]["agent"] == "researcher"
            explained = gw.get(f"/v1/traces/{child_id}/explain", params={"step": 0}, headers=auth(LEAD_KEY)).json()
            assert explained["matches"] is True
            assert gw.get(f"/v1/traces/{child_id}", headers=auth(CALC_KEY)).status_code == 404  # not the calc key's
    finally:
        services.stop_all()
