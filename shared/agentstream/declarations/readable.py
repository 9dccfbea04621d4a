"""What a tool returns, made readable and storable: bytes and broken Unicode (pure).

A tool may return bytes, or text that is not valid Unicode (a lone UTF-16 surrogate, as
``json.loads`` makes from a ``"\\ud800"`` escape, or ``os.fsdecode`` from a file name that is not
UTF-8). Neither may reach the model as noise, and neither may cost it the readable part:

- bytes that decode as UTF-8 are that text;
- bytes of an image in a format both provider formats accept (PNG, JPEG, GIF, WebP, sniffed from
  the content) within the size limit become an :class:`~agentstream.wire.events.Image` element,
  which goes to the model as an image;
- other bytes are described, not shown: their size, the type sniffed from the content (or
  "unknown type"), and a note that they are binary; ``data`` records the same figures;
- a lone surrogate in any text is replaced by U+FFFD (a pair written as two escapes becomes the
  one character it encodes); the rest of the text stays as it was.

The result is what the trace records, so a rebuild of the context shows the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec
import msgspec.structs

from agentstream.wire.events import Image
from agentstream.wire.registry import MAX_IMAGE_BYTES

# (magic bytes at offset 0, media type); the image types are those an Image element may carry
_IMAGES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_OTHERS: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"BZh", "application/x-bzip2"),
    (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (b"\x7fELF", "application/x-executable"),
    (b"SQLite format 3\x00", "application/vnd.sqlite3"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
    (b"ID3", "audio/mpeg"),
    (b"\x00\x00\x01\x00", "image/x-icon"),
    (b"BM", "image/bmp"),
)


def sniff(data: bytes) -> str | None:
    """The media type of ``data`` from its first bytes, or None when none of the known ones.

    Known: PNG, JPEG, GIF, WebP (RIFF....WEBP), WAV (RIFF....WAVE), PDF, ZIP, gzip, bzip2, xz,
    7z, ELF, SQLite, Ogg, FLAC, MP3 (ID3), ICO, BMP.
    """
    if data[:4] == b"RIFF" and len(data) >= 12:
        return {b"WEBP": "image/webp", b"WAVE": "audio/wav"}.get(data[8:12])
    for magic, media_type in (*_IMAGES, *_OTHERS):
        if data.startswith(magic):
            return media_type
    return None


def readable_text(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate replaced by U+FFFD (unchanged when it has none).

    A surrogate pair written as two code points (``"\\ud83d\\ude00"``) becomes the character it
    encodes, as UTF-16 reads it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def describe_bytes(data: bytes) -> str:
    """The text that stands for bytes that are neither text nor an image: size, type, a note."""
    kind = sniff(data) or "unknown type"
    return f"[binary content: {len(data)} bytes, {kind}; not text, so not shown]"


def bytes_data(data: bytes) -> dict[str, Any]:
    """What ``data`` records for described bytes: size, sniffed type, sha256 (hex)."""
    return {"binary": True, "bytes": len(data), "media_type": sniff(data), "sha256": hashlib.sha256(data).hexdigest()}


def bytes_value(data: bytes | bytearray | memoryview) -> tuple[str, Any, tuple[Image, ...]]:
    """Bytes a tool returned → ``(text, data, elements)`` of its result (see the module docstring).

    An image's element id is ``image-`` and the first 16 hex digits of its sha256, so the same
    bytes give the same element.
    """
    raw = bytes(data)
    try:
        return readable_text(raw.decode("utf-8")), None, ()
    except UnicodeDecodeError:
        pass
    media_type = sniff(raw)
    if media_type in {m for _, m in _IMAGES} | {"image/webp"} and len(raw) <= MAX_IMAGE_BYTES:
        digest = hashlib.sha256(raw).hexdigest()
        image = Image(id=f"image-{digest[:16]}", media_type=media_type, data=base64.b64encode(raw).decode("ascii"))
        return f"[image: {len(raw)} bytes, {media_type}]", None, (image,)
    return describe_bytes(raw), bytes_data(raw), ()


def readable_data(value: Any) -> Any:
    """JSON-compatible ``value`` with bytes inside made text or a description and every string
    (keys too) made :func:`readable_text`.

    ``value`` itself comes back when it has neither (the common case), and when it is nested too
    deep to walk (the trace's own check then refuses it, with the reason).
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return readable_text(value)
    try:
        if _encodes(value) and not _has_bytes(value):
            return value
        return _readable(value)
    except RecursionError:
        return value


def _encodes(value: Any) -> bool:
    try:
        msgspec.json.encode(value)
    except (TypeError, ValueError, UnicodeEncodeError, msgspec.EncodeError):
        return False
    return True


def _has_bytes(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    if isinstance(value, dict):
        return any(_has_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_bytes(v) for v in value)
    return False


def _readable(value: Any) -> Any:
    if isinstance(value, str):
        return readable_text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return readable_text(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return describe_bytes(raw)
    if isinstance(value, dict):
        return {readable_text(k) if isinstance(k, str) else k: _readable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_readable(v) for v in value]
    return value


def readable_element(element: Any) -> Any:
    """An element with each of its string fields (and its ``properties``) made readable; the
    element itself when nothing changes, or when it is not an element (checked later)."""
    if not isinstance(element, msgspec.Struct):
        return element
    changes: dict[str, Any] = {}
    for field in msgspec.structs.fields(element):
        value = getattr(element, field.name)
        if isinstance(value, str) or field.name == "properties":
            new = readable_data(value)
            if new != value or type(new) is not type(value):
                changes[field.name] = new
    return msgspec.structs.replace(element, **changes) if changes else element


def readable_result(text: Any, data: Any, error: Any, elements: Any) -> tuple[str, Any, Any, tuple[Any, ...]]:
    """A tool result's parts made readable and storable: ``(text, data, error, elements)``.

    ``text`` given as bytes is read as :func:`bytes_value` reads bytes (its image, if it is one,
    joins the elements; its figures become ``data`` when the result has none); text of another
    type is its ``str``. Strings in ``data``, ``error`` and the elements lose lone surrogates
    (:func:`readable_data`, :func:`readable_text`, :func:`readable_element`).
    """
    extra: tuple[Any, ...] = ()
    if isinstance(text, (bytes, bytearray, memoryview)):
        text, described, extra = bytes_value(text)
        if data is None:
            data = described
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    error = readable_text(error) if isinstance(error, str) else error
    return (
        readable_text(text),
        readable_data(data),
        error,
        (*(readable_element(e) for e in elements or ()), *extra),
    )
