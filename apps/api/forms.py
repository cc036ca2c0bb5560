"""The team key form (browser UI). Validation of the values themselves lives in the service."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from apps.api.models import DEFAULT_SCOPES, ApiScope
from apps.api.services import MAX_RPM, MAX_TPM

BUDGET_PERIODS = [("monthly", "per UTC month"), ("daily", "per UTC day")]


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="What uses this key, e.g. “nightly report job”.",
        error_messages={"required": "Give the key a name so you can recognise it later."},
    )
    scopes = forms.MultipleChoiceField(
        choices=[(s.value, f"{s.value} — {s.label}") for s in ApiScope],
        initial=list(DEFAULT_SCOPES),
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one scope."},
        help_text="Grant only what the client needs. A key acts within this team only, never on "
        "platform objects, and never beyond the role its creator holds in the team.",
    )
    expires_at = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        help_text="Optional (UTC). The key stops working at this time.",
    )
    allowed_pools: forms.ModelMultipleChoiceField = forms.ModelMultipleChoiceField(
        queryset=None,  # set per team in __init__
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave empty to allow every pool the team may use.",
    )
    requests_per_minute = forms.IntegerField(min_value=1, max_value=MAX_RPM, initial=60)
    tokens_per_minute = forms.IntegerField(min_value=1, max_value=MAX_TPM, initial=100_000)
    budget_period = forms.ChoiceField(
        label="Budget period",
        choices=BUDGET_PERIODS,
        initial="monthly",
        required=False,
        help_text="Periods are UTC.",
    )
    budget_soft_usd = forms.DecimalField(
        label="Soft budget (USD)",
        required=False,
        min_value=Decimal("0.000001"),
        decimal_places=6,
        help_text="Optional. Reached: calls still run, with an x-conductor-budget-warning header.",
    )
    budget_hard_usd = forms.DecimalField(
        label="Hard budget (USD)",
        required=False,
        min_value=Decimal("0.000001"),
        decimal_places=6,
        help_text="Optional. Spent: the key's calls are refused (429, insufficient_quota) until the period resets.",
    )

    def __init__(self, *args: Any, pools: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["allowed_pools"]
        assert isinstance(field, forms.ModelMultipleChoiceField)
        field.queryset = pools


class ApiKeyBudgetForm(forms.Form):
    """One key's dollar budgets, edited in place on the key list (empty = no budget)."""

    budget_period = forms.ChoiceField(label="Period", choices=BUDGET_PERIODS)
    budget_soft_usd = forms.DecimalField(
        label="Soft (USD)", required=False, min_value=Decimal("0.000001"), decimal_places=6
    )
    budget_hard_usd = forms.DecimalField(
        label="Hard (USD)", required=False, min_value=Decimal("0.000001"), decimal_places=6
    )
