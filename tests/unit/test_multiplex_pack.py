"""The shared connection packs a command as redis-py's pooled connections do (the same bytes, the
same errors), taking hiredis's packer directly for a command named in one word."""

from __future__ import annotations

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError

from agentstream.runtime.multiplex import pack

pytest.importorskip("hiredis")

REDIS_PY = HiredisRespSerializer()


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "k1", "k2", "", 0, 1.5, b"\x00\xff bytes"),
        ("XADD", b"stream", "*", "f", "v"),
        (b"GET", "k"),
        ("XINFO STREAM", "s"),  # a name of two words: split
        ("SET", "k", bytearray(b"ab")),  # hiredis takes no bytearray: redis-py's packer converts it
        ("SET", "k", memoryview(b"ab")),
        ("SET", "k", "é"),
    ],
)
def test_a_command_packs_as_redis_py_packs_it(args):
    assert pack(args) == b"".join(REDIS_PY.pack(*args))


@pytest.mark.parametrize("bad", [None, True, {"a": 1}])
def test_an_argument_redis_has_no_form_for_raises_what_redis_py_raises(bad):
    with pytest.raises(DataError):
        pack(("SET", "k", bad))
