"""Forms of the team feedback settings page: a metric, an evaluator."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from apps.feedback.models import EvaluatorKind, Metric, MetricKind, MetricLevel, Optimize


class MetricForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="Letters, digits, - and _ (e.g. correct, latency_ok).")
    kind = forms.ChoiceField(choices=MetricKind.choices)
    optimize = forms.ChoiceField(choices=Optimize.choices)
    level = forms.ChoiceField(choices=MetricLevel.choices)
    description = forms.CharField(max_length=500, required=False)


class EvaluatorForm(forms.Form):
    name = forms.SlugField(max_length=64)
    metric = forms.ModelChoiceField(queryset=Metric.objects.none(), to_field_name="name")
    kind = forms.ChoiceField(choices=EvaluatorKind.choices)
    config = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        required=False,
        initial="{}",
        help_text='JSON. json_schema: {"schema": {...}}; judge: {"rubric": "...", "worker": "<slug>"}; '
        'exact_match: {"normalize": true}; regex: {} (the reference answer is the pattern).',
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, team: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["metric"].queryset = Metric.objects.filter(team_id=team.pk).order_by("name")  # type: ignore[attr-defined]

    def clean_config(self) -> Any:
        raw = (self.cleaned_data.get("config") or "").strip() or "{}"
        try:
            value = json.loads(raw)
        except ValueError as err:
            raise forms.ValidationError(f"config: not valid JSON ({err}).") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("config: must be a JSON object.")
        return value
