"""Budgets: spend per UTC day/month from Run.cost_usd, soft warn, hard refusal, reset times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from apps.policies.budgets import BudgetExceeded, budget_check, budget_status, period_bounds
from apps.policies.hooks import PolicyHooks
from apps.policies.services import effective_policy
from apps.runs.models import Run
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory
from tests.factories.workers import PoolFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def test_period_bounds_are_utc_and_reset_at_midnight_and_month_start() -> None:
    now = datetime(2026, 12, 31, 22, 30, tzinfo=UTC)
    assert period_bounds("daily", now) == (
        datetime(2026, 12, 31, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert period_bounds("monthly", now) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    feb = datetime(2027, 2, 10, tzinfo=UTC)
    assert period_bounds("monthly", feb)[1] == datetime(2027, 3, 1, tzinfo=UTC)


@pytest.fixture
def pool(alpha: Any) -> Any:
    return PoolFactory(team=alpha, workers=[WorkerFactory()])


def spend(team: Any, pool: Any, amount: str, *, when: datetime | None = None) -> Run:
    run = RunFactory(team=team, pool=pool, cost_usd=Decimal(amount), status="succeeded")
    if when is not None:
        Run.objects.filter(pk=run.pk).update(created_at=when)
    return run


def test_soft_limit_warns_hard_limit_raises_with_name_and_retry_after(
    alpha: Any, beta: Any, pool: Any
) -> None:
    publish_policy(alpha, {"budgets": {"daily": {"soft_usd": "1", "hard_usd": "2"}}})
    eff = effective_policy(alpha)
    spend(alpha, pool, "0.50")
    spend(alpha, pool, "0.60", when=datetime.now(UTC) - timedelta(days=2))  # an earlier day does not count
    status = budget_check(team=alpha, effective=eff)
    daily = status.windows[0]
    assert daily.name == "daily" and daily.spent == Decimal("0.50") and daily.remaining == Decimal("1.50")
    assert not status.warn
    spend(alpha, pool, "0.70")
    assert budget_check(team=alpha, effective=eff).warn
    spend(alpha, pool, "0.80")
    now = datetime.now(UTC)
    with pytest.raises(BudgetExceeded) as exc:
        budget_check(team=alpha, effective=eff, now=now)
    err = exc.value
    assert err.budget_name == "daily" and "daily budget ($2)" in str(err)
    _, reset = period_bounds("daily", now)
    assert 0 < err.retry_after_s <= (reset - now).total_seconds() + 1
    # Another team's spend is its own.
    assert not budget_status(team=beta, effective=effective_policy(beta)).warn


def test_monthly_budget(alpha: Any, pool: Any) -> None:
    publish_policy(alpha, {"budgets": {"monthly": {"hard_usd": "1"}}})
    start, _ = period_bounds("monthly", datetime.now(UTC))
    spend(alpha, pool, "1.00", when=start + timedelta(seconds=1))
    with pytest.raises(BudgetExceeded) as exc:
        budget_check(team=alpha, effective=effective_policy(alpha))
    assert exc.value.budget_name == "monthly"


def test_hooks_take_budget_room_at_run_start_and_warn(alpha: Any, pool: Any) -> None:
    publish_policy(alpha, {"budgets": {"daily": {"soft_usd": "0.1", "hard_usd": "1"}}})
    spend(alpha, pool, "0.25")
    hooks = PolicyHooks(effective=effective_policy(alpha), team=alpha, run_id="x")
    assert [(r.name, r.remaining) for r in hooks.budget_rooms] == [("daily", Decimal("0.75"))]
    assert hooks.budget_warnings and "soft budget" in hooks.budget_warnings[0]
