"""Plan checks before execution: the plan's tokens and cost are forecast from prices and the
workers' history, and a plan forecast to cross a policy limit, a run cap or the team's remaining
budget is refused before any worker is called, naming the policy field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.engine.plan import Plan, PlanStep
from apps.engine.types import WorkerInfo
from apps.policies.constraints import BudgetRoom
from apps.policies.forecast import PROMPT_OVERHEAD_TOKENS, forecast_plan, forecast_violations
from apps.policies.spec import parse_spec

QUESTION = "q" * 400  # 100 tokens at 4 characters a token


def _infos() -> list[WorkerInfo]:
    return [
        WorkerInfo(
            key="a",
            name="A",
            model="a-1",
            provider="test",
            max_output_tokens=300,
            input_price_per_mtok=Decimal(1),
            output_price_per_mtok=Decimal(2),
        ),
        WorkerInfo(key="b", name="B", model="b-1", provider="test", max_output_tokens=200),
    ]


def _plan() -> Plan:
    return Plan(
        (PlanStep(0, 0, "x" * 40, ()), PlanStep(1, 0, "y" * 40, "all"), PlanStep(2, 1, "z" * 40, (1,)))
    )


def test_forecast_uses_history_then_max_output_and_names_unpriced_workers() -> None:
    fc = forecast_plan(_plan(), _infos(), question=QUESTION, history={"a": 50.4})
    base = PROMPT_OVERHEAD_TOKENS + 100 + 10
    assert [(s.input_tokens, s.output_tokens) for s in fc.steps] == [
        (base, 50),
        (base + 50, 50),
        (base + 50, 200),
    ]
    assert fc.steps[0].basis.startswith("recent steps") and "no history" in fc.steps[2].basis
    # a: (170 + 220) input and 100 output tokens at $1 / $2 per million; b is unpriced.
    assert fc.cost_usd == Decimal(390) / 10**6 + Decimal(200) / 10**6
    assert fc.unpriced == ("b",) and fc.steps[2].cost_usd is None
    assert fc.total_tokens == 3 * base + 100 + 300


def test_a_worker_cannot_be_forecast_cheaper_than_it_may_write() -> None:
    fc = forecast_plan(_plan(), _infos(), question=QUESTION, history={"a": 10_000})
    assert fc.steps[0].output_tokens == 300


def test_violations_name_the_field_that_sets_each_limit() -> None:
    fc = forecast_plan(_plan(), _infos(), question=QUESTION, history={})
    spec = parse_spec(
        {
            "constraints": {
                "forecast": {"enabled": True, "max_cost_usd": "0.0001", "max_tokens": 100_000},
                "caps": {"max_total_tokens": 500},
            }
        }
    )
    room = BudgetRoom("daily", Decimal(5), Decimal("0.0005"))
    messages = [v.message for v in forecast_violations(fc, spec.constraints, [room])]
    assert messages[0].startswith("constraints.forecast.max_cost_usd: the plan is forecast to cost $0.00")
    assert any(m.startswith("constraints.caps.max_total_tokens:") for m in messages)
    assert any(m.startswith("budgets.daily.hard_usd:") for m in messages)
    assert not any("forecast.max_tokens" in m for m in messages)  # under that one


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_plan_over_the_forecast_limit_is_blocked_before_any_worker_call(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from apps.api.v1.shaping import run_outcome_error
    from apps.runs.models import RunEvent, RunStatus
    from apps.runs.services import run_create, run_wait
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import CONDUCTOR_MODEL, scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"constraints": {"forecast": {"enabled": True, "max_tokens": 50}}})
    run = run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="Plan it", source="playground")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.BLOCKED, (run.status, run.error)
    assert [r.json.get("model") for r in fake_pool.server.chat_requests()] == [CONDUCTOR_MODEL]
    validated = RunEvent.objects.get(run=run, type="plan.validated").data
    assert [v["code"] for v in validated["violations"]] == ["forecast_over_limit"]
    error = run_outcome_error(run, {})
    assert error is not None and "constraints.forecast.max_tokens" in str(error.message)


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_plan_within_the_forecast_runs(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from apps.runs.models import RunStatus
    from apps.runs.services import run_create, run_wait
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"constraints": {"forecast": {"enabled": True, "max_tokens": 1_000_000}}})
    run = run_wait(
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="Go", source="playground").id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
