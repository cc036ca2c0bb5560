"""Plan validation/repair and the run-time step gate (pure functions)."""

from __future__ import annotations

from decimal import Decimal

from apps.engine.plan import CONDUCTOR_SELF, Plan, PlanStep, validate_plan
from apps.engine.types import Totals, WorkerInfo
from apps.policies.constraints import (
    BudgetRoom,
    PlanFacts,
    check_plan,
    is_confidential,
    plan_width,
    step_gate,
)
from apps.policies.spec import parse_spec
from tests.policies.helpers import infos, linear_plan

POOL = infos(
    ("cloud-a", ["external"]),
    ("cloud-b", ["external", "code"]),
    ("local-a", ["local"]),
    ("checker", ["verifier", "local"]),
)


def c(**constraints: object):
    return parse_spec({"constraints": constraints}).constraints


def codes(v) -> list[str]:
    return [x.code for x in v.violations]


def test_accepts_a_plan_within_limits() -> None:
    plan = linear_plan([0, 1, 0])
    v = check_plan(plan, POOL, c(), PlanFacts("q"))
    assert v.action == "accepted" and v.plan == plan and v.violations == []


def test_six_steps_under_four_are_truncated_keeping_the_answer_step() -> None:
    plan = linear_plan([0, 1, 0, 1, 0, 1])
    v = check_plan(plan, POOL, c(max_steps={"value": 4, "action": "repair"}), PlanFacts("q"))
    assert v.action == "repaired" and codes(v) == ["too_many_steps"]
    assert "6 steps" in v.violations[0].message and "at most 4" in v.violations[0].message
    assert v.plan is not None and len(v.plan) == 4
    assert [s.index for s in v.plan] == [0, 1, 2, 3]
    assert v.plan.last.instruction == plan.last.instruction  # the final (answer) step is kept
    validate_plan(v.plan, pool_size=len(POOL), max_steps=4)  # still a valid plan for the engine


def test_six_steps_under_a_block_policy_are_blocked() -> None:
    v = check_plan(linear_plan([0] * 6), POOL, c(max_steps={"value": 4, "action": "block"}), PlanFacts("q"))
    assert v.action == "blocked" and v.plan is None and "at most 4" in (v.reason or "")


def test_denied_and_not_allowed_workers_are_substituted() -> None:
    plan = linear_plan([0, 1])
    v = check_plan(
        plan,
        POOL,
        c(workers={"denied_workers": ["cloud-a"], "allowed_tags": ["external", "verifier"]}),
        PlanFacts("q"),
    )
    assert v.action == "repaired"
    assert codes(v) == ["worker_denied"]
    assert v.plan is not None and v.plan.steps[0].worker == 1  # same tag 'external' wins


def test_worker_rule_block() -> None:
    v = check_plan(
        linear_plan([0]), POOL, c(workers={"allowed_workers": ["local-a"], "action": "block"}), PlanFacts("q")
    )
    assert v.action == "blocked" and codes(v) == ["worker_not_allowed"] and v.violations[0].step == 0


def test_confidential_moves_steps_to_local_workers_or_blocks() -> None:
    rule = {"enabled": True, "detect": True}
    v = check_plan(linear_plan([0, 1]), POOL, c(confidential=rule), PlanFacts("q", confidential=True))
    assert v.action == "repaired" and codes(v) == [
        "confidential_requires_local",
        "confidential_requires_local",
    ]
    assert v.plan is not None and {s.worker for s in v.plan} <= {2, 3}
    blocked = check_plan(
        linear_plan([0]), POOL, c(confidential={**rule, "action": "block"}), PlanFacts("q", confidential=True)
    )
    assert blocked.action == "blocked"
    no_local = check_plan(linear_plan([0]), POOL[:2], c(confidential=rule), PlanFacts("q", confidential=True))
    assert no_local.action == "blocked" and "local" in (no_local.reason or "")


def test_confidential_detection() -> None:
    cons = c(confidential={"enabled": True, "detect": True})
    assert is_confidential("This memo is CONFIDENTIAL", cons)[0]
    assert is_confidential("hello", cons, marked="confidential")[0]
    assert not is_confidential("hello", cons)[0]
    assert not is_confidential("confidential", c(confidential={"enabled": False}))[0]


def test_verification_required_appends_a_verifier_step() -> None:
    cons = c(
        verification={"rules": [{"name": "numbers", "pattern": r"\bhow much\b"}]}, max_steps={"value": 3}
    )
    plan = linear_plan([0, 1, 0])
    assert check_plan(plan, POOL, cons, PlanFacts("What is the tallest tree?")).action == "accepted"
    v = check_plan(plan, POOL, cons, PlanFacts("How much tax do I owe?"))
    assert v.action == "repaired" and codes(v) == ["verification_required"]
    assert v.plan is not None and len(v.plan) == 3 and v.plan.last.worker == 3 and v.plan.last.access == "all"
    validate_plan(v.plan, pool_size=len(POOL), max_steps=3)
    blocked = check_plan(plan, POOL[:3], cons, PlanFacts("how much?"))
    assert blocked.action == "blocked" and "verifier" in (blocked.reason or "")


