"""The tool server registration form: shape here, meaning (egress, allow-lists, permissions) in
``apps.tools.services`` whose errors land on the same fields."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any, cast

from django import forms

from apps.tools.models import Transport

if TYPE_CHECKING:
    from apps.governance.models import Team


class ToolServerForm(forms.Form):
    team: forms.ModelChoiceField[Team] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— platform (all teams, superusers only) —",
        help_text="The team that owns this server and its credential.",
        error_messages={"invalid_choice": "Choose one of your teams."},
    )
    slug = forms.SlugField(
        max_length=50,
        help_text="Tools are named <slug>.<tool> in policies and plans.",
        error_messages={
            "required": "Enter a slug.",
            "invalid": "Use lowercase letters, digits and hyphens only.",
        },
    )
    name = forms.CharField(max_length=100, error_messages={"required": "Give the server a name."})
    transport = forms.ChoiceField(choices=Transport.choices)
    url = forms.CharField(
        required=False,
        max_length=300,
        help_text="Streamable HTTP endpoint, e.g. https://tools.example.com/mcp (the egress rules apply).",
    )
    command = forms.CharField(
        required=False,
        max_length=1000,
        help_text="stdio only (superusers): the command line; its executable must be in MCP_STDIO_COMMANDS.",
    )
    credential = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored encrypted; only its last four characters are shown again.",
    )
    credential_name = forms.CharField(
        required=False,
        max_length=100,
        help_text="HTTP header (default Authorization: Bearer …) or, for stdio, the environment variable.",
    )

    def __init__(self, *args: Any, teams: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast("forms.ModelChoiceField[Team]", self.fields["team"]).queryset = teams

    def clean_command(self) -> list[str]:
        raw = self.cleaned_data.get("command") or ""
        try:
            return shlex.split(raw)
        except ValueError as err:
            raise forms.ValidationError(f"Cannot read the command line: {err}.") from None
