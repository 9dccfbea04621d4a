"""An MCP tool result as agentstream's tool result (text, data, elements, error).

The mapping (MCP specification, "Tool Result" content types):

- ``text`` blocks: joined with newlines, the result text the model reads;
- ``structuredContent``: the result's data (and its text, as JSON, when no text block came);
- ``image`` blocks: :class:`~agentstream.wire.events.Image` elements (base64 data and MIME type); an
  image the tool worker would refuse (a type the endpoints do not take, bad base64, over the size
  limit) is a line in the text instead, so the rest of the result still reaches the model;
- ``resource`` blocks (embedded resources): a text resource becomes a
  :class:`~agentstream.wire.events.Document` (its URI as id, its text as the citable content), an
  image blob an Image, any other blob a line in the text saying what was left out;
- ``resource_link`` blocks: a Document without text (title, URL) the model can cite;
- ``audio`` blocks: a line in the text (no endpoint here takes audio in a tool result);
- ``isError: true``: an error result (code ``tool_error``) whose text is the server's message.

Element ids of content without a URI are ``mcp:<server>/<tool>/<call id>#<block index>``, so they
stay unique across a trace.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

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

from agentstream.declarations.tools import ToolResult
from agentstream.wire.events import Document, Element, Image
from agentstream.wire.registry import check_image

TOOL_ERROR = "tool_error"


def _blob_size(blob: str) -> int:
    try:
        return len(base64.b64decode(blob, validate=False))
    except (binascii.Error, ValueError):
        return len(blob)


def _add_image(image: Image, texts: list[str], elements: list[Element]) -> None:
    """An image the endpoints can take becomes an element; any other (an unsupported type, bad
    base64, over the size limit of :func:`agentstream.wire.registry.check_image`) a line saying why."""
    try:
        check_image(image, f"image {image.id}")
    except ValueError as exc:
        texts.append(f"[{exc}; not shown]")
        return
    elements.append(image)


def content_elements(blocks: Sequence[Any], *, element_id: str) -> tuple[list[str], list[Element]]:
    """MCP content blocks → (text parts, elements); the one place content becomes elements.

    Args:
        blocks: a result's ``content``.
        element_id: the id prefix of elements without a URI of their own (``#<index>`` is added).
    """
    texts: list[str] = []
    elements: list[Element] = []
    for index, block in enumerate(blocks):
        own_id = f"{element_id}#{index}"
        match block:
            case TextContent(text=text):
                texts.append(text)
            case ImageContent(data=data, mime_type=mime):
                _add_image(Image(id=own_id, media_type=mime, data=data), texts, elements)
            case EmbeddedResource(resource=TextResourceContents(uri=uri, text=text, mime_type=mime)):
                properties = {"mime_type": mime} if mime else {}
                url = str(uri) if str(uri).startswith(("http://", "https://")) else ""
                elements.append(Document(id=str(uri), text=text, url=url, properties=properties))
            case EmbeddedResource(resource=BlobResourceContents(uri=uri, blob=blob, mime_type=mime)):
                if mime and mime.startswith("image/"):
                    _add_image(Image(id=str(uri), media_type=mime, data=blob), texts, elements)
                else:
                    texts.append(
                        f"[binary resource {uri} ({mime or 'unknown type'}, {_blob_size(blob)} bytes) not shown]"
                    )
            case ResourceLink(uri=uri, name=name, title=title, description=description, mime_type=mime):
                properties = {"mime_type": mime} if mime else {}
                url = str(uri) if str(uri).startswith(("http://", "https://")) else ""
                elements.append(
                    Document(id=str(uri), title=title or name, url=url, text=description or "", properties=properties)
                )
            case AudioContent(mime_type=mime, data=data):
                texts.append(f"[audio ({mime}, {_blob_size(data)} bytes) not shown]")
            case _:
                texts.append(f"[content of type {getattr(block, 'type', type(block).__name__)!r} not shown]")
    return texts, elements


def result_value(result: CallToolResult, *, server: str, tool: str, call_id: str) -> ToolResult:
    """The tool result the model sees for an MCP ``CallToolResult``.

    Args:
        result: what the server answered.
        server: the MCP server's name (for element ids and the error text).
        tool: the tool's name.
        call_id: the tool call's id.
    """
    texts, elements = content_elements(result.content, element_id=f"mcp:{server}/{tool}/{call_id}")
    data = result.structured_content
    text = "\n".join(texts)
    if not texts and data is not None:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    if result.is_error:
        shown = text.strip() or "no message"
        return ToolResult(
            text=f"Error: tool {tool!r} (MCP server {server!r}) reported an error: {shown}",
            data=data,
            error=TOOL_ERROR,
            elements=tuple(elements),
        )
    return ToolResult(text=text, data=data, elements=tuple(elements))
