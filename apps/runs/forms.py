from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms

from apps.core.types import Viewer
from apps.governance import selectors as gov
from apps.runs.models import STRATEGY_NAMES, RunStatus, Strategy
from apps.runs.search import MAX_QUERY_CHARS, run_ref_range
from apps.runs.services import MAX_QUESTION_CHARS
from apps.workers.engine_adapter import pool_unavailable_reason
from apps.workers.models import Pool, Worker

if TYPE_CHECKING:
    from apps.governance.models import Team
    from apps.workers.models import Pool

# What the playground offers, mapped to (strategy, preset).
STRATEGY_CHOICES = [
    *((v, STRATEGY_NAMES[v]) for v in ("conductor-mini", "conductor-ultra", "single", "moa", "pev")),
    ("learned", f"{STRATEGY_NAMES['learned']} (picks one of the above per request)"),
]


def split_strategy(value: str) -> tuple[str, str]:
    if value.startswith("conductor-"):
        return Strategy.CONDUCTOR, value.split("-", 1)[1]
    return value, ""


class PlaygroundForm(forms.Form):
    prompt = forms.CharField(
        widget=forms.Textarea(
            attrs={"rows": 5, "data-testid": "prompt-input", "placeholder": "Ask something…"}
        ),
        max_length=MAX_QUESTION_CHARS,
        error_messages={
            "required": "Write a prompt to run.",
            "max_length": "The prompt is too long (%(limit_value)d characters at most).",
        },
    )
    strategy = forms.ChoiceField(
        choices=STRATEGY_CHOICES,
        initial="conductor-mini",
        widget=forms.Select(attrs={"data-testid": "strategy-select"}),
    )
    pool: forms.ModelChoiceField[Pool] = forms.ModelChoiceField(
        queryset=None,
        empty_label=None,
        error_messages={"required": "Choose a pool.", "invalid_choice": "You may not run on that pool."},
        widget=forms.Select(attrs={"data-testid": "pool-select"}),
    )
    team: forms.ModelChoiceField[Team] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="(pool's team / my team)",
        error_messages={"invalid_choice": "You may not start runs for that team."},
    )
    worker: forms.ModelChoiceField[Worker] = forms.ModelChoiceField(
        queryset=Worker.objects.none(),
        required=False,
        empty_label="(pool default)",
        help_text="Only for the single-worker strategy.",
        error_messages={"invalid_choice": "That worker is not in a pool you may use."},
    )
    compare = forms.ChoiceField(
        choices=[("", "— no comparison —"), *STRATEGY_CHOICES],
        required=False,
        help_text="Run the same prompt through a second strategy side by side.",
        widget=forms.Select(attrs={"data-testid": "compare-select"}),
    )

    def __init__(self, *args: Any, user: Viewer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pools = Pool.objects.visible_to(user, "use").filter(enabled=True).order_by("slug")
        cast("forms.ModelChoiceField[Pool]", self.fields["pool"]).queryset = pools
        teams = gov.teams_runnable_by(user).order_by("slug")
        cast("forms.ModelChoiceField[Team]", self.fields["team"]).queryset = teams
        # Say up front which pools cannot run (e.g. a provider key not set) and preselect one that
        # can — the team's default first — so a first run does not fail on a keyless pool.
        unavailable = {pool.pk: pool_unavailable_reason(pool) for pool in pools}
        self.fields["pool"].label_from_instance = lambda pool: (  # type: ignore[attr-defined]
            f"{pool.name} — unavailable: {unavailable[pool.pk]}" if unavailable.get(pool.pk) else pool.name
        )
        if not self.is_bound:
            defaults = [team.default_pool_id for team in teams if team.default_pool_id]
            ready = [pool.pk for pool in pools if not unavailable.get(pool.pk)]
            preferred = [pk for pk in defaults if pk in ready] + ready
            if preferred and "pool" not in self.initial:
                self.initial["pool"] = preferred[0]
        cast("forms.ModelChoiceField[Worker]", self.fields["worker"]).queryset = (
            Worker.objects.filter(pool_entries__pool__in=pools).distinct().order_by("slug")
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        worker, pool = data.get("worker"), data.get("pool")
        if worker is not None and data.get("strategy") != "single":
            self.add_error("worker", "A worker is only chosen for the single-worker strategy.")
        elif worker is not None and pool is not None and not pool.pool_workers.filter(worker=worker).exists():
            self.add_error("worker", f"“{worker}” is not in the pool “{pool}”.")
        if data.get("compare") and data.get("compare") == data.get("strategy"):
            self.add_error("compare", "Choose a different strategy to compare with.")
        return data


class RunFilterForm(forms.Form):
    q = forms.CharField(
        required=False,
        max_length=MAX_QUERY_CHARS,
        label="Search",
        help_text="Words in the question or the answer, or a run id (8 characters are enough).",
        widget=forms.TextInput(
            attrs={
                "type": "search",
                "data-testid": "run-search",
                "placeholder": "Search questions and answers",
            }
        ),
    )
    team = forms.CharField(required=False, max_length=50)
    user = forms.CharField(required=False, max_length=150)
    status = forms.ChoiceField(choices=[("", "any"), *RunStatus.choices], required=False)
    strategy = forms.ChoiceField(choices=[("", "any"), *Strategy.choices], required=False)
    pool = forms.CharField(required=False, max_length=50, help_text="Pool slug")
    model = forms.CharField(required=False, max_length=100, help_text="Worker slug or model name")
    worker = forms.CharField(required=False, max_length=60, help_text="Worker slug")
    key = forms.CharField(required=False, max_length=100, label="API key", help_text="Key prefix or name")
    request_id = forms.CharField(required=False, max_length=64, label="Request id")
    client_user = forms.CharField(
        required=False, max_length=256, label="Client user", help_text="The user field of a /v1 request"
    )
    metadata = forms.CharField(
        required=False,
        max_length=600,
        help_text="key=value of a /v1 request's metadata",
        error_messages={"invalid": "Write metadata as key=value."},
    )
    id = forms.CharField(
        required=False, max_length=36, label="Run id", help_text="Full or first 8 characters"
    )
    date_from = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": "Use the format YYYY-MM-DD."},
    )
    date_to = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        error_messages={"invalid": "Use the format YYYY-MM-DD."},
    )
    sort = forms.ChoiceField(
        choices=[
            ("newest", "newest"),
            ("oldest", "oldest"),
            ("cost", "cost"),
            ("tokens", "output tokens"),
            ("latency", "latency"),
        ],
        required=False,
    )

    def clean_metadata(self) -> tuple[str, str] | None:
        raw = self.cleaned_data.get("metadata") or ""
        if not raw:
            return None
        key, sep, value = raw.partition("=")
        if not sep or not key.strip():
            raise forms.ValidationError("Write metadata as key=value, e.g. customer=acme.")
        return key.strip(), value.strip()

    def clean_id(self) -> str:
        value = (self.cleaned_data.get("id") or "").strip()
        if value and run_ref_range(value) is None:
            raise forms.ValidationError(
                "Enter a run id: the full id or its first 8 characters or more (e.g. 3f2a9c1d)."
            )
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("date_from") and data.get("date_to") and data["date_from"] > data["date_to"]:
            self.add_error("date_to", "The end date is before the start date.")
        return data
