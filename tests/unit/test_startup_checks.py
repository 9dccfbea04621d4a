"""The start-up refusals' decisions, without Redis (agentstream.ops.startup): settings that
contradict each other, a Redis in the other mode than its URL, a pool too small for the
connections a service holds at once. Each refusal is one line naming what to write instead."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest

from agentstream.ops.settings import Settings
from agentstream.ops.startup import (
    HOUSEKEEPING_CONNECTIONS,
    ConnectionNeed,
    cluster_mismatch,
    connections_needed,
    contradictions,
    pool_refusal,
)
from agentstream.runtime.consumer import ConsumerConfig
from agentstream.runtime.runner import runner_connections

DEFAULTS = {"min_idle_ms": 60_000, "lease_ttl_ms": 30_000, "block_ms": 2000, "consumer_delete_idle_ms": 3_600_000}


def test_the_defaults_agree() -> None:
    assert contradictions(**DEFAULTS) == []
    Settings(_env_file=None)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("changes", "named", "floor"),
    [
        ({"consumer_delete_idle_ms": 3000}, "AGENTSTREAM_MIN_IDLE_MS", 60_000),  # the field case
        ({"consumer_delete_idle_ms": 20_000, "min_idle_ms": 1000}, "AGENTSTREAM_LEASE_TTL_MS", 30_000),
        (
            {"consumer_delete_idle_ms": 5000, "min_idle_ms": 1000, "lease_ttl_ms": 1000, "block_ms": 3000},
            "AGENTSTREAM_BLOCK_MS",
            6000,
        ),
    ],
)
def test_a_pruning_threshold_below_what_live_workers_reach_is_refused(
    changes: dict[str, int], named: str, floor: int
) -> None:
    (reason,) = contradictions(**(DEFAULTS | changes))
    assert f"AGENTSTREAM_CONSUMER_DELETE_IDLE_MS={changes['consumer_delete_idle_ms']}" in reason
    assert named in reason and f"{floor} ms" in reason and f"at least {floor}" in reason
    assert "\n" not in reason


def test_pruning_at_the_floors_or_off_is_accepted() -> None:
    assert contradictions(**(DEFAULTS | {"consumer_delete_idle_ms": 60_000})) == []  # exactly the claim idle time
    assert contradictions(**(DEFAULTS | {"consumer_delete_idle_ms": 0})) == []  # never deletes
    fast = {"min_idle_ms": 1000, "lease_ttl_ms": 1000, "block_ms": 100, "consumer_delete_idle_ms": 1000}
    assert contradictions(**fast) == []


def test_settings_refuse_the_contradiction_with_its_reason() -> None:
    with pytest.raises(pydantic.ValidationError, match="AGENTSTREAM_CONSUMER_DELETE_IDLE_MS=3000 is below"):
        Settings(_env_file=None, consumer_delete_idle_ms=3000)  # type: ignore[call-arg]


def test_the_command_line_says_it_in_one_line(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTSTREAM_CONSUMER_DELETE_IDLE_MS": "3000"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentstream", "serve", "tool-worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        "error: bad setting: AGENTSTREAM_CONSUMER_DELETE_IDLE_MS=3000 is below AGENTSTREAM_MIN_IDLE_MS"
    )


def test_a_cluster_node_behind_a_plain_url_is_refused_naming_the_cluster_scheme() -> None:
    reason = cluster_mismatch(url_is_cluster=False, server_is_cluster=True, address="10.0.0.5:7000")
    assert reason and "write redis+cluster://10.0.0.5:7000" in reason and "AGENTSTREAM_REDIS_CLUSTER=true" in reason
    reverse = cluster_mismatch(url_is_cluster=True, server_is_cluster=False, address="10.0.0.5:6379")
    assert reverse and "write redis://10.0.0.5:6379/0" in reverse
    assert cluster_mismatch(url_is_cluster=True, server_is_cluster=True, address="a:1") is None
    assert cluster_mismatch(url_is_cluster=False, server_is_cluster=False, address="a:1") is None


def test_connections_needed_count_blocking_readers_and_the_shared_connection() -> None:
    # an agent loop over 3 partitions: turns and wake-ups consumers per partition, listeners
    runners = [(1, 16)] * 6 + [(1, 0)] * 5
    need = connections_needed(runners, multiplexed=True)
    assert (need.blocking_readers, need.handlers, need.total) == (11, 96, 12)
    unshared = connections_needed(runners, multiplexed=False)
    assert unshared.total == 11 + 96 + HOUSEKEEPING_CONNECTIONS
    with pytest.raises(ValueError, match="counts"):
        connections_needed([(-1, 0)], multiplexed=True)


def test_a_pool_too_small_is_refused_with_the_number_needed() -> None:
    need = ConnectionNeed(blocking_readers=5, handlers=32, multiplexed=True)
    reason = pool_refusal(need, 3)
    assert reason and "max_connections=3 is below the 6 connections" in reason and "at least 6" in reason
    assert "5 blocking readers, 1 shared" in reason
    assert pool_refusal(need, 6) is None
    per_node = pool_refusal(need, 2, per_node=True)
    assert per_node and "max_connections=2 per node" in per_node


def test_a_runner_counts_its_blocking_read_and_its_concurrency() -> None:
    class Consumer:
        config = ConsumerConfig(concurrency=8)

    class Listener:
        pass

    class Declared:
        connections = (3, 0)

    assert runner_connections(Consumer()) == (1, 8)
    assert runner_connections(Listener()) == (1, 0)
    assert runner_connections(Declared()) == (3, 0)


def test_the_mcp_hosts_list_of_servers_is_not_a_declaration_of_connections(tmp_path) -> None:
    # a tool worker with MCP servers stopped at startup: its McpHost's `connections` (its servers)
    # was read as (blocking reads, handlers)
    from agentstream import McpServer
    from agentstream.mcp_tools.host import McpHost
    from agentstream.wire.keys import Keys

    servers = [McpServer(name=n, command=["true"]) for n in ("a", "b")]
    host = McpHost(servers, redis=None, keys=Keys("t"))  # type: ignore[arg-type]
    assert runner_connections(host) == (1, 0)
