"""Checks of a client's JSON text that a decoder does not make (pure: no Redis, no asyncio).

msgspec reads RFC 8259 JSON strictly, but three things a client may send pass it or fail it
with words that do not say what is wrong:

- :func:`duplicate_key`: an object that names a key twice. RFC 8259 §4 says names "SHOULD be
  unique" and leaves the meaning of duplicates to each reader (msgspec and Python's json keep
  the last one): a turn that says ``"agent"`` twice may be read one way by a backend's checks and
  another by the services, so the wire refuses it, naming the key and where it is.
- :func:`unicode_problem`: text that is not Unicode: bytes that are not UTF-8 (RFC 8259 §8.1)
  or a ``\\u`` escape of a lone UTF-16 surrogate (RFC 8259 §8.2; msgspec reports a lone high
  surrogate as "Input data was truncated"). It says what and at which byte, and in which key's
  value.
- :func:`control_character`: an id (a trace, turn or agent name: they name Redis keys and
  appear in logs) that holds a control or invisible format character (Unicode general category
  Cc, Cf, Zl or Zp: NUL, escape sequences, line breaks, bidirectional overrides).
"""

from __future__ import annotations

import json
import re
import unicodedata

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode general categories an id may not hold: controls (C0, DEL, C1), invisible format
characters (zero-width, bidirectional controls, BOM) and the line and paragraph separators."""


def control_character(text: str) -> str | None:
    """The first character of ``text`` in :data:`REFUSED_CATEGORIES`, described (``"U+0000 (a
    control character) at index 3"``), or None when there is none."""
    for index, char in enumerate(text):
        category = unicodedata.category(char)
        if category in REFUSED_CATEGORIES:
            kind = {"Cc": "a control character", "Cf": "an invisible format character"}.get(
                category, "a line separator"
            )
            return f"U+{ord(char):04X} ({kind}) at index {index}"
    return None


class _Pairs(list[tuple[str, object]]):
    """An object's (key, value) pairs as the JSON text had them (duplicates kept)."""


def duplicate_key(payload: bytes | str) -> tuple[str, str] | None:
    """The first key an object of ``payload`` names twice → ``(its object's path, the key)``, such
    as ``("$.metadata", "user")``; None when every object's keys are unique or the text is not
    JSON that Python's reader takes (the decoder reports that)."""
    try:
        document = json.loads(payload, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return None
    return _first_duplicate(document, "$")


def _first_duplicate(value: object, path: str) -> tuple[str, str] | None:
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, _ in value:
            if key in seen:
                return path, key
            seen.add(key)
        for key, item in value:
            found = _first_duplicate(item, f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]")
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_duplicate(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


_ESCAPE = re.compile(rb"(\\+)u([dD][0-9a-fA-F]{3})")
_KEY_BEFORE = re.compile(rb'"((?:[^"\\]|\\.){1,128})"\s*:\s*"')


def unicode_problem(payload: bytes | str) -> str | None:
    """What makes the strings of a JSON text not Unicode, and where → one sentence, or None.

    Finds bytes that are not UTF-8 and ``\\u`` escapes of a UTF-16 surrogate that is not half of
    a pair (a high one not followed by a low one, a low one not after a high one), with the
    byte offset and, when the text shows it, the key whose value holds it.
    """
    data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else bytes(payload)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"bytes {data[exc.start : exc.start + 4]!r} at byte {exc.start}{_in_key(data, exc.start)} are not UTF-8 "
            "(JSON text is UTF-8, RFC 8259 §8.1)"
        )
    previous_high_end = -1
    for match in _ESCAPE.finditer(data):
        if len(match.group(1)) % 2 == 0:  # an escaped backslash followed by "u...": not an escape
            continue
        code = int(match.group(2), 16)
        start = match.start(1) + len(match.group(1)) - 1  # the backslash of \u
        if 0xD800 <= code <= 0xDBFF:
            following = data[match.end() : match.end() + 6]
            if not re.fullmatch(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}", following):
                return _lone(data, start, code, "high", "not followed by a low surrogate escape (\\udc00-\\udfff)")
            previous_high_end = match.end()
        elif 0xDC00 <= code <= 0xDFFF:
            if start != previous_high_end:
                return _lone(data, start, code, "low", "not after a high surrogate escape (\\ud800-\\udbff)")
    return None


def arguments_unicode_refusal(tool: str, text: str) -> str | None:
    """Why a tool call's argument text is not Unicode JSON (:func:`unicode_problem`), as the
    sentence a model reads to correct the call, or None.

    Python's ``json.loads`` turns ``"\\ud800"`` into a string holding a lone surrogate, which no
    UTF-8 writer can encode: an MCP session's transport failed on it and dropped the session (its
    other calls with it), and a Python tool that wrote it out would fail the same way. The call
    is refused before it runs, with where the escape is.
    """
    problem = unicode_problem(text)
    if problem is None:
        return None
    return f"arguments for tool {tool!r} are not Unicode text: {problem}"


def _lone(data: bytes, offset: int, code: int, which: str, why: str) -> str:
    return (
        f"the escape \\u{code:04x} at byte {offset}{_in_key(data, offset)} is a lone {which} UTF-16 surrogate, {why}: "
        "a JSON string must be Unicode (RFC 8259 §8.2); send the character itself or both halves of its pair"
    )


def _in_key(data: bytes, offset: int) -> str:
    """`` (in the value of key `text`)`` when the string holding ``offset`` is an object's value."""
    found = None
    for match in _KEY_BEFORE.finditer(data, 0, offset):
        found = match
    if found is None:
        return ""
    between = data[found.end() : offset]
    if re.search(rb'(?<!\\)(?:\\\\)*"', between):  # the value's string ended before the offset
        return ""
    return f" (in the value of key `{found.group(1).decode('utf-8', 'replace')}`)"
