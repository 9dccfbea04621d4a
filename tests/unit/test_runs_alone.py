"""When an entry is handled alone in its process (runtime.consumer.runs_alone): a table."""

import pytest

from agentstream.runtime.consumer import ISOLATE_AFTER_STARTS, runs_alone


@pytest.mark.parametrize(
    ("attempts", "concurrency", "max_deliveries", "alone"),
    [
        (1, 64, 10, False),  # a first start
        (2, 64, 10, False),  # started once before: its process may have been killed with 63 others
        (3, 64, 10, True),  # started twice before without success: a suspect, alone
        (10, 64, 10, True),
        (2, 64, 2, True),  # its last allowed start: alone, never dead-lettered for another's crash
        (1, 64, 1, False),  # a first start is never a suspect, even the only one allowed
        (3, 1, 10, False),  # one handler at a time anyway: nothing to isolate
    ],
)
def test_an_entry_runs_alone_after_two_failed_starts_or_at_its_last(attempts, concurrency, max_deliveries, alone):
    assert ISOLATE_AFTER_STARTS == 2
    assert runs_alone(attempts, concurrency, max_deliveries) is alone
