"""The contextual bandit: Vowpal Wabbit's ``--cb_adf`` learner with a policy-bounded epsilon layer.

Pure Python (no Django). One example per arm (action-dependent features), the request's context
as the shared example; the learner regresses each arm's *cost* = 1 - reward (so an arm never tried
predicts cost 0, the best possible: optimism makes a new arm get tried by the greedy choice
rather than by exploration) and the scores shown to people are predicted rewards (1 - cost).

Why ``--cb_adf`` plus our own epsilon layer instead of ``--cb_explore_adf --epsilon``: the explore
reduction returns only its probability vector, which hides the per-arm scores "why this arm" must
show, and its epsilon is baked into the saved model, while the policy's ``max_exploration`` may
change between two requests and bounds the *realised* share of explored runs per team. The layer
below is epsilon-greedy whose exploring step goes to the least-tried arms (see ``choose``), and it
logs, for VW's IPS/MTR update, the probability that this policy gave the arm it chose.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from apps.learning.features import Context, arm_line

# MTR: importance-weighted regression on the chosen arm (VW's default for cb_adf and robust with
# few arms). Interactions: task tags x arm, and words and length/team x arm *within* the task tags
# (tsa, tla); without them the shared features would be the same for every arm and could not
# change the ranking. Every arm feature is scoped by the task tags, and the arm's own linear terms
# are ignored: with an arm bias or plain words x arm ("what", "is" in every question), one task's
# failures on an arm dragged that arm's estimate down for the other task, where it had been right,
# and a greedy router never tried it there again (2 of 12 exploration seeds never converged on
# arithmetic; bench/LEARNING.md). Requests without a detected tag share the tag "untagged".
VW_ARGS = (
    "--cb_adf --cb_type mtr --interactions ta --interactions tsa --interactions tla --ignore_linear a -b 18"
)
MIN_PROB = 0.01  # floor on a logged probability (bounds the importance weight 1/p)


@dataclass(frozen=True)
class Arm:
    """One thing the router can choose: a strategy, and the worker or preset it is fixed to."""

    id: str  # "single:<worker>", "moa", "pev", "conductor-mini", "conductor-ultra"
    kind: str  # single | moa | pev | conductor
    worker: str | None = None
    preset: str | None = None
    forecast_cost_usd: Decimal | None = None  # upper bound from prices; None = unpriced

    def line(self) -> str:
        return arm_line(self.id, kind=self.kind, worker=self.worker, preset=self.preset)


@dataclass(frozen=True)
class Choice:
    index: int
    explored: bool
    probs: tuple[float, ...]
    greedy: int


class Bandit:
    """A VW workspace for one team's router; ``state`` is the saved model (None: a fresh one)."""

    def __init__(self, state: bytes | None = None, *, seed: int = 0) -> None:
        import vowpalwabbit

        self._vw: Any
        if state:
            fd, path = tempfile.mkstemp(suffix=".vw")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(state)
                self._vw = vowpalwabbit.Workspace(f"--quiet -i {path}")
            finally:
                os.unlink(path)
        else:
            self._vw = vowpalwabbit.Workspace(f"{VW_ARGS} --quiet --random_seed {seed}")

    def close(self) -> None:
        self._vw.finish()

    def __enter__(self) -> Bandit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scores(self, context: Context, arms: Sequence[Arm]) -> list[float]:
        """Predicted reward per arm, in the order of ``arms``."""
        if not arms:
            return []
        costs = self._vw.predict([context.shared_line(), *(a.line() for a in arms)])
        # No reward exceeds 1 (a metric in 0..1 less penalties): a prediction above it is the
        # regression overshooting on an importance-weighted lucky draw, and must not outrank
        # an arm that really earns 1 — capped, the two tie and the tie-break decides.
        return [round(min(1.0, 1.0 - float(c)), 6) for c in costs]

    def learn(self, context: Context, arms: Sequence[Arm], chosen: int, reward: float, prob: float) -> None:
        cost = 1.0 - reward
        p = max(MIN_PROB, min(1.0, prob))
        lines = [context.shared_line()]
        for i, arm in enumerate(arms):
            label = f"0:{cost:.6f}:{p:.6f} " if i == chosen else ""
            lines.append(label + arm.line())
        self._vw.learn(lines)

    def to_bytes(self) -> bytes:
        fd, path = tempfile.mkstemp(suffix=".vw")
        os.close(fd)
        try:
            self._vw.save(path)
            with open(path, "rb") as fh:
                return fh.read()
        finally:
            os.unlink(path)


