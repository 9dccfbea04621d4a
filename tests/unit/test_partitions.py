"""Partitions of the work streams (agentstream.wire.keys): the documented function, stable across
processes and languages, and N = 1 keeping today's names exactly."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pydantic
import pytest

from agentstream.errors import ConfigError
from agentstream.wire.keys import Keys, check_namespace, check_queue_name, name_problem, partition_of, partition_stream


def test_one_partition_keeps_every_name_of_before() -> None:
    keys = Keys("ns")
    assert keys.partitions == 1
    assert keys.turns_for("any") == "ns:turns" and keys.wake_for("any") == "ns:wake"
    assert keys.tools_for("default", "any") == "ns:tools:default"
    assert keys.for_trace(keys.delegations, "x") == "ns:delegations"
    assert keys.work_streams(["default"]) == [
        "ns:turns",
        "ns:wake",
        "ns:cancel",
        "ns:approvals",
        "ns:delegations",
        "ns:child-endings",
        "ns:compactions",
        "ns:tools:default",
    ]


def test_the_partition_is_crc32_of_the_trace_ids_utf8_bytes_mod_n() -> None:
    # fixed values, so a backend in another language can check its own implementation against them
    assert [partition_of("c1", n) for n in (2, 3, 16)] == [1, 2, 1]  # CRC-32("c1") = 0x5ED72AA1
    assert [partition_of("conversation-42", n) for n in (2, 3, 16)] == [0, 2, 0]
    for trace_id in ["c1", "conversation-42", "ünïcode-trace", "a" * 200, ""]:
        for n in (1, 2, 3, 7, 16):
            assert partition_of(trace_id, n) == zlib.crc32(trace_id.encode("utf-8")) % n
    assert [partition_of(t, 3) for t in ("a", "b", "c", "d")] == [zlib.crc32(t.encode()) % 3 for t in "abcd"]
    assert partition_of("helm-test-1", 1) == 0


def test_the_partition_does_not_depend_on_the_process() -> None:
    # Python's hash() of a str changes with PYTHONHASHSEED; the partition must not
    code = "from agentstream.wire.keys import partition_of; print([partition_of(f't{i}', 5) for i in range(50)])"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(runs) == 1


def test_partition_streams_are_named_p_k_and_every_work_stream_is_partitioned_but_cancel_and_approvals() -> None:
    keys = Keys("ns", 3)
    assert keys.partitions_of(keys.turns) == ["ns:turns", "ns:turns:p1", "ns:turns:p2"]
    assert partition_stream("ns:wake", 0) == "ns:wake" and partition_stream("ns:wake", 2) == "ns:wake:p2"
    trace = next(t for t in (f"t{i}" for i in range(100)) if keys.partition(t) == 2)
    assert keys.turns_for(trace) == "ns:turns:p2"
    assert keys.wake_for(trace) == "ns:wake:p2" and keys.tools_for("q", trace) == "ns:tools:q:p2"
    streams = keys.work_streams(["q"])
    assert streams.count("ns:cancel") == 1 and "ns:cancel:p1" not in streams
    assert streams.count("ns:approvals") == 1 and "ns:approvals:p1" not in streams
    for base in ("ns:turns", "ns:wake", "ns:delegations", "ns:child-endings", "ns:compactions", "ns:tools:q"):
        assert all(s in streams for s in keys.partitions_of(base))
    assert len(streams) == 6 * 3 + 2


def test_partitions_spread_traces_over_every_partition() -> None:
    keys = Keys("ns", 4)
    counts = [0] * 4
    for i in range(4000):
        counts[keys.partition(f"trace-{i}")] += 1
    assert min(counts) > 800  # about 1000 each


def test_fewer_than_one_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="partitions must be 1 or more"):
        Keys("ns", 0)
    with pytest.raises(ValueError, match="partitions must be 1 or more"):
        partition_of("t", 0)


# --- names that could stand for another name's partition (issue 12, closing note, defect 2) -------

SUFFIXED = ["x:p1", "x:p2", "x:p12", "x:p0", "x:p01", "a:b:p3", ":p1", "mcp-srv:p7"]
"""Tool queue names ending in the partition suffix's form: refused."""
BRACED = ["a{b}", "a}b", "{x}", "a{b", "}"]
"""Names with a hash tag's characters: refused as tool queue names and as namespaces."""
USABLE = ["default", "x", "heavy.pool", "team:heavy", "x:p", "x:pp1", "x:P1", "xp1", "x:p1:y", "x:p1a", "p1", "x:p١"]
"""Look-alikes that no partition key can equal: accepted (``:p١`` is not ASCII digits)."""