def test_recursion_beyond_the_depth_limit() -> None:
    steps = (PlanStep(0, 0, "a", ()), PlanStep(1, CONDUCTOR_SELF, "review", "all"))
    plan = Plan(steps)
    v = check_plan(plan, POOL, c(max_depth={"value": 1}), PlanFacts("q", round=1))
    assert v.action == "repaired" and codes(v) == ["too_deep"] and v.plan is not None and not v.plan.recurses
    assert check_plan(plan, POOL, c(max_depth={"value": 2}), PlanFacts("q", round=1)).action == "accepted"
    assert (
        check_plan(plan, POOL, c(max_depth={"value": 1, "action": "block"}), PlanFacts("q")).action
        == "blocked"
    )


def test_parallel_width() -> None:
    wide = Plan((*tuple(PlanStep(i, 0, f"p{i}", ()) for i in range(4)), PlanStep(4, 1, "join", "all")))
    assert plan_width(wide) == 4
    v = check_plan(wide, POOL, c(max_parallel={"value": 2}), PlanFacts("q"))
    assert v.action == "repaired" and codes(v) == ["too_parallel"] and v.plan == wide
    assert (
        check_plan(wide, POOL, c(max_parallel={"value": 2, "action": "block"}), PlanFacts("q")).action
        == "blocked"
    )


def test_every_violation_is_reported_even_when_one_blocks() -> None:
    cons = c(max_steps={"value": 2, "action": "block"}, workers={"denied_workers": ["cloud-a"]})
    v = check_plan(linear_plan([0, 0, 0]), POOL, cons, PlanFacts("q"))
    assert v.action == "blocked"
    assert codes(v) == ["worker_denied", "worker_denied", "worker_denied", "too_many_steps"]
    assert [x.step for x in v.violations[:3]] == [0, 1, 2]


# ------------------------------------------------------------------ step gate


def w(
    key: str = "cloud-a",
    *,
    max_out: int = 100,
    price: str | None = None,
    tags: tuple[str, ...] = ("external",),
) -> WorkerInfo:
    return WorkerInfo(
        key=key,
        name=key,
        model=key,
        provider="test",
        tags=tags,
        max_output_tokens=max_out,
        output_price_per_mtok=Decimal(price) if price else None,
    )


STEP = PlanStep(0, 0, "x", ())


def test_gate_token_cap() -> None:
    cons = c(caps={"max_total_tokens": 1000})
    assert step_gate(
        STEP, w(max_out=100), Totals(input_tokens=800), cons, confidential=False, started_monotonic=0
    ).allowed
    gate = step_gate(
        STEP, w(max_out=300), Totals(input_tokens=800), cons, confidential=False, started_monotonic=0
    )
    assert not gate.allowed and gate.cap == "max_total_tokens" and "1000" in (gate.reason or "")


def test_gate_cost_cap_and_budget() -> None:
    spent = Totals(cost_usd=Decimal("0.50"))
    gate = step_gate(
        STEP, w(), spent, c(caps={"max_cost_usd": "0.50"}), confidential=False, started_monotonic=0
    )
    assert not gate.allowed and gate.cap == "max_cost_usd"
    pricey = w(max_out=1_000_000, price="1")  # may add $1
    assert not step_gate(
        STEP, pricey, Totals(), c(caps={"max_cost_usd": "0.50"}), confidential=False, started_monotonic=0
    ).allowed
    room = [BudgetRoom("daily", Decimal(5), Decimal("0.40"))]
    gate = step_gate(STEP, w(), spent, c(), confidential=False, started_monotonic=0, budgets=room)
    assert not gate.allowed and gate.cap == "budget_daily" and "daily budget ($5)" in (gate.reason or "")
    assert step_gate(STEP, w(), Totals(), c(), confidential=False, started_monotonic=0, budgets=room).allowed


def test_gate_wall_clock_and_workers() -> None:
    cons = c(
        caps={"max_wall_clock_s": 10}, workers={"denied_workers": ["cloud-a"]}, confidential={"enabled": True}
    )
    gate = step_gate(
        STEP, w("cloud-b"), Totals(), cons, confidential=False, started_monotonic=100.0, now_monotonic=111.0
    )
    assert not gate.allowed and gate.cap == "max_wall_clock_s"
    assert (
        step_gate(STEP, w("cloud-a"), Totals(), cons, confidential=False, started_monotonic=0).cap
        == "worker_denied"
    )
    assert (
        step_gate(STEP, w("cloud-b"), Totals(), cons, confidential=True, started_monotonic=0).cap
        == "confidential_requires_local"
    )
    assert step_gate(
        STEP, w("l", tags=("local",)), Totals(), cons, confidential=True, started_monotonic=0
    ).allowed
