"""Every key name agentstream builds starts with its namespace (``agentstream.wire.keys``' promise):
one ACL pattern (``~<namespace>:*``) then covers a deployment's keys, and two namespaces on one
Redis never share one. No Redis here; tests/integration/test_wire_acl.py runs the services under
that pattern."""

from __future__ import annotations

import inspect

import pytest
from redis.crc import key_slot

from agentstream.wire.keys import AGENT_LOOP_GROUP, Keys, attempts_key

ARGS = {
    "trace_id": "conv-1",
    "root_trace_id": "conv-1",
    "trace_key": None,
    "backend": "billing",
    "partition": 1,
    "owner": "agent-loop-1",
    "queue": "default",
    "server": "files",
    "stream": None,  # filled with a work stream
    "key_name": "k1",
    "window": 7,
    "tool_queues": ["default"],
}


def _names(keys: Keys) -> list[str]:
    """Every name a method or property of ``keys`` gives, called with sample arguments."""
    names: list[str] = []
    for attr, member in inspect.getmembers(type(keys)):
        if attr.startswith("_"):
            continue
        if isinstance(member, property):
            value = getattr(keys, attr)
        elif inspect.isfunction(member):
            params = [p for p in inspect.signature(member).parameters if p != "self"]
            if not params or any(p not in ARGS or ARGS[p] is None and p != "stream" for p in params):
                continue
            kwargs = {p: (keys.turns if p == "stream" else ARGS[p]) for p in params}
            value = member(keys, **kwargs)
        else:
            continue
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            names.extend(value)
    return names


@pytest.mark.parametrize("namespace", ["agentstream", "tenant-a"])
def test_every_key_name_starts_with_the_namespace(namespace):
    keys = Keys(namespace, 3, ("billing",))
    names = _names(keys)
    assert len(names) > 30, names  # the sample reaches the keys module's names
    streams = keys.work_streams(["default"]) + [keys.wake_owned(p, "agent-loop-1") for p in range(3)]
    names += [attempts_key(s, AGENT_LOOP_GROUP) for s in streams]
    outside = [n for n in names if not n.startswith(f"{namespace}:")]
    assert outside == [], outside


def slot(name: str) -> int:
    """The Redis Cluster hash slot of ``name`` (redis-py's implementation of the spec's CRC16 rule)."""
    return key_slot(name.encode())


@pytest.mark.parametrize("partition", [0, 2])
def test_a_streams_delivery_counts_and_an_owners_wake_ups_share_its_hash_slot(partition):
    keys = Keys("agentstream", 3)
    shared = keys.partitions_of(keys.wake)[partition]
    assert slot(attempts_key(shared, AGENT_LOOP_GROUP)) == slot(shared)
    owned = keys.wake_owned(partition, "agent-loop-1")
    assert slot(owned) == slot(keys.wake_owners(partition)) == slot(shared)
    assert slot(attempts_key(owned, AGENT_LOOP_GROUP)) == slot(shared)
