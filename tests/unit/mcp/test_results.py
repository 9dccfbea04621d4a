"""An MCP CallToolResult as agentstream's tool result (text, data, elements, error)."""

from __future__ import annotations

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from agentstream.mcp_tools.results import result_value
from agentstream.wire.events import Document, Image


def test_text_blocks_are_the_text_and_structured_content_the_data():
    result = CallToolResult(
        content=[TextContent(text="line 1"), TextContent(text="line 2")], structured_content={"n": 2}
    )
    value = result_value(result, server="s", tool="t", call_id="c1")
    assert (value.text, value.data, value.error, value.elements) == ("line 1\nline 2", {"n": 2}, None, ())
    only_data = result_value(
        CallToolResult(content=[], structured_content={"ok": True}), server="s", tool="t", call_id="c1"
    )
    assert only_data.text == '{"ok":true}'


def test_images_and_resources_become_elements():
    result = CallToolResult(
        content=[
            TextContent(text="see"),
            ImageContent(data="aGk=", mime_type="image/png"),
            EmbeddedResource(
                resource=TextResourceContents(uri="https://ex.com/a.txt", mime_type="text/plain", text="A text")
            ),
            EmbeddedResource(resource=BlobResourceContents(uri="file:///b.png", mime_type="image/png", blob="aGk=")),
            EmbeddedResource(
                resource=BlobResourceContents(uri="file:///c.bin", mime_type="application/zip", blob="aGVsbG8=")
            ),
            ResourceLink(uri="https://ex.com/doc", name="doc", title="The doc", description="A linked doc"),
            AudioContent(data="aGk=", mime_type="audio/wav"),
        ]
    )
    value = result_value(result, server="s", tool="t", call_id="c9")
    image, text_doc, blob_image, link = value.elements
    assert image == Image(id="mcp:s/t/c9#1", media_type="image/png", data="aGk=")
    assert text_doc == Document(
        id="https://ex.com/a.txt", text="A text", url="https://ex.com/a.txt", properties={"mime_type": "text/plain"}
    )
    assert blob_image == Image(id="file:///b.png", media_type="image/png", data="aGk=")
    assert link == Document(id="https://ex.com/doc", title="The doc", url="https://ex.com/doc", text="A linked doc")
    assert value.text.splitlines() == [
        "see",
        "[binary resource file:///c.bin (application/zip, 5 bytes) not shown]",
        "[audio (audio/wav, 2 bytes) not shown]",
    ]


def test_an_image_the_worker_would_refuse_is_a_line_and_the_rest_stays():
    huge = "A" * (8 * 1024 * 1024)
    result = CallToolResult(
        content=[
            TextContent(text="shots"),
            ImageContent(data=huge, mime_type="image/png"),
            ImageContent(data="not base64!", mime_type="image/png"),
            ImageContent(data="aGk=", mime_type="image/x-icon"),
        ]
    )
    value = result_value(result, server="s", tool="t", call_id="c")
    assert value.elements == () and value.error is None
    lines = value.text.splitlines()
    assert (
        lines[0] == "shots"
        and "over the limit" in lines[1]
        and "not valid base64" in lines[2]
        and "media_type" in lines[3]
    )


def test_an_error_result_is_an_error_the_model_reads():
    value = result_value(
        CallToolResult(content=[TextContent(text="disk full")], is_error=True),
        server="files",
        tool="write",
        call_id="c",
    )
    assert value.error == "tool_error"
    assert value.text == "Error: tool 'write' (MCP server 'files') reported an error: disk full"
    silent = result_value(CallToolResult(content=[], is_error=True), server="files", tool="write", call_id="c")
    assert silent.text.endswith("reported an error: no message")
