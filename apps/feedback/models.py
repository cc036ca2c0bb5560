"""Feedback as data: per-team metrics, feedback items on runs, and automatic evaluators.

A ``Metric`` is what a team measures (TensorZero's shape: boolean or float, maximise or minimise,
about a whole run or one step). A ``Feedback`` row is one value of one metric for one run (or one
step of it) from one source: the thumbs control, the API, a reviewer's verdict or an evaluator.
Booleans are stored as 1.0 / 0.0 so every consumer (the learned router, exports) reads one number.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

COMMENT_MAX = 1000  # a feedback comment is a short note, not a document
DEFAULT_METRIC = "helpful"  # every team has it; the thumbs control writes it
REVIEW_METRIC = "review_approved"  # a reviewer's sign-off (1) or flag (0)


class MetricKind(models.TextChoices):
    BOOLEAN = "boolean", "Boolean"
    FLOAT = "float", "Float"


class Optimize(models.TextChoices):
    MAX = "max", "Higher is better"
    MIN = "min", "Lower is better"


class MetricLevel(models.TextChoices):
    RUN = "run", "Run"
    STEP = "step", "Step"


class FeedbackSource(models.TextChoices):
    THUMBS = "thumbs", "Thumbs"
    API = "api", "API"
    REVIEWER = "reviewer", "Reviewer"
    EVALUATOR = "evaluator", "Evaluator"


class EvaluatorKind(models.TextChoices):
    JSON_SCHEMA = "json_schema", "JSON schema valid"
    REGEX = "regex", "Regex matches the reference"
    EXACT_MATCH = "exact_match", "Exact match with the reference"
    JUDGE = "judge", "Judge model with a rubric"


class Metric(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="metrics")
    name = models.SlugField(max_length=64)
    kind = models.CharField(max_length=8, choices=MetricKind.choices, default=MetricKind.BOOLEAN)
    optimize = models.CharField(max_length=3, choices=Optimize.choices, default=Optimize.MAX)
    level = models.CharField(max_length=4, choices=MetricLevel.choices, default=MetricLevel.RUN)
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="metric_team_name")]

    def __str__(self) -> str:
        return self.name


class Feedback(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="feedback")
    step_index = models.PositiveSmallIntegerField(null=True, blank=True)
    metric = models.ForeignKey(Metric, on_delete=models.PROTECT, related_name="feedback")
    value = models.FloatField()
    comment = models.CharField(max_length=COMMENT_MAX, blank=True)
    source = models.CharField(max_length=10, choices=FeedbackSource.choices)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    api_key = models.ForeignKey(
        "api.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    evaluator_name = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["run", "-created_at"], name="feedback_run_created"),
            models.Index(fields=["metric", "-created_at"], name="feedback_metric_created"),
        ]

    def __str__(self) -> str:
        return f"{self.metric_id}={self.value:g} on {self.run_id}"

    @property
    def who(self) -> str:
        """Who or what gave it, for lists (never a secret: a key is named by its prefix)."""
        if self.source == FeedbackSource.EVALUATOR:
            return f"evaluator {self.evaluator_name}"
        if self.api_key_id is not None and self.api_key is not None:
            return f"key {self.api_key.prefix}"
        if self.author_id is not None and self.author is not None:
            return self.author.get_username()
        return "system"


class Evaluator(models.Model):
    """An automatic check run after each succeeded run of the team; it records ``metric``."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="evaluators")
    name = models.SlugField(max_length=64)
    metric = models.ForeignKey(Metric, on_delete=models.PROTECT, related_name="evaluators")
    kind = models.CharField(max_length=12, choices=EvaluatorKind.choices)
    # json_schema: {"schema": {...}}; regex: {"flags": "i"} (the reference is the pattern, or
    # {"pattern": "..."} without one); exact_match: {"normalize": true}; judge: {"rubric", "worker"?}
    config = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="evaluator_team_name")]

    def __str__(self) -> str:
        return self.name
