"""The header block's limit (:class:`agentstream_services.gateway.perimeter.HeadCounter`): the
request line and headers as received, to the blank line that ends them, counted across reads."""

from __future__ import annotations

import json

import pytest

from agentstream_services.gateway.perimeter import HeadCounter, header_block_answer

LIMIT = 100


def _head(size: int, end: bytes = b"\r\n\r\n") -> bytes:
    start = b"GET /v1/agents HTTP/1.1\r\nX-Big: "
    return start + b"b" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(
    ("reads", "states"),
    [
        ([_head(LIMIT)], [("whole", LIMIT)]),
        ([_head(LIMIT + 1)], [("over", LIMIT + 1)]),
        ([_head(LIMIT, b"\n\n")], [("whole", LIMIT)]),
        ([_head(LIMIT) + b"body bytes after it"], [("whole", LIMIT)]),  # the body is not counted
        ([_head(60)[:30], _head(60)[30:]], [("more", 30), ("whole", 60)]),
        ([_head(60)[:58], _head(60)[58:]], [("more", 58), ("whole", 60)]),  # the end spans two reads
        ([_head(60)[:57], _head(60)[57:59], _head(60)[59:]], [("more", 57), ("more", 59), ("whole", 60)]),
        ([b"x" * 60, b"x" * 41], [("more", 60), ("over", 101)]),  # over before its end came
        ([b""], [("more", 0)]),
    ],
)
def test_the_header_block_is_counted_as_it_arrives(reads, states):
    counter = HeadCounter(LIMIT)
    assert [counter.feed(read) for read in reads] == states


def test_a_counter_starts_again_for_the_next_request_and_says_why_it_refused():
    counter = HeadCounter(LIMIT)
    assert counter.feed(_head(80)) == ("whole", 80)
    assert counter.feed(_head(90)) == ("whole", 90) and counter.refusal is None
    assert counter.feed(_head(20_000)) == ("over", 20_000)
    assert counter.refusal == (
        "the request's header block (request line and headers) is 20,000 bytes, over the limit "
        "AGENTSTREAM_GATEWAY_MAX_HEADER_BYTES=100"
    )
    partial = HeadCounter(LIMIT)
    partial.feed(b"x" * 150)
    assert partial.refusal is not None and "is more than 100 bytes (150 received)" in partial.refusal


def test_the_answer_is_a_431_with_a_json_reason():
    answer = header_block_answer("too big")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head and f"content-length: {len(body)}".encode() in head
    assert json.loads(body) == {"detail": "too big"}
