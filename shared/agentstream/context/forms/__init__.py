"""Forms of tool results and the shorten functions that make them (see :mod:`.shorten`)."""

from agentstream.context.forms.shorten import (
    COMPRESSED,
    DEFAULT_CUT,
    FULL,
    STUBBED,
    Form,
    Shorten,
    ShortenText,
    as_recorded,
    cap,
    checked,
    cut_text,
    drop_text,
    first_words,
    json_cap,
    sources,
)

__all__ = [
    "COMPRESSED",
    "DEFAULT_CUT",
    "FULL",
    "STUBBED",
    "Form",
    "Shorten",
    "ShortenText",
    "as_recorded",
    "cap",
    "checked",
    "cut_text",
    "drop_text",
    "first_words",
    "json_cap",
    "sources",
]