@pytest.mark.parametrize("queue", SUFFIXED)
def test_a_queue_name_ending_in_the_partition_suffix_is_refused_naming_it_and_why(queue) -> None:
    with pytest.raises(ConfigError) as raised:
        check_queue_name(queue)
    message = str(raised.value)
    assert repr(queue) in message and "partition suffix" in message
    with pytest.raises(ConfigError, match="partition suffix"):
        Keys("ns").tools(queue)  # with one partition too: raising AGENTSTREAM_PARTITIONS later stays safe
    with pytest.raises(ConfigError, match="partition suffix"):
        Keys("ns", 3).tools_for(queue, "t1")


def test_the_refusal_says_which_queue_partition_it_would_be() -> None:
    with pytest.raises(ConfigError, match=r"partition 12 of queue 'x'"):
        check_queue_name("x:p12")
    with pytest.raises(ConfigError, match=r"has the form of one"):
        check_queue_name("x:p01")  # no partition is named so, but it reads like one


@pytest.mark.parametrize("name", BRACED)
def test_a_name_with_hash_tag_characters_is_refused_as_a_queue_and_as_a_namespace(name) -> None:
    with pytest.raises(ConfigError, match="hash tag") as raised:
        check_queue_name(name)
    assert repr(name) in str(raised.value)
    with pytest.raises(ConfigError, match="hash tag") as raised:
        Keys(name)
    assert "AGENTSTREAM_NAMESPACE" in str(raised.value)
    with pytest.raises(ConfigError, match="hash tag"):
        check_namespace(name)


@pytest.mark.parametrize("queue", USABLE)
def test_look_alike_queue_names_are_accepted_and_keep_their_keys(queue) -> None:
    assert check_queue_name(queue) == queue
    assert Keys("ns").tools(queue) == f"ns:tools:{queue}"  # the one-partition names of before


def test_no_two_usable_queue_names_share_a_stream_at_any_partition_count() -> None:
    # the kind of the defect: queue "x:p1" was partition 1 of queue "x"; with the rule, every
    # partition stream of every usable queue (and its dead-letter stream) is a name of its own
    for n in (1, 2, 3, 16):
        keys = Keys("ns", n)
        owner: dict[str, tuple[str, int]] = {}
        for queue in USABLE:
            for p, stream in enumerate(keys.partitions_of(keys.tools(queue))):
                for name in (stream, keys.dead(stream)):
                    assert owner.setdefault(name, (queue, p)) == (queue, p), (name, owner[name], (queue, p))
        with_refused = [f"{q}:p{k}" for q in USABLE for k in range(1, n)]
        assert all(name_problem(q, ends_a_stream=True) for q in with_refused)  # exactly those would collide


def test_the_namespace_may_end_in_a_suffix_or_hold_colons() -> None:
    # the namespace starts every key, so no partition suffix follows it directly
    for namespace in ("prod:agentstream", "ns:p1", "a.b-c"):
        assert Keys(namespace, 3).turns_for("t") in {
            f"{namespace}:turns",
            f"{namespace}:turns:p1",
            f"{namespace}:turns:p2",
        }
        assert check_namespace(namespace) == namespace


def test_tools_mcp_servers_and_settings_refuse_such_names_at_configuration() -> None:
    from agentstream.declarations.mcp_servers import McpServer
    from agentstream.declarations.tools import tool
    from agentstream.ops.settings import Settings

    with pytest.raises(ConfigError, match=r"tool 'lookup': tool queue name 'x:p1'.*partition 1 of queue 'x'"):

        @tool(queue="x:p1")
        def lookup(key: str) -> str:
            """Look a key up."""
            return key

    with pytest.raises(ConfigError, match=r"MCP server 'files': tool queue name 'files:p2'"):
        McpServer("files", command=["true"], queue="files:p2")
    assert McpServer("files", command=["true"]).queue == "mcp-files"
    with pytest.raises(pydantic.ValidationError, match="hash tag"):
        Settings(namespace="a}b")
    assert Settings(namespace="prod:agentstream").keys.turns == "prod:agentstream:turns"
