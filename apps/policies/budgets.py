"""Team budgets: spend per UTC day and per UTC calendar month, soft (warn) and hard (refuse).

Spend in a period = the sum of `Run.cost_usd` of the team's runs *created* in that period
(unpriced runs count what was priced; a run still executing counts what it has recorded so far).
Periods are UTC: the daily budget resets at 00:00 UTC, the monthly one at 00:00 UTC on the 1st.

`budget_check` is what `run_create` calls before storing a run: a spent hard limit raises
`BudgetExceeded(budget_name, retry_after_s)` so no model is ever called; a spent soft limit only
sets `BudgetStatus.warn` (runs are flagged). `PolicyHooks` re-checks the hard limits before
every step against the room left when the run started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from apps.policies import ports
from apps.policies.constraints import BudgetRoom
from apps.policies.spec import BudgetLimit, EffectivePolicy

PERIODS = ("daily", "monthly")


class BudgetExceeded(Exception):
    """A hard budget is spent. `str()` names the budget, the limit and when it resets."""

    def __init__(
        self, budget_name: str, retry_after_s: int, *, limit: Decimal, spent: Decimal, resets_at: datetime
    ) -> None:
        self.budget_name = budget_name
        self.retry_after_s = retry_after_s
        self.limit = limit
        self.spent = spent
        self.resets_at = resets_at
        super().__init__(
            f"The team's {budget_name} budget (${limit}) is spent (${spent.quantize(Decimal('0.0001'))} used); "
            f"it resets at {resets_at:%Y-%m-%d %H:%M} UTC."
        )


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    name: str  # daily | monthly
    starts_at: datetime
    resets_at: datetime
    spent: Decimal
    soft_usd: Decimal | None
    hard_usd: Decimal | None

    @property
    def remaining(self) -> Decimal | None:
        """Room left under the hard limit (never negative); None without a hard limit."""
        if self.hard_usd is None:
            return None
        return max(Decimal(0), self.hard_usd - self.spent)

    @property
    def soft_exceeded(self) -> bool:
        return self.soft_usd is not None and self.spent >= self.soft_usd

    @property
    def hard_exceeded(self) -> bool:
        return self.hard_usd is not None and self.spent >= self.hard_usd

    @property
    def configured(self) -> bool:
        return self.soft_usd is not None or self.hard_usd is not None

    def retry_after_s(self, now: datetime) -> int:
        return max(1, int((self.resets_at - now).total_seconds() + 0.999))

    @property
    def used_percent(self) -> float | None:
        limit = self.hard_usd if self.hard_usd is not None else self.soft_usd
        if not limit:
            return None
        return float(min(Decimal(100), self.spent * 100 / limit))


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    windows: list[BudgetWindow] = field(default_factory=list)
    now: datetime | None = None

    @property
    def warn(self) -> bool:
        return any(w.soft_exceeded for w in self.windows)

    @property
    def warnings(self) -> list[str]:
        return [
            f"the team's {w.name} soft budget (${w.soft_usd}) is reached (${w.spent:.4f} spent)"
            for w in self.windows
            if w.soft_exceeded
        ]

    def rooms(self) -> list[BudgetRoom]:
        return [
            BudgetRoom(w.name, w.hard_usd, w.remaining)
            for w in self.windows
            if w.hard_usd is not None and w.remaining is not None
        ]


def period_bounds(name: str, now: datetime) -> tuple[datetime, datetime]:
    """[start, reset) of the period containing `now`, in UTC."""
    now = now.astimezone(UTC)
    if name == "daily":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    if name == "monthly":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        return start, nxt
    raise ValueError(f"unknown budget period {name!r}")


def team_spend(team: Any, start: datetime, end: datetime) -> Decimal:
    # Run history lives above policies: read through the port apps.runs registers.
    return ports.run_history().team_spend(team, start, end)


def budget_status(*, team: Any, effective: EffectivePolicy, now: datetime | None = None) -> BudgetStatus:
    now = now or datetime.now(UTC)
    windows = []
    for name in PERIODS:
        limit: BudgetLimit = getattr(effective.spec.budgets, name)
        start, reset = period_bounds(name, now)
        spent = (
            team_spend(team, start, reset)
            if (limit.soft_usd is not None or limit.hard_usd is not None)
            else Decimal(0)
        )
        windows.append(BudgetWindow(name, start, reset, spent, limit.soft_usd, limit.hard_usd))
    return BudgetStatus(windows, now)


def budget_check(*, team: Any, effective: EffectivePolicy, now: datetime | None = None) -> BudgetStatus:
    """The team's budget status; raises `BudgetExceeded` when a hard limit is spent."""
    status = budget_status(team=team, effective=effective, now=now)
    assert status.now is not None
    for w in status.windows:
        if w.hard_exceeded:
            assert w.hard_usd is not None
            raise BudgetExceeded(
                w.name, w.retry_after_s(status.now), limit=w.hard_usd, spent=w.spent, resets_at=w.resets_at
            )
    return status
