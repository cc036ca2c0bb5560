"""The /insights/ filters: all in the URL (GET), so a view can be bookmarked and shared."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any, cast

from django import forms

from apps.runs.models import Strategy, strategy_name

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MAX_CUSTOM_DAYS = 366


class InsightFilterForm(forms.Form):
    range = forms.ChoiceField(
        choices=[("24h", "Last 24 h"), ("7d", "Last 7 days"), ("30d", "Last 30 days"), ("custom", "Custom")],
        required=False,
    )
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="From")
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="To")
    team = forms.ChoiceField(required=False)
    pool = forms.ChoiceField(required=False)
    worker = forms.ChoiceField(required=False)
    # Named as the playground names them (issue 42).
    strategy = forms.ChoiceField(
        choices=[("", "any"), *((v, strategy_name(v)) for v in Strategy.values)], required=False
    )

    def __init__(
        self, *args: Any, teams: list[str], pools: list[str], workers: list[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # Only what the viewer may see is offered (and accepted).
        cast(forms.ChoiceField, self.fields["team"]).choices = [("", "all visible"), *((t, t) for t in teams)]
        cast(forms.ChoiceField, self.fields["pool"]).choices = [("", "any"), *((p, p) for p in pools)]
        cast(forms.ChoiceField, self.fields["worker"]).choices = [("", "any"), *((w, w) for w in workers)]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("range") == "custom":
            start, end = data.get("date_from"), data.get("date_to")
            if not start or not end:
                raise forms.ValidationError("A custom range needs both dates (date_from and date_to).")
            if end < start:
                raise forms.ValidationError("date_to is before date_from.")
            if (end - start).days > MAX_CUSTOM_DAYS:
                raise forms.ValidationError(f"A custom range is at most {MAX_CUSTOM_DAYS} days.")
        return data

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """[start, end) in UTC for the chosen range (24 h when the form is unbound or invalid)."""
        data = self.cleaned_data if self.is_bound and self.is_valid() else {}
        if data.get("range") == "custom":
            return _day(data["date_from"]), _day(data["date_to"]) + timedelta(days=1)
        span = RANGES.get(data.get("range") or "24h", RANGES["24h"])
        if span > timedelta(hours=48):  # drawn (and rolled up) per UTC day: whole days, today included
            end = _day(now.astimezone(UTC).date()) + timedelta(days=1)
            return end - span, end
        end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        return end - span, end


def _day(d: date) -> datetime:
    return datetime.combine(d, time.min, tzinfo=UTC)
