"""Per-key dollar budgets (issue 42): a key's runs may spend so much per UTC day or calendar month,
soft (warn) and hard (refuse), like a team's budgets (``apps.policies.budgets``, whose windows
and wording this mirrors). Spend = the sum of ``Run.cost_usd`` of the key's runs *created* in the
period. A spent hard budget refuses before any model is called (``/v1``: 429 in OpenAI's error
shape, ``insufficient_quota``, naming the key's budget); a reached soft budget only warns (the
``x-conductor-budget-warning`` header, the key page and /insights/)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Sum

from apps.api.models import ApiKey
from apps.policies.budgets import BudgetWindow, period_bounds
from apps.runs.models import Run


class KeyBudgetExceeded(Exception):
    """The key's hard budget is spent; ``str()`` names the key, the budget and when it resets."""

    def __init__(self, key: ApiKey, window: BudgetWindow, now: datetime) -> None:
        self.window = window
        self.retry_after_s = window.retry_after_s(now)
        super().__init__(
            f"The API key '{key.name}' (cw_{key.prefix}_…) has spent its {window.name} budget "
            f"(${window.hard_usd}; ${window.spent.quantize(Decimal('0.0001'))} used); "
            f"it resets at {window.resets_at:%Y-%m-%d %H:%M} UTC."
        )


def key_spend(key_id: int, start: datetime, end: datetime) -> Decimal:
    spent = Run.objects.filter(api_key_id=key_id, created_at__gte=start, created_at__lt=end).aggregate(
        s=Sum("cost_usd")
    )["s"]
    return Decimal(spent or 0)


def key_budget_window(key: ApiKey, now: datetime | None = None) -> BudgetWindow | None:
    """The key's budget window now (spend read only when a limit is set); None without one."""
    if key.budget_soft_usd is None and key.budget_hard_usd is None:
        return None
    now = now or datetime.now(UTC)
    start, reset = period_bounds(key.budget_period, now)
    return BudgetWindow(
        key.budget_period,
        start,
        reset,
        key_spend(key.pk, start, reset),
        key.budget_soft_usd,
        key.budget_hard_usd,
    )


def key_budget_check(key: ApiKey, now: datetime | None = None) -> str | None:
    """Raise ``KeyBudgetExceeded`` when the key's hard budget is spent; the soft budget's warning
    (or None) otherwise."""
    now = now or datetime.now(UTC)
    window = key_budget_window(key, now)
    if window is None:
        return None
    if window.hard_exceeded:
        raise KeyBudgetExceeded(key, window, now)
    if window.soft_exceeded:
        return (
            f"the API key's {window.name} soft budget (${window.soft_usd}) is reached "
            f"(${window.spent:.4f} spent)"
        )
    return None


def key_windows(keys: list[Any], now: datetime | None = None) -> dict[int, BudgetWindow]:
    """Each budgeted key's window (the key page and /insights/ show spend against it)."""
    now = now or datetime.now(UTC)
    out = {}
    for key in keys:
        window = key_budget_window(key, now)
        if window is not None:
            out[key.pk] = window
    return out
