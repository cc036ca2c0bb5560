"""Audit forms: the review form of the run page's review panel."""

from __future__ import annotations

from django import forms

from apps.audit.models import ReviewDecision
from apps.audit.services import REVIEW_TEXT_MAX


class RunReviewForm(forms.Form):
    status = forms.ChoiceField(
        choices=ReviewDecision.choices,
        widget=forms.RadioSelect,
        error_messages={
            "required": "Choose approved, flagged or needs follow-up.",
            "invalid_choice": "Choose approved, flagged or needs follow-up.",
        },
    )
    reason = forms.CharField(
        required=False,
        max_length=REVIEW_TEXT_MAX,
        widget=forms.TextInput,
        help_text="Required when flagging: what is wrong with this run?",
    )
    comment = forms.CharField(
        required=False, max_length=REVIEW_TEXT_MAX, widget=forms.Textarea(attrs={"rows": 3})
    )

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        if cleaned.get("status") == ReviewDecision.FLAGGED and not (cleaned.get("reason") or "").strip():
            self.add_error("reason", "Say why you flag this run.")
        return cleaned
