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
