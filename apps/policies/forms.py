"""Forms for the policy editor and the test box. The spec itself is validated by
`apps.policies.spec` (field-path errors); this layer only checks the JSON syntax and the input
limits (size, nesting depth, NUL/unpaired surrogates: `apps.core.input_limits`)."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from apps.core.input_limits import InputRefused, safe_json_loads


class SpecField(forms.CharField):
    widget = forms.Textarea

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value) or "{}"
        try:
            data = safe_json_loads(text)
        except InputRefused as err:
            raise forms.ValidationError(f"Refused: {err.message}") from None
        except json.JSONDecodeError as err:
            raise forms.ValidationError(
                f"Not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}."
            ) from None
        if not isinstance(data, dict):
            raise forms.ValidationError("The policy must be a JSON object ({...}).")
        return data


class PolicyEditForm(forms.Form):
    spec = SpecField(
        label="Policy (JSON, advanced mode)",
        required=False,
        help_text="Every field is optional; an omitted field takes the default. See the field reference below.",
        widget=forms.Textarea(
            attrs={"rows": 28, "class": "mono", "spellcheck": "false", "data-testid": "spec-editor"}
        ),
    )
    note = forms.CharField(
        label="Change note",
        max_length=300,
        required=False,
        help_text="Why this change (kept with the version and shown in the history).",
    )
    sample_prompt = forms.CharField(
        label="Sample prompt",
        required=False,
        max_length=200_000,
        widget=forms.Textarea(attrs={"rows": 4, "data-testid": "sample-prompt"}),
        help_text="Test box: runs the input, step-output and output guardrails on this text. No model is called.",
    )
    sample_classification = forms.ChoiceField(
        label="Classification",
        required=False,
        choices=[("", "not marked"), ("confidential", "confidential")],
        help_text="Test box: treat the sample as marked confidential.",
    )
    sample_plan = forms.CharField(
        label="Sample plan",
        required=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "data-testid": "sample-plan"}),
        help_text=(
            "Test box (optional): a conductor plan as the three lists, e.g. "
            'model_id = [0, 1]; subtasks = ["Draft", "Answer"]; access_list = [[], "all"]. '
            "Worker ids are positions in the team's default pool."
        ),
    )
    replay_count = forms.IntegerField(
        label="Past runs to replay",
        required=False,
        min_value=1,
        max_value=200,
        initial=50,
        help_text="Replay: the team's last N finished runs (at most 200), from what they stored. No model is called.",
        widget=forms.NumberInput(attrs={"data-testid": "replay-count"}),
    )


class RollbackForm(forms.Form):
    note = forms.CharField(max_length=300, required=False, help_text="Why roll back.")
