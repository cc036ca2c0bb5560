"""Forms of /experiments/: upload an evaluation set; start an experiment."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.core.types import Viewer
from apps.experiments.datasets import MAX_FILE_BYTES, DatasetInvalid, ParsedItem, parse_jsonl
from apps.experiments.models import Dataset, EvaluatorKind
from apps.experiments.selectors import datasets_visible_to
from apps.experiments.services import COMPOSITE_ARMS
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.workers.models import Pool


class DatasetUploadForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), to_field_name="slug", empty_label=None)
    name = forms.CharField(max_length=120)
    file = forms.FileField(
        help_text='JSONL, one object per line: {"input": "…", "reference": "…", "tags": ["…"]} or '
        '{"messages": [{"role": "user", "content": "…"}], …}. At most 2,000 lines and 5 MB.'
    )

    def __init__(self, *args: Any, user: Viewer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = gov.teams_runnable_by(user).order_by("slug")  # type: ignore[attr-defined]
        self.items: list[ParsedItem] = []

    def clean_file(self) -> Any:
        upload = self.cleaned_data["file"]
        if upload.size > MAX_FILE_BYTES:
            raise forms.ValidationError(
                f"The file is {upload.size:,} bytes; the limit is {MAX_FILE_BYTES:,} (5 MB)."
            )
        try:
            self.items = parse_jsonl(upload.read())
        except DatasetInvalid as err:
            # Every bad line, each its own message: the whole upload is refused.
            raise forms.ValidationError([forms.ValidationError(e) for e in err.errors]) from None
        return upload


class ExperimentForm(forms.Form):
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none(), empty_label=None)
    pool = forms.ModelChoiceField(queryset=Pool.objects.none(), to_field_name="slug", empty_label=None)
    arms = forms.MultipleChoiceField(
        widget=forms.CheckboxSelectMultiple,
        help_text="Strategies to compare; single arms must be in the pool.",
    )
    evaluator = forms.ChoiceField(
        choices=EvaluatorKind.choices, help_text="Scores each answer against the item's reference."
    )
    seed = forms.IntegerField(initial=0, min_value=0, max_value=2**31 - 1)

    def __init__(self, *args: Any, user: Viewer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = datasets_visible_to(user)  # type: ignore[attr-defined]
        pools = Pool.objects.visible_to(user, "use").filter(enabled=True).order_by("slug")
        self.fields["pool"].queryset = pools  # type: ignore[attr-defined]
        singles = sorted(
            {
                pw.worker.slug
                for pool in pools.prefetch_related("pool_workers__worker")
                for pw in pool.pool_workers.all()
            }
        )
        arms: list[tuple[str, str]] = [(f"single:{s}", f"single:{s}") for s in singles]
        arms += [(a, a) for a in COMPOSITE_ARMS]
        self.fields["arms"].choices = arms  # type: ignore[attr-defined]
