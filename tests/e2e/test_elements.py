"""End to end: elements, citations and the app's own types through the running services.

The agent loop and a tool worker run as separate processes on a real Redis; a scripted
OpenAI-compatible model answers over HTTP, and every assertion on what the model saw is on the
request body it received.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from agentstream.wire import codec
from agentstream.wire.events import Document, Image, ToolOutput, TurnEnded, TurnMessage
from agentstream.wire.keys import TURN_FIELD
from tests.support.element_apps import Note, app, element_rule
from tests.support.procs import ROOT, Services, publish_turn, trace_events, wait_replies
from tests.support.procs import request_bodies as bodies
from tests.support.scripted_model import ScriptedModelServer

pytestmark = pytest.mark.e2e

APP = "tests.support.element_apps:app"


@pytest.fixture
def model():
    with ScriptedModelServer(element_rule) as server:
        yield server


@pytest.fixture
def services(redis_url, namespace, model, tmp_path):
    s = Services(redis_url=redis_url, namespace=namespace, model_url=model.base_url, app=APP, log_dir=tmp_path)
    s.start("loop-1", "agent-loop")
    s.start("tools-1", "tool-worker")
    yield s
    s.stop_all()


def events_of(client, keys, trace_id):
    return trace_events(client, keys, trace_id, trace_codec=app.codec)  # the app's own element types


def cli(services, *args):
    return subprocess.run(
        [sys.executable, "-m", "agentstream", *args],
        env=services.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def verified(services, trace_id, calls):
    proc = cli(services, "trace", "verify", trace_id, "--app", APP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{calls}/{calls} model calls rebuilt from the stored trace match" in proc.stderr


LEAVE_LAYOUT = (
    '<document id="1" cite="[1]" title="Leave policy" url="https://handbook.example/leave">\n'
    '<passage id="2" cite="[2]" chunk="0">Staff get 25 days of paid leave a year.</passage>\n'
    '<passage id="3" cite="[3]" chunk="1">Unused leave carries over up to 5 days.</passage>\n'
    "</document>\n\n"
    "2 passages found for 'leave'."
)


def test_a_tools_sources_reach_the_model_in_the_layout_and_the_answers_citations_come_back(
    client, keys, services, model
):
    publish_turn(client, keys, trace_id="e1", turn_id="t1", agent="reader", text="How much leave? do: search(leave)")
    (reply,) = wait_replies(client, keys, 1)
    second = bodies(model)[1]["messages"]
    tool_message = next(m for m in second if m["role"] == "tool")
    assert tool_message["content"] == LEAVE_LAYOUT
    # the model answered "The handbook says so [2]. It agrees with the rest [3]."
    assert reply.status == "ended" and reply.answer == "The handbook says so. It agrees with the rest."
    assert [(c.number, c.id, c.title, c.url, c.whole) for c in reply.citations] == [
        (2, "hb:leave#0", "Leave policy", "https://handbook.example/leave", "hb:leave"),
        (3, "hb:leave#1", "Leave policy", "https://handbook.example/leave", "hb:leave"),
    ]
    assert [reply.answer[slice(*c.spans[0])] for c in reply.citations] == [
        "The handbook says so",
        "It agrees with the rest",
    ]
    events = events_of(client, keys, "e1")
    result = next(e for e in events if isinstance(e, ToolOutput))
    assert [e.id for e in result.elements] == ["hb:leave", "hb:leave#0", "hb:leave#1"]
    ended = next(e for e in events if isinstance(e, TurnEnded))
    assert ended.answer == reply.answer and ended.citations == reply.citations
    # a second turn: the same sources keep their numbers, new ones follow
    publish_turn(
        client, keys, trace_id="e1", turn_id="t2", agent="reader", text="And travel? do: search(travel) search(leave)"
    )
    wait_replies(client, keys, 2)
    last = bodies(model)[-1]["messages"]
    travel, again = [m["content"] for m in last if m["role"] == "tool"][-2:]
    assert (
        travel.startswith('<document id="4" cite="[4]" title="Travel policy"')
        and '<passage id="5" cite="[5]"' in travel
    )
    assert again == LEAVE_LAYOUT
    verified(services, "e1", 4)
    shown = cli(services, "trace", "show", "e1")
    assert "[2] Leave policy — https://handbook.example/leave" in shown.stdout


def test_the_apps_own_element_and_event_reach_the_model_and_trace_show_reads_them_without_the_app(
    client, keys, services, model
):
    publish_turn(client, keys, trace_id="e2", turn_id="t1", agent="reader", text="do: ticket(42) remember(buy milk)")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended"
    messages = bodies(model)[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert (
        messages[3]["content"]
        == '<ticket id="1" cite="[1]" status="open">Ticket 42: the printer on floor 2 is broken.</ticket>'
    )
    assert messages[4]["content"] == "Noted."
    assert messages[5] == {"role": "user", "content": "[note from tool] buy milk"}  # the app's renderer
    events = events_of(client, keys, "e2")
    assert Note(turn_id="t1", text="buy milk") in events
    assert [c.id for c in reply.citations] == ["T-42"]
    verified(services, "e2", 2)
    shown = cli(services, "trace", "show", "e2")  # read without the app: its types are shown as stored
    assert shown.returncode == 0, shown.stderr
    assert (
        '? note (a type this app does not register; as stored): {"type": "note", "turn_id": "t1", "text": "buy milk"'
        in shown.stdout
    )
    as_json = [json.loads(line) for line in cli(services, "trace", "show", "e2", "--json").stdout.splitlines()]
    assert {"type": "note", "turn_id": "t1", "text": "buy milk", "author": "tool"}.items() <= next(
        e for e in as_json if e["type"] == "note"
    ).items()


def test_a_tool_that_returns_an_unregistered_or_oversized_element_gets_an_error_result(client, keys, services, model):
    publish_turn(
        client, keys, trace_id="e3", turn_id="t1", agent="reader", text="do: bad_element(x) huge_image(y) picture(cat)"
    )
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended"
    tools = [m for m in bodies(model)[1]["messages"] if m["role"] == "tool"]
    assert tools[0]["content"].startswith(
        "Error: the result of tool 'bad_element', element 0 is a Stray, which the app does not register"
    )
    assert "over the limit" in tools[1]["content"]
    assert tools[2]["content"] == '<image id="1" url="https://img.example/cat.png"/>'
    # a tool message carries text only: the images follow the results in one user message
    assert bodies(model)[1]["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "The images that the tool results above returned:"},
            {"type": "image_url", "image_url": {"url": "https://img.example/cat.png"}},
        ],
    }
    errors = {e.name: e.error for e in events_of(client, keys, "e3") if isinstance(e, ToolOutput)}
    assert errors == {"bad_element": "invalid_result", "huge_image": "invalid_result", "picture": None}


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n tiny").decode()


def test_a_turn_carrying_a_document_and_images_reaches_the_model_with_max_images(client, keys, services, model):
    turn = {
        "trace_id": "e4",
        "turn_id": "t1",
        "agent": "viewer",
        "text": "What do these show?",
        "elements": [
            {"kind": "document", "id": "upload:memo", "title": "Memo", "text": "Meet at 10 <sharp>."},
            {"kind": "image", "id": "img:a", "url": "https://img.example/a.png"},
            {"kind": "image", "id": "img:b", "media_type": "image/png", "data": PNG},
        ],
    }
    client.execute_command("XADD", keys.turns, "*", "turn", json.dumps(turn))  # as any backend publishes it
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "ended"
    user = bodies(model)[0]["messages"][1]
    assert user == {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": '<document id="1" title="Memo">Meet at 10 &lt;sharp&gt;.</document>\n'
                '<image id="2" url="https://img.example/a.png"/>\n'
                '<image id="3" media_type="image/png"/>\n\n'
                "What do these show?\n[1 older image left out: the request holds at most 1]",
            },
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},  # the newest image
        ],
    }
    stored = next(e for e in events_of(client, keys, "e4") if type(e).__name__ == "TurnInput")
    assert stored.elements == (
        Document(id="upload:memo", title="Memo", text="Meet at 10 <sharp>."),
        Image(id="img:a", url="https://img.example/a.png"),
        Image(id="img:b", media_type="image/png", data=PNG),
    )
    verified(services, "e4", 1)


def test_a_turn_with_a_bad_element_fails_with_a_reason_naming_it(client, keys, services):
    message = TurnMessage(
        trace_id="e5",
        turn_id="t1",
        agent="viewer",
        text="Look",
        elements=(Image(id="img", media_type="image/png", data="not base64!"),),
    )
    client.xadd(keys.turns, {TURN_FIELD: codec.encode(message)})
    client.execute_command(
        "XADD",
        keys.turns,
        "*",
        "turn",
        json.dumps(
            {
                "trace_id": "e6",
                "turn_id": "t1",
                "agent": "viewer",
                "text": "Look",
                "elements": [{"kind": "video", "id": "v"}],
            }
        ),
    )
    replies = {r.trace_id: r for r in wait_replies(client, keys, 2)}
    assert (
        replies["e5"].code == "bad_turn"
        and "`$.elements`, element 0 (id 'img'): data is not valid base64" in replies["e5"].reason
    )
    assert replies["e6"].code == "bad_turn" and "$.elements[0]" in replies["e6"].reason


def test_a_long_conversation_keeps_cited_sources_full_while_uncited_ones_shrink_and_explain_says_why(
    client, keys, services, model
):
    topics = [f"t{n}" for n in range(1, 9)]
    for n, topic in enumerate(topics, 1):
        # each answer cites the second passage of its own topic ("cite: 2": the third cite attribute shown)
        publish_turn(
            client,
            keys,
            trace_id="e7",
            turn_id=f"turn-{n}",
            agent="long",
            text=f"About {topic}? do: search({topic}) cite: 2",
        )
        wait_replies(client, keys, n)
    replies = wait_replies(client, keys, len(topics))
    assert all(r.status == "ended" for r in replies), [r.reason for r in replies]
    # the answer of turn 1 cited [3] (hb:t1#1), and nothing cited hb:t1#0 ([2])
    assert [c.id for c in replies[0].citations][0] == "hb:t1#1"
    last = bodies(model)[-1]["messages"]
    first_result = next(m["content"] for m in last if m["role"] == "tool")
    assert first_result.startswith("[result r1 of search"), first_result
    # the cited source keeps its text; shown without its document, it names it
    assert '\n<passage id="3" cite="[3]" document="1" chunk="1">Fact two about t1: it is rule t1-2. ' in first_result
    assert "Fact one about t1" not in first_result  # the uncited one lost it (compressed) or left (stubbed)
    newest = [m["content"] for m in last if m["role"] == "tool"][-1]
    assert "Fact one about t8" in newest and "Fact two about t8" in newest  # the running turn is whole
    explained = cli(services, "trace", "explain", "e7", "--step", "1", "--turn", "turn-8", "--app", APP)
    assert explained.returncode == 0, explained.stderr
    assert "r1 (call_" in explained.stdout and "a floor keeps source 3 (hb:t1#1) full" in explained.stdout, (
        explained.stdout
    )
    assert (
        "stubbed by Stub(where=turns[:-4]" in explained.stdout
        or "compressed by Compress(where=turns[:-2]" in explained.stdout
    )
    # reopen by number: the model asks for source 2 again and reads its text
    publish_turn(
        client, keys, trace_id="e7", turn_id="turn-9", agent="long", text="Show 2 again. do: reopen(2) cite: 0"
    )
    assert wait_replies(client, keys, 9)[-1].status == "ended"
    reopened = [m for m in bodies(model)[-1]["messages"] if m["role"] == "tool"][-1]["content"]
    assert '<passage id="2" cite="[2]" chunk="0">Fact one about t1' in reopened and reopened.startswith(
        '<document id="1"'
    )
    # and by result handle: the whole result, under its handle
    publish_turn(
        client, keys, trace_id="e7", turn_id="turn-10", agent="long", text="Show r2 again. do: reopen(r2) cite: 0"
    )
    assert wait_replies(client, keys, 10)[-1].status == "ended"
    reopened = [m for m in bodies(model)[-1]["messages"] if m["role"] == "tool"][-1]["content"]
    assert reopened.startswith('[result r2 of search, shown again]\n<document id="4" cite="[4]" title="Page t2"')
    assert "Fact one about t2" in reopened and "Fact two about t2" in reopened
    verified(services, "e7", 20)


def test_a_stored_type_the_agent_cannot_render_fails_the_turn_with_the_reason_never_skipped(client, keys, services):
    # an older app version recorded a type this one lacks, and the app's own Note, which `viewer` has no renderer for
    trace = keys.trace("e8")
    client.xadd(trace, {b"v": b"1", b"e": codec.encode(Note(turn_id="t0", text="from before")), b"k": b"event:old:0"})
    publish_turn(client, keys, trace_id="e8", turn_id="t1", agent="viewer", text="Hello")
    (reply,) = wait_replies(client, keys, 1)
    assert reply.status == "failed" and reply.code == "context" and "no renderer for event type Note" in reply.reason
    client.xadd(keys.trace("e9"), {b"v": b"1", b"e": b'{"type":"legacy_thing","turn_id":"t0"}', b"k": b"event:old:1"})
    publish_turn(client, keys, trace_id="e9", turn_id="t1", agent="reader", text="Hello")
    replies = {r.trace_id: r for r in wait_replies(client, keys, 2)}
    assert (
        replies["e9"].code == "context"
        and "type 'legacy_thing', which this app does not register" in replies["e9"].reason
    )
