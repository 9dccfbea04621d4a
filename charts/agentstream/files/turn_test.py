"""`helm test`: publish one turn on the turns stream and wait for its reply, as a backend would.

Exit status 0 when the reply says the turn ended with an answer; 1 when it failed or no reply came
within TEST_TIMEOUT_S seconds; 2 when Redis cannot be reached. Settings from the environment:
REDIS_URL (``redis+cluster://`` / ``rediss+cluster://``: a Redis Cluster), AGENTSTREAM_NAMESPACE,
AGENTSTREAM_PARTITIONS, TEST_AGENT, TEST_TEXT, TEST_TIMEOUT_S. Only redis-py and the standard
library: the wire format is plain JSON in stream fields (see `agentstream schema turn`), and the
turn goes to its trace's partition of the turns stream as any backend computes it: CRC-32 of the
trace id's UTF-8 bytes mod AGENTSTREAM_PARTITIONS, ``<ns>:turns`` for 0, ``<ns>:turns:p<k>`` else.
"""

import json
import os
import sys
import time
import uuid
import zlib

import redis
from redis.cluster import RedisCluster


def main() -> int:
    namespace = os.environ.get("AGENTSTREAM_NAMESPACE", "agentstream")
    timeout_s = float(os.environ.get("TEST_TIMEOUT_S", "180"))
    replies = f"{namespace}:replies"
    url = os.environ["REDIS_URL"]
    scheme, sep, rest = url.partition("://")
    if scheme in ("redis+cluster", "rediss+cluster"):
        client = RedisCluster.from_url(scheme.split("+")[0] + sep + rest, socket_timeout=10)
    else:
        client = redis.Redis.from_url(url, socket_timeout=10)
    partitions = int(os.environ.get("AGENTSTREAM_PARTITIONS") or 1)
    try:
        newest = client.xrevrange(replies, count=1)
    except (redis.RedisError, OSError) as exc:
        print(f"cannot reach Redis: {exc}", file=sys.stderr)
        return 2
    after = newest[0][0] if newest else b"0-0"
    turn = {
        "trace_id": f"helm-test-{uuid.uuid4().hex}",
        "turn_id": uuid.uuid4().hex,
        "agent": os.environ.get("TEST_AGENT", "demo"),
        "text": os.environ.get("TEST_TEXT", "What is 2 + 2?"),
        "metadata": {"source": "helm-test"},
    }
    partition = zlib.crc32(turn["trace_id"].encode()) % partitions
    turns = f"{namespace}:turns" if partition == 0 else f"{namespace}:turns:p{partition}"
    entry = client.xadd(turns, {"turn": json.dumps(turn)})
    print(f"published turn {turn['turn_id']} of trace {turn['trace_id']} ({entry.decode()}); waiting for its reply")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, entries in client.xread({replies: after}, block=1000, count=100) or []:
            for entry_id, fields in entries:
                after = entry_id
                try:
                    reply = json.loads(fields.get(b"reply", b"{}"))
                except ValueError:
                    continue
                if reply.get("turn_id") != turn["turn_id"]:
                    continue
                print(json.dumps(reply, indent=2))
                if reply.get("status") == "ended":
                    return 0
                print(f"the turn failed: {reply.get('code')}: {reply.get('reason')}", file=sys.stderr)
                return 1
    print(f"no reply within {timeout_s:.0f} s: are the agent loop and the tool workers running?", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
