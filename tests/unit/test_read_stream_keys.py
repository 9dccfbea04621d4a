"""The stream keys of XREAD/XREADGROUP as sent (agentstream.runtime.multiplex.read_stream_keys):
what routes a blocking read on a Redis Cluster without redis-py's COMMAND GETKEYS (issue 35)."""

from __future__ import annotations

import pytest

from agentstream.runtime.multiplex import read_stream_keys


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (("XREAD", "STREAMS", "a", "0-0"), ("a",)),
        (("XREAD", "COUNT", 500, "BLOCK", 1000, "STREAMS", "a", "b", "0-0", "$"), ("a", "b")),
        ((b"xread", b"block", b"10", b"streams", b"a", b">"), (b"a",)),
        (("XREADGROUP", "GROUP", "g", "c", "COUNT", 32, "BLOCK", 1000, "STREAMS", "s", ">"), ("s",)),
        (("XREADGROUP", "GROUP", "g", "c", "NOACK", "STREAMS", "s", "t", ">", ">"), ("s", "t")),
        (("XREADGROUP", "GROUP", "g", "c", "CLAIM", 60000, "STREAMS", "s", ">"), ("s",)),
        # a group and a consumer named as the keyword: names, not the keyword
        (("XREADGROUP", "GROUP", "STREAMS", "streams", "STREAMS", "s", ">"), ("s",)),
        # a key named as the keyword
        (("XREAD", "STREAMS", "STREAMS", "0-0"), ("STREAMS",)),
    ],
)
def test_the_keys_of_a_read_are_the_first_half_after_streams(args, keys):
    assert read_stream_keys(args) == keys


@pytest.mark.parametrize(
    "args",
    [
        ("XADD", "s", "*", "f", "v"),  # not a read
        ("XREAD",),
        ("XREAD", "COUNT", 5),  # no STREAMS
        ("XREAD", "STREAMS"),  # no keys
        ("XREAD", "STREAMS", "a", "b", "0-0"),  # keys and ids that do not pair up
        ("XREAD", "FUTURE", 1, "STREAMS", "a", "0-0"),  # an option not known: redis-py decides
        ("XREAD", "GROUP", "g", "c", "STREAMS", "a", "0-0"),  # GROUP is XREADGROUP's
        ("XREADGROUP", "COUNT", 1, "GROUP", "g", "c", "STREAMS", "a", ">"),  # GROUP must come first
        ("XREAD", b"\xff", "STREAMS", "a", "0-0"),  # not text
        (),
    ],
)
def test_a_form_not_known_is_none_so_redis_py_routes_it(args):
    assert read_stream_keys(args) is None
