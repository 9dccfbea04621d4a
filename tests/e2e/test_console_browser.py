"""The web console in a real browser: Debian's headless Chromium driven by Playwright (no browser
download), against the agent loop, a tool worker and the gateway as separate processes, with a
model that streams slowly. Each view's screenshot is saved under ``test-artifacts/console/``
(or ``$AGENTSTREAM_TEST_ARTIFACTS/console``)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import ADMIN_KEY, CALC_KEY, auth, start_gateway, turn
from tests.support.procs import ROOT, Services
from tests.support.streaming_model import StreamingModelServer

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("AGENTSTREAM_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"


@pytest.fixture
def console(redis_url, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it: apt-get install -y chromium)")
    with StreamingModelServer() as model:
        services = Services(
            redis_url=redis_url, namespace=f"console-{uuid.uuid4().hex[:8]}", model_url=model.base_url, log_dir=tmp_path
        )
        services.start("loop-1", "agent-loop")
        services.start("tools-1", "tool-worker")
        try:
            yield start_gateway(services)
        finally:
            services.stop_all()


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1280, "height": 800},
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.errors, page.requests = errors, requests  # type: ignore[attr-defined]
        try:
            yield page
        except BaseException:
            raise
        finally:
            if errors:
                print("page errors:", errors)
            try:
                shot(page, "last")
            except Exception:
                pass
            context.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_watch_a_conversation_live_cancel_it_and_explain_a_call(console, page):
    gw = httpx.Client(base_url=console, timeout=30.0)
    ended_trace, running_trace = f"ended-{uuid.uuid4().hex[:6]}", f"running-{uuid.uuid4().hex[:6]}"
    ended = gw.post("/v1/turns", json=turn(ended_trace, "t1", "What is 12*12?"), headers=auth(CALC_KEY)).json()
    assert gw.get(ended["reply_url"], params={"timeout_s": 30}, headers=auth(CALC_KEY)).json()["status"] == "ended"
    assert (
        gw.post("/v1/turns", json=turn(running_trace, "t1", "WRITE 600 60"), headers=auth(CALC_KEY)).status_code == 202
    )

    # the key, entered once
    page.goto(console + "/")
    page.get_by_test_id("key-input").fill(CALC_KEY)
    page.get_by_test_id("key-submit").click()
    page.get_by_test_id("who").filter(has_text="calc-backend").wait_for()

    # the list: both conversations with their state
    rows = page.get_by_test_id("conversations")
    rows.locator(f'tr[data-trace="{running_trace}"]').get_by_test_id("state").filter(has_text="running").wait_for()
    rows.locator(f'tr[data-trace="{ended_trace}"]').get_by_test_id("state").filter(has_text="ended").wait_for()
    assert "144" in rows.locator(f'tr[data-trace="{ended_trace}"]').inner_text()
    shot(page, "1-conversations")

    # the running conversation: tokens arrive while the model writes
    rows.locator(f'tr[data-trace="{running_trace}"]').get_by_test_id("conversation-link").click()
    live = page.get_by_test_id("live-text")
    live.filter(has_text="word3").wait_for(timeout=20_000)
    first = len(live.inner_text())
    page.wait_for_function(
        "n => (document.querySelector('[data-testid=live-text]')?.textContent.length || 0) > n + 20",
        arg=first,
        timeout=20_000,
    )
    shot(page, "2-conversation-live")

    # cancel it from the page, and see it end as cancelled
    page.get_by_test_id("cancel").click()
    page.get_by_test_id("state").filter(has_text="cancelled").wait_for(timeout=20_000)
    page.get_by_test_id("timeline").get_by_text("turn failed: cancelled").wait_for()
    assert page.get_by_test_id("cancel").is_disabled()
    shot(page, "3-conversation-cancelled")
    reply = gw.get(
        f"/v1/traces/{running_trace}/turns/t1/reply", params={"timeout_s": 10}, headers=auth(CALC_KEY)
    ).json()
    assert reply["code"] == "cancelled"

    # the ended conversation's timeline, and the explain view of its second model call
    page.goto(f"{console}/console/#/c/{ended_trace}")
    timeline = page.get_by_test_id("timeline")
    timeline.get_by_text("tool result calculator").wait_for()
    timeline.get_by_text("→ calculator(").wait_for()
    assert "20 → 5 tokens" in timeline.inner_text()  # a model call's tokens and latency
    shot(page, "4-timeline")
    timeline.get_by_test_id("explain-link").nth(1).click()
    page.get_by_test_id("explain-verdict").filter(has_text="matches the recorded fingerprint").wait_for()
    assert '"role": "tool"' in page.get_by_test_id("explain-body").inner_text()
    messages = page.get_by_test_id("explain-messages").inner_text()
    assert "What is 12*12?" in messages and "→ calculator(" in messages and "144" in messages
    shot(page, "5-explain")

    # the dead letters, with a key for every agent
    page.locator("#forget").click()
    page.get_by_test_id("key-input").fill(ADMIN_KEY)
    page.get_by_test_id("key-submit").click()
    page.get_by_test_id("nav-dead").click()
    page.get_by_test_id("dead-letters").wait_for()
    shot(page, "6-dead-letters")

    assert page.errors == []  # type: ignore[attr-defined]
    outside = [u for u in page.requests if not u.startswith(console)]  # type: ignore[attr-defined]
    assert outside == [], "the console loads nothing from elsewhere"
    gw.close()
    if os.environ.get("AGENTSTREAM_CONSOLE_SCREENSHOT"):  # refresh the README's screenshot
        shutil.copy(ARTIFACTS / "4-timeline.png", os.environ["AGENTSTREAM_CONSOLE_SCREENSHOT"])


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"  # an absolute time, to the millisecond


def _wait_reply(gw: httpx.Client, trace_id: str, turn_id: str) -> dict:
    reply = gw.get(f"/v1/traces/{trace_id}/turns/{turn_id}/reply", params={"timeout_s": 30}, headers=auth(CALC_KEY))
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_find_page_steer_fork_and_read_a_turns_waterfall(console, page):
    import re

    gw = httpx.Client(base_url=console, timeout=30.0)
    tag = uuid.uuid4().hex[:6]
    red = f"red-{tag}"
    sent = gw.post(
        "/v1/turns",
        json=turn(red, "t1", "What is 12*12?", metadata={"team": "red", "ticket": "T-7"}),
        headers=auth(CALC_KEY),
    )
    assert sent.status_code == 202, sent.text
    assert _wait_reply(gw, red, "t1")["status"] == "ended"
    for i in range(11):  # enough for two pages of 10
        gw.post("/v1/turns", json=turn(f"many-{tag}-{i:02d}", "t1", f"What is {i}+1?"), headers=auth(CALC_KEY))
    for i in range(11):
        _wait_reply(gw, f"many-{tag}-{i:02d}", "t1")

    page.goto(console + "/")
    page.get_by_test_id("key-input").fill(CALC_KEY)
    page.get_by_test_id("key-submit").click()
    page.get_by_test_id("who").filter(has_text="calc-backend").wait_for()
    rows = page.get_by_test_id("conversations")
    rows.locator(f'tr[data-trace="{red}"]').wait_for()

    # find by metadata and state: one row, with its metadata and an absolute time
    page.get_by_test_id("meta-input").fill("team=red")
    page.get_by_test_id("state-select").select_option("ended")
    page.get_by_test_id("search").click()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=conversations] tbody tr').length === 1")
    only = rows.locator("tbody tr")
    assert only.get_attribute("data-trace") == red
    assert "team=red" in only.get_by_test_id("row-metadata").inner_text()
    assert re.search(STAMP, only.inner_text())
    shot(page, "7-find-by-metadata")
    page.get_by_test_id("meta-input").fill("team=blue")
    page.get_by_test_id("search").click()
    rows.get_by_text("No conversations match.").wait_for()
    page.get_by_test_id("meta-input").fill("team=red")
    page.get_by_test_id("to-input").fill("2000-01-01T00:00:00")  # by time: nothing is that old
    page.get_by_test_id("search").click()
    rows.get_by_text("No conversations match.").wait_for()
    page.get_by_test_id("to-input").fill("")
    page.get_by_test_id("from-input").fill("2000-01-01T00:00:00")
    page.get_by_test_id("search").click()
    rows.locator(f'tr[data-trace="{red}"]').wait_for()
    page.get_by_test_id("from-input").fill("")

    # pages of 10: the newest ten, then the older ones
    page.get_by_test_id("meta-input").fill("")
    page.get_by_test_id("state-select").select_option("")
    page.get_by_test_id("limit-select").select_option("10")
    page.get_by_test_id("search").click()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=conversations] tbody tr').length === 10")
    first_page = set(rows.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.trace)"))
    page.get_by_test_id("older").click()
    page.get_by_test_id("page-note").filter(has_text="page 2").wait_for()
    second_page = set(rows.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.trace)"))
    assert second_page and not first_page & second_page
    assert red in first_page | second_page
    shot(page, "8-second-page")

    # the conversation: absolute times, durations, the turn's metadata, its waterfall
    page.goto(f"{console}/console/#/c/{red}")
    timeline = page.get_by_test_id("timeline")
    timeline.get_by_test_id("turn-took").wait_for()
    times = timeline.get_by_test_id("event-time").all_inner_texts()
    assert len(times) >= 5 and all(re.fullmatch(STAMP, t) for t in times), times
    assert sorted(times) == times  # in the order they happened
    assert timeline.get_by_test_id("turn-metadata").inner_text().split() == ["team=red", "ticket=T-7"]
    assert re.search(r"the turn took \d", timeline.get_by_test_id("turn-took").inner_text())
    bars = page.get_by_test_id("waterfall").first.get_by_test_id("waterfall-row")
    assert bars.evaluate_all("rs => rs.map(r => r.dataset.kind)") == ["model", "tool", "model"]
    shot(page, "9-times-metadata-waterfall")

    # publish a turn from the console; its tool-call arguments appear as the model writes them
    page.get_by_test_id("publish-text").fill("What is 7*6? SLOWARGS")
    page.get_by_test_id("publish").click()
    page.get_by_test_id("publish-result").filter(has_text="sent").wait_for()
    live_call = page.get_by_test_id("live-call")
    live_call.filter(has_text='→ calculator({"').wait_for(timeout=20_000)
    partial = live_call.inner_text()
    assert '"7*6"}' not in partial  # a piece of the arguments, not all of them
    page.get_by_test_id("live-head").filter(has_text="calling tools").wait_for()
    shot(page, "10-tool-arguments-streaming")
    page.wait_for_function(
        "n => (document.querySelector('[data-testid=live-call]')?.textContent.length || 0) > n", arg=len(partial)
    )
    timeline.locator("li.turn_ended").filter(has_text="The answer is 42.").wait_for(timeout=20_000)
    assert page.get_by_test_id("waterfall").count() == 2  # one per turn

    # a busy conversation: a turn sent with "interrupt" cancels the running one, then runs
    busy = f"busy-{tag}"
    gw.post("/v1/turns", json=turn(busy, "t1", "WRITE 600 60"), headers=auth(CALC_KEY))
    page.goto(f"{console}/console/#/c/{busy}")
    page.get_by_test_id("live-text").filter(has_text="word3").wait_for(timeout=20_000)
    page.get_by_test_id("publish-text").fill("What is 2*2?")
    page.get_by_test_id("policy-select").select_option("interrupt")
    page.get_by_test_id("publish").click()
    page.get_by_test_id("publish-result").filter(has_text="if busy: interrupt").wait_for()
    timeline.get_by_text("turn failed: cancelled").wait_for(timeout=20_000)
    timeline.locator("li.turn_ended").filter(has_text="The answer is 4.").wait_for(timeout=20_000)
    shot(page, "11-interrupt")

    # fork after the first turn, then with its input replaced
    page.goto(f"{console}/console/#/c/{red}")
    first_turn = timeline.locator("li.turn_input").first
    first_turn.get_by_test_id("fork-open").click()
    first_turn.get_by_test_id("fork-after").click()
    page.wait_for_url(re.compile(r"#/c/red-"))
    page.get_by_test_id("fork-source").filter(has_text=red).wait_for()
    assert page.url.split("#/c/")[1] != red
    shot(page, "12-forked")
    page.goto(f"{console}/console/#/c/{red}")
    first_turn = timeline.locator("li.turn_input").first
    first_turn.get_by_test_id("fork-open").click()
    first_turn.get_by_test_id("fork-text").fill("What is 5*5?")
    first_turn.get_by_test_id("fork-replace").click()
    page.get_by_test_id("fork-source").wait_for()
    timeline.locator("li.turn_ended").filter(has_text="The answer is 25.").wait_for(timeout=20_000)
    shot(page, "13-forked-with-new-input")

    assert page.errors == []  # type: ignore[attr-defined]
    outside = [u for u in page.requests if not u.startswith(console)]  # type: ignore[attr-defined]
    assert outside == [], "the console loads nothing from elsewhere"
    gw.close()


@pytest.fixture
def lead_console(redis_url, scripted_model, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it: apt-get install -y chromium)")
    from tests.support import delegation_apps

    scripted_model.rule = delegation_apps.rule
    services = Services(
        redis_url=redis_url,
        namespace=f"console-{uuid.uuid4().hex[:8]}",
        model_url=scripted_model.base_url,
        app="tests.support.delegation_apps:app",
        log_dir=tmp_path,
        extra_env={"AGENTSTREAM_TEST_LOOKUP_A_S": "0.4"},  # A's lookup runs long enough to see
    )
    services.start("loop-1", "agent-loop")
    services.start("tools-1", "tool-worker", "--queue", "default")
    services.start("delegation-1", "delegation")
    try:
        yield start_gateway(services)
    finally:
        services.stop_all()


def test_a_turns_waterfall_nests_its_subagent_runs(lead_console, page):
    from tests.support.gateway import LEAD_KEY

    gw = httpx.Client(base_url=lead_console, timeout=30.0)
    trace_id = f"lead-{uuid.uuid4().hex[:6]}"
    sent = gw.post("/v1/turns", json=turn(trace_id, "t1", "Compare A and B", agent="lead"), headers=auth(LEAD_KEY))
    assert sent.status_code == 202, sent.text
    reply = gw.get(f"/v1/traces/{trace_id}/turns/t1/reply", params={"timeout_s": 60}, headers=auth(LEAD_KEY)).json()
    assert reply["status"] == "ended", reply

    page.goto(f"{lead_console}/console/#/c/{trace_id}")
    page.get_by_test_id("key-input").fill(LEAD_KEY)
    page.get_by_test_id("key-submit").click()
    rows = page.get_by_test_id("waterfall").first.get_by_test_id("waterfall-row")
    # the lead's first call, each research run with its researcher's calls and lookup one level in
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=waterfall-row][data-depth=\"1\"]').length >= 6"
    )
    kinds = rows.evaluate_all("rs => rs.map(r => `${r.dataset.depth}:${r.dataset.kind}`)")
    assert kinds[0] == "0:model" and kinds.count("0:subagent") == 2, kinds
    assert kinds.count("1:model") == 4 and kinds.count("1:tool") == 2, kinds
    assert kinds[-1] == "0:model"  # the lead's answer, after both runs
    assert "0:tool" not in kinds  # a run's result is not a tool run of its own
    shot(page, "14-subagent-waterfall")
    assert page.errors == []  # type: ignore[attr-defined]
    gw.close()


def test_approve_and_deny_a_tool_call_from_the_console(console, page):
    gw = httpx.Client(base_url=console, timeout=30.0)
    trace_id = f"approve-{uuid.uuid4().hex[:6]}"
    sent = gw.post(
        "/v1/turns", json=turn(trace_id, "t1", "What is 6*6?", approval=["calculator"]), headers=auth(CALC_KEY)
    )
    assert sent.status_code == 202, sent.text

    page.goto(f"{console}/console/#/c/{trace_id}")
    page.get_by_test_id("key-input").fill(CALC_KEY)
    page.get_by_test_id("key-submit").click()
    timeline = page.get_by_test_id("timeline")
    waiting = timeline.locator("li.approval_awaited")
    waiting.get_by_test_id("approve").wait_for(timeout=20_000)
    assert "calculator awaits approval" in waiting.inner_text()
    shot(page, "15-awaiting-approval")
    waiting.get_by_test_id("approval-reason").fill("fine by me")
    waiting.get_by_test_id("approve").click()
    decision = timeline.get_by_test_id("approval-decision")
    decision.filter(has_text="calculator approved by gateway:calc-backend").wait_for(timeout=20_000)
    timeline.locator("li.turn_ended").filter(has_text="The answer is 36.").wait_for(timeout=20_000)
    assert waiting.get_by_test_id("approve").count() == 0  # decided: no buttons left

    # a turn sent from the console that asks approval for every tool call, denied with a reason
    page.get_by_test_id("publish-text").fill("What is 9*9?")
    page.get_by_test_id("publish-approval").check()
    page.get_by_test_id("publish").click()
    second = timeline.locator("li.approval_awaited").nth(1)
    second.get_by_test_id("deny").wait_for(timeout=20_000)
    second.get_by_test_id("approval-reason").fill("not now")
    second.get_by_test_id("deny").click()
    decision.filter(has_text="calculator denied by gateway:calc-backend").wait_for(timeout=20_000)
    timeline.locator("li.tool_result").filter(has_text="not now").wait_for(timeout=20_000)
    timeline.locator("li.turn_ended").nth(1).wait_for(timeout=20_000)
    shot(page, "16-approved-and-denied")
    assert (
        gw.get(f"/v1/traces/{trace_id}/turns/t1/reply", headers=auth(CALC_KEY)).json()["answer"] == "The answer is 36."
    )
    assert page.errors == []  # type: ignore[attr-defined]
    gw.close()
