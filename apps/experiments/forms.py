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
from apps.runs.models import strategy_name
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
    # Labelled as the page shows it, so an error reads "Strategies: …", never the field's name.
    arms = forms.MultipleChoiceField(
        label="Strategies",
        widget=forms.CheckboxSelectMultiple,
        help_text="Strategies to compare; a single worker must be in the pool.",
        error_messages={"required": "Pick at least one strategy to compare."},
    )
    evaluator = forms.ChoiceField(
        label="Scorer",
        choices=EvaluatorKind.choices,
        help_text="Scores each answer: against the item's reference, or by an LLM judge with your rubric.",
    )
    judge = forms.ChoiceField(
        label="Judge worker",
        required=False,
        help_text="LLM judge only: a worker of one of the team's pools; its calls pass the team's guardrails.",
    )
    rubric = forms.CharField(
        label="Rubric",
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="LLM judge only: what a good answer does (the judge also sees the reference, if any).",
    )
    seed = forms.IntegerField(initial=0, min_value=0, max_value=2**31 - 1)

    def __init__(self, *args: Any, user: Viewer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = datasets_visible_to(user)  # type: ignore[attr-defined]
        pools = Pool.objects.visible_to(user, "use").filter(enabled=True).order_by("slug")
        self.fields["pool"].queryset = pools  # type: ignore[attr-defined]
        pairs = sorted(
            {
                (pool.slug, pw.worker.slug)
                for pool in pools.prefetch_related("pool_workers__worker")
                for pw in pool.pool_workers.all()
            }
        )
        singles = sorted({w for _p, w in pairs})
        # Values stay the stored arm ids; labels are the playground's names (issue 42).
        arms: list[tuple[str, str]] = [(f"single:{s}", strategy_name(f"single:{s}")) for s in singles]
        arms += [(a, strategy_name(a)) for a in COMPOSITE_ARMS]
        self.fields["arms"].choices = arms  # type: ignore[attr-defined]
        self.fields["judge"].choices = [  # type: ignore[attr-defined]
            ("", "(choose a worker)"),
            *((f"{p}/{w}", f"{w} (pool {p})") for p, w in pairs),
        ]
        self._pools = {p.slug: p for p in pools}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["judge_pool"], data["judge_worker"] = None, ""
        if data.get("evaluator") == EvaluatorKind.JUDGE:
            choice = data.get("judge") or ""
            if not choice:
                self.add_error("judge", "The LLM judge needs a judge worker.")
            else:
                pool_slug, _, worker = choice.partition("/")
                data["judge_pool"], data["judge_worker"] = self._pools.get(pool_slug), worker
            if not (data.get("rubric") or "").strip():
                self.add_error("rubric", "The LLM judge needs a rubric: what a good answer does.")
        return data
