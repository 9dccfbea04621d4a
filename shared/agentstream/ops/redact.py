"""Secrets never shown: credentials inside URLs (``https://user:password@host/v1``).

A model endpoint's ``base_url`` (``OPENAI_BASE_URL``, a models-file ``base_url``) or a
``REDIS_URL`` may carry user-info; httpx and redis-py use it to authenticate, and agentstream
never logs, stores or shows it: every URL in a message goes through :func:`redact_url`, and
the adapters mask :func:`url_secrets` (with the API key) in any text that came from elsewhere
(a server's answer, an exception). RFC 3986 §3.2.1 deprecates passwords in URLs; they still
appear, so they are handled.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with its credentials masked: ``https://user:***@host/v1``, and a user name alone
    masked too (``https://***@host/v1``: some servers take a token there); an unparsable URL is
    shown as ``(unparsable URL)``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, _ = userinfo.partition(":")
    shown = f"{user}:{MASK}" if has_password else MASK
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def url_secrets(url: str | None) -> tuple[str, ...]:
    """The secrets inside a URL's user-info (as written and percent-decoded), longest first,
    for masking in text; empty without user-info."""
    if not url:
        return ()
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return ()
    if "@" not in netloc:
        return ()
    userinfo = netloc.rsplit("@", 1)[0]
    found = {userinfo, unquote(userinfo)}
    user, has_password, password = userinfo.partition(":")
    if has_password:  # a user name beside a password is shown; the password is the secret
        found = {password, unquote(password)}
    else:
        found.update({user, unquote(user)})
    return tuple(sorted((s for s in found if len(s) >= 3), key=len, reverse=True))
