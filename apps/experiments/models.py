"""Evaluation sets (a team's labelled questions) and experiments (every question through every arm).

An experiment records what makes a re-run reproducible: its seed, the policy version in force and
the pool's worker and conductor model names at start.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Dataset(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=120)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    row_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.row_count} rows)"


class DatasetItem(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="items")
    index = models.PositiveIntegerField()  # 1-based line number in the uploaded file
    messages = models.JSONField()  # [{"role", "content"}, ...]
    # NULL = no reference (nothing to score against); "" would be a reference of the empty answer.
    reference = models.TextField(null=True, blank=True)  # noqa: DJ001
    tags = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["dataset", "index"]
        constraints = [models.UniqueConstraint(fields=["dataset", "index"], name="dataset_item_index")]

    def __str__(self) -> str:
        return f"{self.dataset_id}:{self.index}"

    @property
    def question(self) -> str:
        """The text a run is asked: the last user turn, with earlier turns as a transcript."""
        msgs = self.messages or []
        if len(msgs) == 1:
            return str(msgs[0]["content"])
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in msgs)


class EvaluatorKind(models.TextChoices):
    EXACT = "exact", "Exact match"
    REGEX = "regex", "Regular expression"
    # A worker model grades each answer against a rubric (apps.feedback.evaluators.judge_score).
    JUDGE = "judge", "LLM judge with a rubric"


class ExperimentStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


TERMINAL_EXPERIMENT = (ExperimentStatus.SUCCEEDED, ExperimentStatus.CANCELLED, ExperimentStatus.FAILED)


class Experiment(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="experiments")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="experiments")
    pool = models.ForeignKey("workers.Pool", on_delete=models.PROTECT, related_name="experiments")
    arms = models.JSONField(default=list)  # ["single:<worker>", "moa", "pev", "conductor-mini", ...]
    evaluator = models.CharField(max_length=8, choices=EvaluatorKind.choices, default=EvaluatorKind.EXACT)
    # The LLM judge: a worker of one of the team's pools and what a good answer does.
    judge_pool = models.ForeignKey(
        "workers.Pool", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    judge_worker = models.CharField(max_length=60, blank=True, default="")
    rubric = models.TextField(blank=True, default="")
    seed = models.IntegerField(default=0)
    policy_version_id_at_start = models.IntegerField(null=True, blank=True)
    models_at_start = models.JSONField(
        default=dict, blank=True
    )  # {"workers": {slug: model}, "conductor": ...}
    status = models.CharField(
        max_length=10, choices=ExperimentStatus.choices, default=ExperimentStatus.QUEUED
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"experiment #{self.pk} on {self.dataset.name}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_EXPERIMENT


class ExperimentRun(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="experiment_runs")
    item = models.ForeignKey(DatasetItem, on_delete=models.CASCADE, related_name="+")
    arm = models.CharField(max_length=80)
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=20, blank=True, default="")  # the run's final status
    score = models.FloatField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    tokens = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    scored_at = models.DateTimeField(null=True, blank=True)
    # Why there is no score (the judge refused, a reply without a score...); never content.
    score_note = models.CharField(max_length=200, blank=True, default="")
    judging_since = models.DateTimeField(null=True, blank=True)  # the LLM judge's claim

    class Meta:
        ordering = ["experiment", "item__index", "arm"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "item", "arm"], name="experiment_run_unique"),
        ]
        indexes = [models.Index(fields=["run"], name="experiment_run_run")]

    def __str__(self) -> str:
        return f"{self.experiment_id}:{self.item_id}:{self.arm}"
