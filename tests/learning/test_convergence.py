"""Issue 19's "Done means" for the router: convergence to the right worker per task type, the
cheaper of two equally right workers, never a forbidden worker, exploration within the share.

The router is driven directly (300 decisions + 300 feedback values, deterministic run ids), and
each single-worker arm's outcome is the real answer of the fake worker over its loopback socket;
a composite arm (MoA, PEV, conductor) gets a coin flip: its two workers disagree."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from apps.engine.providers.gate import gate_without_policy
from apps.learning.models import Decision
from apps.learning.services import learn_from_feedback, route
from apps.policies.services import effective_policy
from apps.workers.engine_adapter import build_engine_pool
from tests.factories.policies import publish_policy
from tests.learning.helpers import ArithGeoServer, build_pool, labelled_set

pytestmark = pytest.mark.django_db

RIGHT = {"arithmetic": "single:arith", "geography": "single:geo"}


@pytest.fixture
def server() -> Iterator[ArithGeoServer]:
    srv = ArithGeoServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _outcome(
    engine_pool: Any, arm: dict[str, Any], question: str, expected: str, rng: random.Random
) -> float:
    if arm["kind"] != "single":
        return 1.0 if rng.random() < 0.5 else 0.0
    worker = engine_pool.workers[engine_pool.index_of(arm["worker"])]
    result = worker.complete([{"role": "user", "content": question}])
    return 1.0 if result.text.strip() == expected else 0.0


def _drive(
    team: Any, engine_pool: Any, n: int, *, seed: int, equal: bool = False
) -> list[tuple[str, Decision]]:
    rng = random.Random(seed)
    effective = effective_policy(team)
    out = []
    for task, question, expected in labelled_set(seed, n):
        run_id = uuid.UUID(int=rng.getrandbits(128))
        decision = route(
            run_id=run_id, team_id=team.pk, question=question, pool=engine_pool, effective=effective
        )
        arm = decision.chosen
        assert arm is not None
        value = (
            1.0 if equal and arm["kind"] == "single" else _outcome(engine_pool, arm, question, expected, rng)
        )
        # Each arm's cost: its forecast (what the prices say it costs); latency not weighted here.
        cost = float(arm["forecast_cost_usd"]) if arm["forecast_cost_usd"] else None
        learn_from_feedback(run_id, team.pk, "helpful", value, cost_usd=cost, latency_ms=100.0)
        out.append((task, decision))
    return out


def test_router_learns_the_right_worker_per_task_and_never_the_forbidden_one(
    alpha: Any, server: ArithGeoServer
) -> None:
    pool = build_pool(alpha, server)
    publish_policy(
        alpha,
        {
            "learning": {"enabled": True, "max_exploration": 0.05},
            "constraints": {"workers": {"denied_workers": ["banned"]}},
        },
    )
    engine_pool = build_engine_pool(pool, gate=gate_without_policy())
    history = _drive(alpha, engine_pool, 300, seed=19)

    # Never offered, never chosen: the worker the policy denies.
    assert all("single:banned" not in {a["arm"] for a in d.arms} for _, d in history)
    assert {d.chosen_arm for _, d in history} >= {"single:arith", "single:geo"}
    # Converged: over the last 100 routed requests, >= 90 % of each task type went to its worker.
    tail = history[-100:]
    for task, arm in RIGHT.items():
        chosen = [d.chosen_arm for t, d in tail if t == task]
        share = sum(c == arm for c in chosen) / len(chosen)
        assert share >= 0.9, (task, share, chosen)
    # Exploration stayed within the policy's share, and the router did explore.
    explored = sum(d.explored for _, d in history)
    assert 0 < explored <= 0.05 * len(history)
    # Every decision was rewarded and learned into the router (which snapshotted versions).
    assert Decision.objects.filter(team=alpha, reward__isnull=True).count() == 0
    assert alpha.routers.count() >= 300 // 50


def test_router_prefers_the_cheaper_of_two_equally_right_workers(alpha: Any, server: ArithGeoServer) -> None:
    # Both always right (equal accuracy); geo costs ten times arith; cost counts fully.
    pool = build_pool(alpha, server, prices={"arith": ("10", "20"), "geo": ("100", "200")})
    publish_policy(
        alpha,
        {
            "learning": {"enabled": True, "max_exploration": 0.1, "cost_weight": 1.0},
            "constraints": {"workers": {"denied_workers": ["banned"]}},
        },
    )
    history = _drive(alpha, build_engine_pool(pool, gate=gate_without_policy()), 300, seed=7, equal=True)
    tail = [d.chosen_arm for _, d in history[-200:]]
    assert sum(a == "single:arith" for a in tail) / len(tail) >= 0.8, tail
    assert sum(d.explored for _, d in history) <= 0.1 * len(history)


def test_cost_cap_and_confidential_rule_remove_arms(alpha: Any, server: ArithGeoServer) -> None:
    pool = build_pool(alpha, server, prices={"geo": ("100000", "200000")})
    # geo's one call may cost up to 64 output tokens x $0.2/token = $12.8: over the $1 cap, and so
    # is every composite arm that might run it.
    publish_policy(alpha, {"learning": {"enabled": True}, "constraints": {"caps": {"max_cost_usd": "1"}}})
    decision = route(
        run_id=uuid.uuid4(),
        team_id=alpha.pk,
        question="What is the capital of Peru?",
        pool=build_engine_pool(pool, gate=gate_without_policy()),
        effective=effective_policy(alpha),
    )
    offered = {a["arm"] for a in decision.arms}
    assert "single:geo" not in offered and "single:arith" in offered
    assert all(float(a["forecast_cost_usd"]) <= 1 for a in decision.arms)


def test_exploration_never_exceeds_the_share_even_when_set_to_zero(
    alpha: Any, server: ArithGeoServer
) -> None:
    pool = build_pool(alpha, server)
    publish_policy(alpha, {"learning": {"enabled": True, "max_exploration": 0}})
    history = _drive(alpha, build_engine_pool(pool, gate=gate_without_policy()), 40, seed=3)
    assert not any(d.explored for _, d in history)
