"""Which entries run beside which in a process (runtime.consumer: is_suspect, group_limit,
runs_alone, may_enter) and when idle entries go before new ones (reclaim_owed): tables."""

import asyncio

import pytest

from agentstream.runtime.consumer import (
    ISOLATE_AFTER_STARTS,
    NORMAL_TURN,
    SUSPECTS_TURN,
    IsolationGate,
    group_limit,
    is_suspect,
    may_enter,
    next_turn,
    reclaim_owed,
    runs_alone,
    suspects_admitted,
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
    ("limit", "normal", "suspects", "waiting", "normals_waiting", "admitted", "enters"),
    [
        (None, 0, [], [], 1, False, True),
        (None, 63, [], [], 1, False, True),  # the consumer bounds the number; the gate only separates kinds
        (None, 0, [32], [], 1, False, False),  # no innocent entry beside a suspect
        (None, 0, [32], [], 1, True, False),  # not even one given the turn: it waits for the group to end
        (None, 5, [], [32], 1, False, False),  # a suspect waits: no more innocent ones start...
        (None, 5, [], [32], 1, True, True),  # ...but those that had the turn when it came
        (32, 1, [], [32], 0, True, False),  # a suspect waits for the innocent ones to finish
        (32, 0, [], [32], 0, False, True),
        (32, 0, [32] * 31, [32], 0, False, True),  # the 32nd of its group
        (32, 0, [32] * 32, [32], 0, True, False),  # a 33rd would exceed the group
        (32, 0, [4, 32], [32], 0, False, True),  # a narrowed-down suspect runs: the group stays within 4
        (32, 0, [4, 32, 32, 32], [32], 0, True, False),  # a 5th would exceed it
        (4, 0, [4, 4], [4], 0, False, True),
        (1, 0, [], [1], 0, False, True),
        (1, 0, [32], [1], 0, True, False),  # alone: nothing beside it
        (32, 0, [], [1, 32], 0, True, False),  # a smaller group waits: it goes first
        (4, 0, [1], [4], 0, True, False),  # one running alone: nothing joins it
        (32, 0, [32], [32], 3, False, False),  # innocent ones wait: no more suspects join the group...
        (32, 0, [32], [32], 3, True, True),  # ...but those that had the turn when it came
    ],
)
def test_suspects_run_only_beside_suspects_within_every_members_group_limit_taking_turns(
    limit, normal, suspects, waiting, normals_waiting, admitted, enters
):
    assert may_enter(limit, normal, suspects, waiting, normals_waiting=normals_waiting, admitted=admitted) is enters


@pytest.mark.parametrize(
    ("running", "normals_waiting", "suspects_waiting", "last", "turn"),
    [
        (True, 3, 2, NORMAL_TURN, None),  # handlers run: the turn changes once they are done
        (False, 0, 0, NORMAL_TURN, None),  # nobody waits
        (False, 3, 0, NORMAL_TURN, NORMAL_TURN),
        (False, 0, 2, NORMAL_TURN, SUSPECTS_TURN),
        (False, 3, 2, NORMAL_TURN, SUSPECTS_TURN),  # both wait: the kind that did not have the last turn
        (False, 3, 2, SUSPECTS_TURN, NORMAL_TURN),
    ],
)
def test_suspects_and_the_others_take_turns_so_neither_waits_for_more_than_one_of_the_other(
    running, normals_waiting, suspects_waiting, last, turn
):
    assert next_turn(running, normals_waiting, suspects_waiting, last) == turn


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


async def test_an_innocent_entry_waits_for_one_turn_of_suspects_not_for_every_suspect_that_comes():
    # Suspects kept joining the running group while innocent entries waited for the group to
    # end: under repeated kills, a quick job waited for one suspect group after another.
    gate = IsolationGate()
    order: list[str] = []

    async def run(name: str, limit: int | None, after_s: float, hold_s: float) -> None:
        await asyncio.sleep(after_s)
        await gate.enter(limit, "stream")
        order.append(name)
        await asyncio.sleep(hold_s)
        await gate.leave(limit)

    await asyncio.gather(
        run("suspect a", 4, 0.0, 0.2),
        run("innocent", None, 0.05, 0.05),  # waits: a suspect runs
        run("suspect b", 4, 0.1, 0.2),  # would join a's group; the innocent one goes first
        run("suspect c", 4, 0.25, 0.1),
    )
    assert order == ["suspect a", "innocent", "suspect b", "suspect c"]


@pytest.mark.parametrize(
    ("waiting", "admitted"),
    [
        ([], 0),
        ([32] * 10, 10),
        ([32] * 40, 32),  # one group: the rest wait for the next suspects' turn
        ([4, 32, 32, 32, 32, 32], 4),  # the smallest limit bounds the group
        ([1, 1, 32], 1),
    ],
)
def test_a_suspects_turn_admits_one_group(waiting, admitted):
    assert suspects_admitted(waiting) == admitted


async def test_innocent_entries_wait_for_one_group_of_suspects_not_for_all_in_hand():
    # A worker that claimed a dead one's 64 entries, most of them suspects in small groups,
    # let its new entries wait until every suspect had run, group after group.
    gate = IsolationGate()
    order: list[str] = []

    async def run(name: str, limit: int | None, after_s: float, hold_s: float) -> None:
        await asyncio.sleep(after_s)
        await gate.enter(limit, "stream")
        order.append(name)
        await asyncio.sleep(hold_s)
        await gate.leave(limit)

    await asyncio.gather(
        run("innocent a", None, 0.0, 0.1),
        *(run(f"suspect {i}", 2, 0.02, 0.1) for i in range(4)),  # wait for a's turn to end
        run("innocent b", None, 0.05, 0.05),
    )
    assert order[:3] == ["innocent a", "suspect 0", "suspect 1"]  # one group of 2
    assert order[3] == "innocent b"  # then the innocent one that waited, before the next group
