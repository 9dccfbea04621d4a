"""How many examples a property test draws, scaled to the Hypothesis profile in force.

A test that needs more (or fewer) examples than Hypothesis's default of 100 writes
``settings(max_examples=examples(150))`` rather than the bare number: an explicit
``max_examples`` overrides the profile's, so without the scaling the quick tier's profile
(``AGENTSTREAM_HYPOTHESIS_PROFILE=quick``, set by ``scripts/test --quick``; see tests/conftest.py)
would not make those tests any shorter."""

from __future__ import annotations

from hypothesis import settings

DEFAULT_EXAMPLES = 100
"""Hypothesis's own default ``max_examples``: the full run's profiles ("ci", "dev") keep it."""


def examples(full: int) -> int:
    """``full`` (the examples a full run draws, > 0) scaled by the loaded profile's ``max_examples``
    over the default 100 → at least 1 (the quick profile's 10: a tenth). Also for a test's own
    loop over seeds, where it stands for the number of seeds."""
    if full <= 0:
        raise ValueError(f"examples(full={full!r}): a property test draws at least one example")
    return max(1, round(full * settings().max_examples / DEFAULT_EXAMPLES))
