"""A FastStream backend that talks to agentstream over Redis with its own broker.

It publishes a turn on ``agentstream:turns`` (its trace's partition of it, with
``AGENTSTREAM_PARTITIONS``) and consumes the replies from
``agentstream:replies`` in a consumer group of its own; ``ask()`` returns the reply of the turn
it published. Run it beside the services (``agentstream dev`` prints REDIS_URL)::

    REDIS_URL=redis://localhost:6379/0 python examples/faststream_backend.py "What is 12 * 12?"

agentstream's wire is plain JSON fields (``agentstream schema asyncapi`` documents every
channel). FastStream's subscriber reads such an entry as the dict of its fields; its
``broker.publish(..., stream=...)`` would write its own envelope in one ``__data__`` field
instead, so the turn is written with the broker's own Redis connection (``await
broker.connect()``). Nothing here imports agentstream.
"""

import asyncio
import json
import os
import sys
import uuid
import zlib

from faststream import FastStream
from faststream.redis import RedisBroker, StreamSub
from pydantic import BaseModel, Json

NAMESPACE = os.environ.get("AGENTSTREAM_NAMESPACE", "agentstream")
PARTITIONS = int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1)
broker = RedisBroker(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
app = FastStream(broker)
waiting: dict[str, asyncio.Future] = {}  # turn id → the future its reply resolves


class Reply(BaseModel):
    trace_id: str
    turn_id: str
    status: str  # "ended" or "failed"
    answer: str | None = None
    code: str | None = None
    reason: str | None = None


class ReplyEntry(BaseModel):
    reply: Json[Reply]  # the field holds the reply's JSON


@broker.subscriber(stream=StreamSub(f"{NAMESPACE}:replies", group="faststream-backend", consumer="backend-1"))
async def on_reply(entry: ReplyEntry) -> None:
    future = waiting.pop(entry.reply.turn_id, None)  # replies are at-least-once: the first one wins
    if future is not None and not future.done():
        future.set_result(entry.reply)


def turns_stream(trace_id: str) -> str:
    """The turns stream of the trace's partition: CRC-32 of its UTF-8 bytes mod AGENTSTREAM_PARTITIONS
    (``<ns>:turns`` for partition 0, ``<ns>:turns:p<k>`` for the others)."""
    partition = zlib.crc32(trace_id.encode()) % PARTITIONS
    return f"{NAMESPACE}:turns" if partition == 0 else f"{NAMESPACE}:turns:p{partition}"


async def ask(text: str, *, agent: str = "demo", trace_id: str | None = None, timeout_s: float = 120.0) -> Reply:
    """Publish a turn and wait for its reply (the broker must be started)."""
    turn = {"trace_id": trace_id or uuid.uuid4().hex, "turn_id": uuid.uuid4().hex, "agent": agent, "text": text}
    waiting[turn["turn_id"]] = asyncio.get_running_loop().create_future()
    redis = await broker.connect()
    await redis.xadd(turns_stream(turn["trace_id"]), {"turn": json.dumps(turn)})
    return await asyncio.wait_for(waiting[turn["turn_id"]], timeout_s)


async def main(text: str) -> int:
    async with broker:
        await broker.start()
        reply = await ask(text)
    print(reply.answer if reply.status == "ended" else f"failed ({reply.code}): {reply.reason}")
    return 0 if reply.status == "ended" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(" ".join(sys.argv[1:]) or "What is 12 * 12?")))
