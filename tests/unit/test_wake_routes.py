"""Sticky wake-ups' rules without Redis (agentstream.steps.wake_routes, agentstream.wire.keys):
which stream a wake-up goes to, who is stale, what a hand-over moves, which owner names may
name a stream, and where the streams of one partition sit (one hash slot on a Redis Cluster)."""

from __future__ import annotations

import msgspec
import pytest
from redis.crc import key_slot

from agentstream.errors import ConfigError
from agentstream.runtime.operations import RoutedWake, wake_entry
from agentstream.steps.wake_routes import OWNER, SHARED, Liveness, liveness, route, stale_owners, to_move
from agentstream.wire import codec
from agentstream.wire.events import ToolJob
from agentstream.wire.keys import OWNER_MAX_CHARS, Keys, owner_problem


@pytest.mark.parametrize(
    ("owner", "expiry_ms", "now_ms", "expected"),
    [
        ("p1", 2_000, 1_000, OWNER),  # alive
        ("p1", 1_000, 1_000, SHARED),  # its expiry is now: gone
        ("p1", 999, 1_000, SHARED),  # gone
        ("p1", None, 1_000, SHARED),  # never registered (or handed over)
        ("", 2_000, 1_000, SHARED),  # the job names no owner (an older agent loop's job)
        ("p1}{x", 2_000, 1_000, SHARED),  # a name that may not name a stream, even "registered"
        ("x" * (OWNER_MAX_CHARS + 1), 2_000, 1_000, SHARED),
    ],
)
def test_which_stream_a_wake_up_goes_to(owner, expiry_ms, now_ms, expected) -> None:
    assert route(owner, expiry_ms, now_ms) == expected


@pytest.mark.parametrize(
    ("min_idle_ms", "lease_ttl_ms", "expected"),
    [
        (60_000, 30_000, Liveness(30_000, 10_000)),  # the defaults: the lease is shorter
        (1_000, 1_000, Liveness(1_000, 333)),  # the tests' fast settings
        (10, 1_000, Liveness(300, 100)),  # never below 300 ms
        (5_000, 120_000, Liveness(5_000, 1_666)),
    ],
)
def test_an_owner_lives_as_long_as_the_shorter_of_claim_idle_time_and_lease(min_idle_ms, lease_ttl_ms, expected):
    assert liveness(min_idle_ms, lease_ttl_ms) == expected


def test_stale_owners_are_those_whose_expiry_passed_earliest_first_never_the_one_looking() -> None:
    expiries = {"a": 500, "b": 1_000, "c": 1_001, "me": 10, "d": 100}
    assert stale_owners(expiries, 1_000) == ["me", "d", "a", "b"]
    assert stale_owners(expiries, 1_000, me="me") == ["d", "a", "b"]
    assert stale_owners({}, 1_000) == []


@pytest.mark.parametrize(
    ("entries", "pending", "last", "expected"),
    [
        (["1-0", "2-0", "3-0"], [], "3-0", []),  # all read and acknowledged: nothing moves
        (["1-0", "2-0", "3-0"], ["2-0"], "3-0", ["2-0"]),  # read, not acknowledged
        (["1-0", "2-0", "3-0"], [], "1-0", ["2-0", "3-0"]),  # never read
        (["1-0", "2-0", "3-0", "4-0"], ["1-0", "3-0"], "3-0", ["1-0", "3-0", "4-0"]),
        (["1-0", "1-1", "2-0"], [], "1-0", ["1-1", "2-0"]),  # sequence numbers count
        (["1-0", "2-0"], [], None, ["1-0", "2-0"]),  # no group: everything is unread
        ([], [], "0-0", []),
    ],
)
def test_a_hand_over_moves_the_entries_the_group_did_not_acknowledge(entries, pending, last, expected) -> None:
    assert to_move(entries, pending, last) == expected


@pytest.mark.parametrize(
    ("owner", "allowed"),
    [
        ("p1", True),
        ("agent-loop-0", True),
        ("host.example.com-4242", True),
        ("pod@node:7", True),
        ("A_b", True),
        ("x" * OWNER_MAX_CHARS, True),
        ("x" * (OWNER_MAX_CHARS + 1), False),
        ("", False),
        ("-p1", False),  # begins with neither a letter nor a digit
        ("p1}{evil", False),
        ("{p1}", False),
        ("p 1", False),
        ("p1\n", False),
        ("../p1", False),
        ("p1/x", False),
        ("ünï", False),
        ("*", False),
    ],
)
def test_which_owner_names_may_name_a_wake_up_stream(owner, allowed) -> None:
    assert (owner_problem(owner) is None) == allowed


def test_an_owner_problem_does_not_quote_the_name() -> None:
    problem = owner_problem("x" * 100_000)
    assert problem is not None and len(problem) < 300


@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_a_partitions_owners_set_and_owner_streams_share_the_shared_streams_hash_slot(partitions) -> None:
    keys = Keys("ns", partitions)
    for p, shared in enumerate(keys.partitions_of(keys.wake)):
        slot = key_slot(shared.encode())
        assert key_slot(keys.wake_owners(p).encode()) == slot
        assert key_slot(keys.wake_owned(p, "agent-loop-1").encode()) == slot
        assert keys.wake_owned(p, "agent-loop-1") == f"{shared}:to:{{{shared}}}:agent-loop-1"
        assert keys.wake_owners(p) == f"{shared}:owners:{{{shared}}}"


def test_no_owner_stream_is_named_for_a_name_that_may_not_name_one() -> None:
    with pytest.raises(ConfigError, match="owner"):
        Keys("ns").wake_owned(0, "p1}{x")


def test_a_wake_up_is_routed_only_for_an_owner_name_that_may_name_a_stream() -> None:
    keys = Keys("ns", 4)
    routed = wake_entry(keys, "c1", "result:x", owner="p1")
    assert isinstance(routed, RoutedWake)
    p = keys.partition("c1")
    assert (routed.stream, routed.owners, routed.owned, routed.owner) == (
        keys.wake_for("c1"),
        keys.wake_owners(p),
        keys.wake_owned(p, "p1"),
        "p1",
    )
    for bogus in ("", "x" * 10_000, "p1}{x", "../p1", "p 1"):
        stream, fields = wake_entry(keys, "c1", "result:x", owner=bogus)  # a plain entry of the shared stream
        assert stream == keys.wake_for("c1")
        assert codec.decode_wake(fields[b"wake"]).reason == "result:x"


def test_a_tool_job_written_before_owners_existed_decodes_with_none() -> None:
    old = b'{"trace_id":"c1","turn_id":"t1","call_id":"k","name":"work","arguments":"{}"}'
    assert codec.decode_job(old).wake_to == ""
    job = ToolJob(trace_id="c1", turn_id="t1", call_id="k", name="work", arguments="{}")
    assert b"wake_to" not in codec.encode(job)  # no owner: the entry is as before
    assert msgspec.json.decode(codec.encode(msgspec.structs.replace(job, wake_to="p1")))["wake_to"] == "p1"