def greedy_index(scores: Sequence[float], arms: Sequence[Arm]) -> int:
    """Best predicted reward; ties go to the cheaper forecast, then to the arm that makes fewer
    model calls (one worker before a composite: unpriced pools have no cheaper forecast, and a
    composite that got lucky must not keep a tie it only shares), then to the arm order."""

    def key(i: int) -> tuple[float, float, int, int]:
        cost = arms[i].forecast_cost_usd
        composite = 0 if arms[i].kind == "single" else 1
        return (-round(scores[i], 4), float(cost) if cost is not None else float("inf"), composite, i)

    return min(range(len(arms)), key=key)


WELL_TRIED = 3  # tries of every arm, for one kind of request, after which exploration slows


def exploration_rate(
    share: float,
    *,
    decisions: int,
    explored: int,
    arms: Sequence[Arm],
    tried: Callable[[], Mapping[str, int]],
) -> tuple[float, Mapping[str, int] | None]:
    """(epsilon for this request, the per-arm try counts read for it or None).

    Zero once one more exploration would take the team's explored share (``explored`` of
    ``decisions``) above ``share``. Otherwise the full share while some arm is barely known for
    this kind of request (``tried``: arm id -> count; read only here); once every arm has been
    tried ``WELL_TRIED`` times, a quarter of it keeps the router current."""
    if share <= 0 or (explored + 1) / (decisions + 1) > share:
        return 0.0, None
    counts = tried()
    if min(counts.get(a.id, 0) for a in arms) >= WELL_TRIED:
        return share / 4, counts
    return share, counts


def choose(
    scores: Sequence[float],
    arms: Sequence[Arm],
    *,
    epsilon: float,
    rng: random.Random,
    tried: Callable[[], Mapping[str, int]] | None = None,
) -> Choice:
    """Epsilon-greedy over the arms (epsilon already capped by the policy and the team's share).

    An exploring step goes to the arm tried least often in a context like this one (``tried``:
    arm id -> count, read whenever epsilon > 0; ties at random), not to a uniformly random one:
    the policy's exploration share is small (a few percent), and a uniform draw can spend all of
    it on arms already known to be poor while the right one, never tried for this kind of
    request, stays behind a greedy arm that merely looks fair.

    ``probs`` is the distribution this policy drew from: the greedy arm 1 - epsilon, each of the
    m arms an exploring step picks among epsilon/m, every other arm 0. VW's importance weight is
    1/p of the chosen arm, so p must be the one actually used, not the uniform eps/(K-1)."""
    n = len(arms)
    best = greedy_index(scores, arms)
    if n == 1 or epsilon <= 0:
        probs = tuple(1.0 if i == best else 0.0 for i in range(n))
        return Choice(best, False, probs, best)
    epsilon = min(1.0, epsilon)
    others = [i for i in range(n) if i != best]
    if tried is not None:
        counts = tried()
        fewest = min(counts.get(arms[i].id, 0) for i in others)
        others = [i for i in others if counts.get(arms[i].id, 0) == fewest]
    probs = tuple(
        (1.0 - epsilon) if i == best else (epsilon / len(others) if i in others else 0.0) for i in range(n)
    )
    # The draws (one to explore or not, one among the least-tried) are as before: a replay of a
    # request explores the way it did.
    if rng.random() < epsilon:
        return Choice(rng.choice(others), True, probs, best)
    return Choice(best, False, probs, best)


def reward_of(
    value: float,
    *,
    cost_usd: float | None,
    latency_ms: float | None,
    cost_weight: float,
    latency_weight: float,
    cost_scale_usd: float | None,
    latency_scale_ms: float | None,
) -> float:
    """metric - cost_weight x cost/scale - latency_weight x latency/scale (each share clipped to 0..1)."""
    reward = float(value)
    if cost_weight and cost_usd is not None and cost_scale_usd:
        reward -= cost_weight * min(1.0, max(0.0, cost_usd / cost_scale_usd))
    if latency_weight and latency_ms is not None and latency_scale_ms:
        reward -= latency_weight * min(1.0, max(0.0, latency_ms / latency_scale_ms))
    return reward
