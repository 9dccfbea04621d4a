"""A tool that returns bytes or text that is not valid Unicode (issue 34 kind 3): the model sees
the readable part, images as images, other bytes described; the trace stores it and a rebuild of
the request gives the same bytes."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

import pytest

from agentstream import Agent, tool
from agentstream.app.base import invoke_tool
from agentstream.context import build_request
from agentstream.declarations.readable import bytes_value, readable_data, readable_text, sniff
from agentstream.models import formats
from agentstream.models.endpoints import ModelEndpoint
from agentstream.wire import codec
from agentstream.wire.events import Image, ModelOutput, ToolCall, ToolOutput, TurnInput
from agentstream.wire.registry import MAX_IMAGE_BYTES, NO_APP_TYPES, check_elements

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\n"
NOISE = bytes(range(128, 256)) * 3


def run(fn, arguments: str = "{}"):
    return asyncio.run(invoke_tool(tool(fn), arguments))


def test_bytes_that_are_utf8_are_shown_as_text():
    def read() -> bytes:
        """Read."""
        return "naïve café, 東京\n".encode()

    result = run(read)
    assert (result.text, result.data, tuple(result.elements), result.error) == ("naïve café, 東京\n", None, (), None)


def test_image_bytes_become_an_image_element_the_model_sees_as_an_image():
    def photo() -> bytes:
        """Photo."""
        return PNG

    result = run(photo)
    (image,) = result.elements
    assert isinstance(image, Image) and image.media_type == "image/png"
    assert base64.b64decode(image.data) == PNG
    assert image.id == "image-" + hashlib.sha256(PNG).hexdigest()[:16]
    assert result.text == f"[image: {len(PNG)} bytes, image/png]"
    check_elements(tuple(result.elements), NO_APP_TYPES, where="the result")  # what the worker checks


@pytest.mark.parametrize(
    ("data", "kind"),
    [(PDF, "application/pdf"), (NOISE, "unknown type"), (b"\x89PNG\r\n\x1a\n" + b"\xff" * 10, "image/png")],
)
def test_other_bytes_are_described_with_size_type_and_a_binary_note(data, kind):
    text, recorded, elements = bytes_value(data)
    if kind == "image/png":  # an image's magic but a body that is no image is still an image to the model
        assert elements and elements[0].media_type == "image/png"
        return
    assert elements == ()
    assert text == f"[binary content: {len(data)} bytes, {kind}; not text, so not shown]"
    assert recorded["bytes"] == len(data) and recorded["sha256"] == hashlib.sha256(data).hexdigest()
    assert "base64" not in text and base64.b64encode(data).decode()[:12] not in text


def test_an_image_over_the_size_limit_is_described_not_sent():
    big = PNG + b"\x00" * (MAX_IMAGE_BYTES + 1)
    text, recorded, elements = bytes_value(big)
    assert elements == () and "image/png" in text and recorded["bytes"] == len(big)


def test_bytes_inside_data_are_text_or_described_never_bare_base64():
    def lookup() -> dict:
        """Lookup."""
        return {"name": b"report.txt", "blob": PDF, "rows": [b"ok", 1]}

    result = run(lookup)
    assert result.data == {
        "name": "report.txt",
        "blob": f"[binary content: {len(PDF)} bytes, application/pdf; not text, so not shown]",
        "rows": ["ok", 1],
    }
    assert json.loads(result.text) == result.data


def test_a_lone_surrogate_is_replaced_and_the_rest_kept():
    assert readable_text("a\ud83db") == "a\ufffdb"
    assert readable_text("\ud83d\ude00 ok") == "\U0001f600 ok"  # a pair written as two code points
    assert readable_text("plain") == "plain"
    assert readable_data({"k\udfff": ["x\ud800", 2]}) == {"k\ufffd": ["x\ufffd", 2]}

    def echo() -> str:
        """Echo."""
        return "head \udc80 tail"

    assert run(echo).text == "head \ufffd tail"


def test_sniffed_types():
    assert sniff(PNG) == "image/png"
    assert sniff(b"\xff\xd8\xff\xe0....") == "image/jpeg"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff(b"RIFF\x00\x00\x00\x00WAVEfmt ") == "audio/wav"
    assert sniff(PDF) == "application/pdf"
    assert sniff(b"") is None and sniff(NOISE) is None


def test_the_stored_result_rebuilds_to_the_same_request_bytes():
    def mixed() -> bytes:
        """Mixed."""
        return PNG

    result = run(mixed)
    events = [
        TurnInput(turn_id="t1", agent="a", text="show me"),
        ModelOutput(turn_id="t1", step=0, tool_calls=(ToolCall(id="c1", name="mixed", arguments="{}"),)),
        ToolOutput(turn_id="t1", call_id="c1", name="mixed", text=result.text, elements=tuple(result.elements)),
    ]
    agent = Agent(name="a", system_prompt="s", tools=[tool(mixed)])
    endpoint = ModelEndpoint(id="m", provider="openai", base_url="http://x/v1", model="m")
    bodies = []
    for _ in range(2):
        stored = [codec.decode_entry(codec.encode_entry(e)) for e in events]
        bodies.append(formats.request_body(build_request(stored, agent, turn_id="t1", step=1), endpoint))
    assert bodies[0] == bodies[1]
    sent = json.loads(bodies[0])["messages"]
    assert sent[-1]["content"][1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
