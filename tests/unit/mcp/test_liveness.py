"""When an unanswered probe means an MCP server is dead (agentstream.mcp_tools.liveness)."""

from __future__ import annotations

import pytest

from agentstream.mcp_tools.liveness import probe_overdue


def test_an_idle_server_is_dead_once_the_probe_waited_its_time():
    kwargs = {"answer_within_s": 5.0, "calls_in_flight": 0, "longest_call_s": 60.0}
    assert not probe_overdue(waited_s=4.9, **kwargs)
    assert probe_overdue(waited_s=5.0, **kwargs)


def test_a_server_busy_with_calls_is_given_their_timeout_on_top():
    kwargs = {"answer_within_s": 5.0, "calls_in_flight": 2, "longest_call_s": 60.0}
    assert not probe_overdue(waited_s=5.0, **kwargs)
    assert not probe_overdue(waited_s=64.9, **kwargs)
    assert probe_overdue(waited_s=65.0, **kwargs)  # a hung server is still found while calls keep coming


@pytest.mark.parametrize(
    "bad",
    [{"waited_s": -1.0}, {"answer_within_s": 0.0}, {"calls_in_flight": -1}, {"longest_call_s": -0.5}],
)
def test_bad_durations_are_refused_by_name(bad):
    kwargs = {"waited_s": 1.0, "answer_within_s": 5.0, "calls_in_flight": 0, "longest_call_s": 60.0} | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        probe_overdue(**kwargs)
