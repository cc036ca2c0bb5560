"""The exploration layer's logged propensity (``apps.learning.bandit.choose``): the probability it
logs for the chosen arm is the one the policy actually drew it with — VW weights each update by 1/p."""

from __future__ import annotations

import random
from collections import Counter

from apps.learning.bandit import Arm, choose

ARMS = [Arm("single:a", "single", worker="a"), Arm("single:b", "single", worker="b")]
ARMS += [Arm("moa", "moa"), Arm("pev", "pev")]
SCORES = [0.9, 0.5, 0.5, 0.5]  # arm 0 is greedy
TRIED = {"single:a": 9, "single:b": 0, "moa": 4, "pev": 0}  # b and pev are the least tried
EPSILON = 0.2


def test_exploring_logs_the_probability_of_the_least_tried_draw() -> None:
    choices = [
        choose(SCORES, ARMS, epsilon=EPSILON, rng=random.Random(seed), tried=lambda: TRIED)
        for seed in range(400)
    ]
    explored = [c for c in choices if c.explored]
    assert explored, "some of 400 seeds explore at epsilon 0.2"
    for choice in explored:
        assert ARMS[choice.index].id in {"single:b", "pev"}
        # Two arms share the exploring draw: epsilon/2, not epsilon/(4-1).
        assert choice.probs[choice.index] == EPSILON / 2
    greedy = next(c for c in choices if not c.explored)
    assert greedy.probs == (1 - EPSILON, EPSILON / 2, 0.0, EPSILON / 2)
    assert sum(greedy.probs) == 1.0


def test_logged_probabilities_match_how_often_each_arm_is_chosen() -> None:
    """Over many seeded draws each arm's share is the probability logged for it (the draws are
    fixed by the seeds, so the counts are too)."""
    draws = 6000
    counts: Counter[int] = Counter()
    probs = None
    for seed in range(draws):
        choice = choose(SCORES, ARMS, epsilon=EPSILON, rng=random.Random(seed), tried=lambda: TRIED)
        counts[choice.index] += 1
        probs = choice.probs
    assert probs is not None
    for i, p in enumerate(probs):
        assert abs(counts[i] / draws - p) < 0.02, (ARMS[i].id, counts[i] / draws, p)


def test_without_try_counts_every_other_arm_shares_epsilon() -> None:
    choice = choose(SCORES, ARMS, epsilon=EPSILON, rng=random.Random(1), tried=None)
    assert choice.probs == (1 - EPSILON, EPSILON / 3, EPSILON / 3, EPSILON / 3)


def test_no_exploration_is_greedy_with_certainty() -> None:
    choice = choose(SCORES, ARMS, epsilon=0.0, rng=random.Random(1), tried=lambda: TRIED)
    assert (choice.index, choice.explored, choice.probs) == (0, False, (1.0, 0.0, 0.0, 0.0))
