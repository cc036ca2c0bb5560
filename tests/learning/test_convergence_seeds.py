"""The router converges whatever the exploration seed (issue 19): the acceptance setup of
test_convergence.py without the database, for twelve seeds. With an arm bias and words x arm
shared across task types, seeds 7 and 10 never sent arithmetic back to ``arith`` (its estimate,
dragged down by its geography failures, was never re-tried); the arm features are now scoped by
the task tags (``apps.learning.bandit.VW_ARGS``)."""

from __future__ import annotations

import pytest

from tests.learning.helpers import simulate_router

SHARE = 0.05


@pytest.mark.parametrize("seed", range(12))
def test_router_converges_for_every_exploration_seed(seed: int) -> None:
    shares, explored = simulate_router(seed, 300, SHARE)
    assert all(v >= 0.9 for v in shares.values()), shares
    assert 0 < explored <= SHARE * 300
