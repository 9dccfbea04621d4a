"""Which entries run beside which in a process (runtime.consumer: is_suspect, group_limit,
runs_alone, may_enter) and when idle entries go before new ones (reclaim_owed): tables."""

import pytest

from agentstream.runtime.consumer import (
    ISOLATE_AFTER_STARTS,
    group_limit,
    is_suspect,
    may_enter,
    reclaim_owed,
    runs_alone,
)


@pytest.mark.parametrize(
    ("attempts", "concurrency", "max_deliveries", "suspect"),
    [
        (1, 64, 10, False),  # a first start
        (2, 64, 10, False),  # started once before: its process may have been killed with 63 others
        (3, 64, 10, True),  # started twice before without success: a suspect
        (10, 64, 10, True),
        (2, 64, 2, True),  # its last allowed start after a failed one
        (1, 64, 1, False),  # a first start is never a suspect, even the only one allowed
        (3, 1, 10, False),  # one handler at a time anyway: nothing to isolate
    ],
)
def test_an_entry_is_a_suspect_after_two_failed_starts_or_at_its_last(attempts, concurrency, max_deliveries, suspect):
    assert ISOLATE_AFTER_STARTS == 2
    assert is_suspect(attempts, concurrency, max_deliveries) is suspect


@pytest.mark.parametrize(
    ("attempts", "concurrency", "max_deliveries", "limit"),
    [
        (1, 64, 10, 64),
        (2, 64, 10, 64),  # one failed start: side by side with anyone, as many as the process runs
        (3, 64, 10, 32),  # two: half of the handlers, suspects only (all of them ran alone before)
        (4, 64, 10, 16),  # its group died again: half of that
        (5, 64, 10, 8),
        (6, 64, 10, 4),
        (7, 64, 10, 2),
        (8, 64, 10, 1),  # narrowed down to itself
        (9, 64, 10, 1),
        (10, 64, 10, 1),  # its last start: alone
        (3, 64, 3, 1),  # its last start comes before the halving ends: alone all the same
        (2, 64, 2, 1),
        (4, 16, 100, 4),
        (7, 16, 100, 1),  # never below 1
        (30, 16, 100, 1),
        (3, 2, 10, 1),
        (3, 1, 10, 1),  # one handler at a time anyway
    ],
)
def test_a_suspects_group_halves_with_each_failed_start_and_its_last_start_is_alone(
    attempts, concurrency, max_deliveries, limit
):
    assert group_limit(attempts, concurrency, max_deliveries) == limit


@pytest.mark.parametrize(
    ("attempts", "concurrency", "max_deliveries", "alone"),
    [
        (1, 64, 10, False),
        (2, 64, 10, False),
        (3, 64, 10, False),  # a suspect, in a group of up to 32 (alone before: one kill cost minutes)
        (7, 64, 10, False),
        (8, 64, 10, True),
        (10, 64, 10, True),
        (2, 64, 2, True),  # its last allowed start: alone, never dead-lettered for another's crash
        (1, 64, 1, False),
        (3, 1, 10, False),  # one handler at a time anyway: nothing to isolate
    ],
)
def test_an_entry_runs_alone_once_its_group_is_narrowed_down_or_at_its_last_start(
    attempts, concurrency, max_deliveries, alone
):
    assert runs_alone(attempts, concurrency, max_deliveries) is alone


def test_every_innocent_beside_a_poison_entry_runs_its_last_start_alone_whatever_the_settings():
    # the guarantee: an entry whose every start but the last died beside others is never
    # dead-lettered for their crash, because its last start runs alone
    for concurrency in (1, 2, 3, 16, 64, 1000):
        for max_deliveries in range(2, 14):  # with 1, no start comes after a failed one
            assert group_limit(max_deliveries, concurrency, max_deliveries) == 1
            limits = [group_limit(a, concurrency, max_deliveries) for a in range(1, max_deliveries + 1)]
            assert limits == sorted(limits, reverse=True)  # a group never grows with failures


@pytest.mark.parametrize(
    ("limit", "normal", "suspects", "waiting", "enters"),
    [
        (None, 0, [], [], True),
        (None, 63, [], [], True),  # the consumer bounds the number; the gate only separates kinds
        (None, 0, [32], [], False),  # no innocent entry beside a suspect
        (None, 0, [], [32], False),  # nor once a suspect waits (it would never get its turn)
        (32, 1, [], [32], False),  # a suspect waits for the innocent ones to finish
        (32, 0, [], [32], True),
        (32, 0, [32] * 31, [32], True),  # the 32nd of its group
        (32, 0, [32] * 32, [32], False),  # a 33rd would exceed the group
        (32, 0, [4, 32], [32], True),  # a narrowed-down suspect runs: the group stays within 4
        (32, 0, [4, 32, 32, 32], [32], False),  # a 5th would exceed it
        (4, 0, [4, 4], [4], True),
        (1, 0, [], [1], True),
        (1, 0, [32], [1], False),  # alone: nothing beside it
        (32, 0, [], [1, 32], False),  # a smaller group waits: it goes first
        (4, 0, [1], [4], False),  # one running alone: nothing joins it
    ],
)
def test_suspects_run_only_beside_suspects_within_every_members_group_limit(limit, normal, suspects, waiting, enters):
    assert may_enter(limit, normal, suspects, waiting) is enters


@pytest.mark.parametrize(
    ("free", "stopping", "owed"),
    [
        (0, False, True),  # no slot to claim with: the next one that frees is the reclaim's
        (-1, False, True),
        (3, False, False),  # slots left: the scan ended or ran its calls, new entries may come
        (0, True, False),  # stopping: nothing more is taken
    ],
)
def test_a_reclaim_that_ran_out_of_slots_takes_the_next_free_one(free, stopping, owed):
    assert reclaim_owed(free, stopping=stopping) is owed
