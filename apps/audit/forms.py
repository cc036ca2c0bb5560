"""Audit forms: the run page's review panel, the review desk's filters, bulk sign-off and flag resolution."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import forms
from django.db.models import QuerySet
from django.http import HttpResponseBadRequest, QueryDict

from apps.audit.models import ReviewDecision
from apps.runs.review_queue import AGE_LABELS, REASONS, TABS
from apps.runs.reviews import REVIEW_TEXT_MAX


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


class ReviewQueueFilterForm(forms.Form):
    """The review desk's filters, all in the URL (a filtered queue can be bookmarked and shared)."""

    tab = forms.ChoiceField(choices=list(TABS.items()), required=False)
    team: forms.ModelChoiceField[Any] = forms.ModelChoiceField(
        queryset=None, required=False, to_field_name="slug", empty_label="All my teams"
    )
    reason = forms.ChoiceField(choices=[("", "Any reason"), *REASONS.items()], required=False)
    age = forms.ChoiceField(choices=[("", "Any age"), *AGE_LABELS.items()], required=False)

    def __init__(self, *args: Any, teams: QuerySet[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams  # type: ignore[attr-defined]


class BulkReviewForm(forms.Form):
    run = forms.TypedMultipleChoiceField(
        choices=(), coerce=str, error_messages={"required": "Select at least one run."}
    )
    note = forms.CharField(
        max_length=REVIEW_TEXT_MAX,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "Write the note that goes with this sign-off."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Ids are checked against what the user may review in the view, not against a fixed list.
        self.fields["run"].choices = [(v, v) for v in self.data.getlist("run")] if self.data else []  # type: ignore[attr-defined]

    def clean_run(self) -> list[UUID]:
        try:
            return [UUID(v) for v in self.cleaned_data["run"]]
        except ValueError:
            raise forms.ValidationError("A selected run id is not a run id.") from None


class FlagResolveForm(forms.Form):
    note = forms.CharField(
        max_length=REVIEW_TEXT_MAX,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "Say how the flag was resolved."},
    )


# --- bounds of the search/export query parameters -------------------------------------------------
# Every parameter is bounded before it reaches a query or the export's own audit record: a padded
# value would otherwise be copied into the tamper-evident chain, and an out-of-range id would fail
# the database cast (a 500) instead of answering 400.
SEARCH_PARAM_MAX_CHARS = {
    "run": 36,
    "team": 50,
    "actor": 150,
    "type": 64,
    "object": 130,
    "since": 32,
    "until": 32,
}
PAGE_PARAMS = ("before", "after")
DB_INT_MAX = 2**63 - 1  # largest id/seq a BIGINT column holds


def search_param_errors(
    query: QueryDict, *, allowed_extra: tuple[str, ...] = (), reject_unknown: bool = True
) -> dict[str, str]:
    """Bounds of the ``/audit/`` search and export parameters: {parameter: what is wrong}.

    The export rejects unknown parameters (nothing rides along into its audit record); the search
    page ignores them, as a page does.
    """
    errors: dict[str, str] = {}
    allowed = (*SEARCH_PARAM_MAX_CHARS, *allowed_extra)
    if len(query) > len(allowed) + (0 if reject_unknown else 20):
        return {"(query)": f"at most {len(allowed)} parameters: {', '.join(allowed)}"}
    for name in query:
        if name not in allowed:
            if reject_unknown:
                errors[name[:40]] = f"unknown parameter: use {', '.join(allowed)}"
            continue
        values = query.getlist(name)
        if len(values) > 1:
            errors[name] = f"give '{name}' once (it appears {len(values)} times)"
            continue
        value = values[0].strip()
        limit = SEARCH_PARAM_MAX_CHARS.get(name, 19)
        if len(value) > limit:
            errors[name] = f"'{name}' is at most {limit} characters (got {len(value)})"
        elif name in PAGE_PARAMS and value and not (value.isdigit() and int(value) <= DB_INT_MAX):
            errors[name] = f"'{name}' is a sequence number from 0 to {DB_INT_MAX}"
        elif name in ("team", "actor") and value.isdigit() and int(value) > DB_INT_MAX:
            errors[name] = f"'{name}' as an id is at most {DB_INT_MAX}"
    return errors


def bad_search_response(errors: dict[str, str]) -> HttpResponseBadRequest:
    """A 400 naming each bad parameter (plain text: it answers download links and scripts alike)."""
    lines = [f"{name}: {message}" for name, message in sorted(errors.items())]
    return HttpResponseBadRequest(
        "Bad audit search parameters.\n" + "\n".join(lines[:20]) + "\n",
        content_type="text/plain; charset=utf-8",
    )
