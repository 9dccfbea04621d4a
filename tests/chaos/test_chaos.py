"""The chaos test (bounded for CI): kill -9 random service processes at random moments while a
few hundred turns with parallel tool calls run; every turn ends, every call has exactly one
result, no side effect runs twice, nothing is lost (issue 4). The longer run is bench/chaos.py."""

from __future__ import annotations

import pytest

from tests.support.chaos import ChaosConfig, ChaosRun

pytestmark = pytest.mark.e2e


def test_kill_9_chaos_every_turn_ends_exactly_once(redis_url, namespace, tmp_path, capsys):
    config = ChaosConfig(conversations=75, turns_per_conversation=4, publish_over_s=30.0, kill_every_s=(0.5, 2.0), seed=7)
    result = ChaosRun(redis_url, namespace, tmp_path, config).run()
    with capsys.disabled():
        print("\nchaos figures:\n" + result.report())
    assert result.turns == 300
    assert result.kills >= 10 and result.kills_holding_work >= 3
    assert result.lost == [], result.lost[:10]  # every turn ended
    assert result.failed_without_reason == 0  # a failure always says why
    assert result.duplicates == 0  # one result per call, no side effect twice
    assert result.dangling_calls == 0 and result.stray_results == 0
    assert result.missing_replies == 0
    assert result.left_pending == 0  # C15: nothing stuck in a PEL
