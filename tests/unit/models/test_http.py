"""Retry-After parsing and the classification of HTTP failures (agentstream.models.http)."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from agentstream.errors import ModelConfigError, ModelInputRejected, ModelUnanswered
from agentstream.models.http import MAX_RETRY_AFTER_S, Retryable, check_status, retry_after_s, stream_error


def test_retry_after_in_seconds_or_as_an_http_date_capped():
    assert retry_after_s(httpx.Headers({"retry-after": "2.5"})) == 2.5
    assert retry_after_s(httpx.Headers({"retry-after": "99999"})) == MAX_RETRY_AFTER_S
    assert retry_after_s(httpx.Headers({"retry-after": "-3"})) == 0.0
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(httpx.Headers({"retry-after": soon})) <= 31
    assert retry_after_s(httpx.Headers({"retry-after": "soon-ish"})) is None
    assert retry_after_s(httpx.Headers({})) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (408, Retryable),
        (409, Retryable),
        (429, Retryable),
        (500, Retryable),
        (529, Retryable),
        (400, ModelInputRejected),
        (413, ModelInputRejected),
        (422, ModelInputRejected),
        (401, ModelConfigError),
        (403, ModelConfigError),
        (404, ModelConfigError),
        (402, ModelUnanswered),
    ],
)
def test_statuses(status, kind):
    response = httpx.Response(status, text="the key sk-x is wrong", headers={"retry-after": "1"})
    with pytest.raises(kind) as info:
        check_status(response, url="u", model="m", secrets=["sk-x"])
    assert "sk-x" not in str(info.value)
    if kind is Retryable:
        assert info.value.retry_after_s == 1.0 and info.value.status_code == status
    check_status(httpx.Response(200), url="u", model="m")


def test_errors_inside_a_stream():
    assert isinstance(
        stream_error({"type": "overloaded_error", "message": "Overloaded"}, url="u", model="m"), Retryable
    )
    assert isinstance(stream_error({"type": "server_error"}, url="u", model="m"), Retryable)
    assert isinstance(stream_error({"code": "invalid_api_key", "message": "no"}, url="u", model="m"), ModelConfigError)
    assert isinstance(stream_error({"type": "authentication_error"}, url="u", model="m"), ModelConfigError)
    assert isinstance(
        stream_error({"type": "invalid_request_error", "message": "bad"}, url="u", model="m"), ModelInputRejected
    )
    assert isinstance(stream_error("a plain text error", url="u", model="m"), ModelInputRejected)
