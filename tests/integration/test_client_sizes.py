"""Every stream the services read from clients checks a message's size first, with one reason
(:func:`agentstream.wire.checks.size_refusal`): a 5 MB cancel was reported as "JSON is malformed:
invalid character (byte 0)" while a 5 MB approval got the limit. On a real Redis, through the
agent loop's own consumers, on the shared streams and on a backend's."""

from __future__ import annotations

import pytest

from agentstream.testing import FunctionModel, TestBed
from agentstream.wire.keys import APPROVAL_FIELD, CANCEL_FIELD, TURN_FIELD
from tests.integration.test_approvals import rule, shop

pytestmark = pytest.mark.integration

BIG = b"\x00" * 5_000_000  # 5 MB, not JSON at all: the size is what is wrong first
SAID = "is 5,000,000 bytes, over the limit AGENTSTREAM_MAX_TURN_BYTES=524,288"


async def _errors(redis, keys) -> list[str]:
    return [fields[b"error"].decode() for _, fields in await redis.xrange(keys.errors)]


async def test_a_5_mb_message_on_any_clients_stream_is_refused_for_its_size(redis_url):
    async with TestBed(shop(), model=FunctionModel(rule), redis_url=redis_url, settings={"backends": "acme"}) as bed:
        redis = bed._started()[0]
        keys = bed.keys
        sent = [
            (keys.cancel, CANCEL_FIELD, "the cancel message"),
            (keys.backend_cancel("acme"), CANCEL_FIELD, "the cancel message"),
            (keys.approvals, APPROVAL_FIELD, "the approval message"),
            (keys.backend_approvals("acme"), APPROVAL_FIELD, "the approval message"),
            (keys.turns, TURN_FIELD, "the turn message"),
            (keys.backend_turns("acme"), TURN_FIELD, "the turn message"),
        ]
        for stream, field, _ in sent:
            await redis.xadd(stream, {field: BIG})
        await bed.run_until_idle()
        errors = await _errors(redis, keys)
    for stream, _, what in sent:
        said = [e for e in errors if f"{what} {SAID}" in e]
        assert said, (stream, [e[:200] for e in errors])
    assert not [e for e in errors if "malformed: invalid character" in e or "JSON is malformed" in e], errors
