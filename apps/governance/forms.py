"""Forms for the team pages. They validate shape; the services validate meaning."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from apps.governance.models import Role
from apps.workers.models import Pool  # forms are pages: they may read every app


def apply_service_errors(form: forms.Form, exc: ValidationError) -> None:
    """Put a service's ``ValidationError`` on the matching form fields (others: non-field)."""
    if hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, exc.messages)


class TeamCreateForm(forms.Form):
    slug = forms.SlugField(
        max_length=50,
        help_text="Lowercase letters, digits and hyphens; used in URLs.",
        error_messages={
            "required": "Enter a slug.",
            "invalid": "Use lowercase letters, digits and hyphens only.",
        },
    )
    name = forms.CharField(max_length=100, error_messages={"required": "Give the team a name."})
    retention_days = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Erase run prompts and outputs after this many days; empty keeps them.",
        error_messages={
            "min_value": "Retention must be at least one day.",
            "invalid": "Enter a whole number of days.",
        },
    )


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150, error_messages={"required": "Enter the username to add."})
    role = forms.ChoiceField(
        choices=Role.choices,
        initial=Role.MEMBER,
        error_messages={"invalid_choice": "Choose a role from the list."},
    )

    def clean_username(self) -> Any:
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise ValidationError(f"No active user is called “{username}”.")
        self.cleaned_data["user"] = user
        return username


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(
        choices=Role.choices, error_messages={"invalid_choice": "Choose a role from the list."}
    )


class DefaultPoolForm(forms.Form):
    pool: forms.ModelChoiceField[Pool] = forms.ModelChoiceField(
        queryset=None,  # set per team
        required=False,
        empty_label="— none —",
        error_messages={"invalid_choice": "Choose one of the pools granted to this team."},
    )

    def __init__(self, *args: Any, pools: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast("forms.ModelChoiceField[Pool]", self.fields["pool"]).queryset = pools
