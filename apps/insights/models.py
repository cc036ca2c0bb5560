"""Hourly rollups kept by the run-event observer (apps.insights.rollup), so /insights/ reads a few
thousand small rows instead of scanning every run.

Grain: team, pool, strategy, worker and UTC hour — and the same per UTC day (``grain``). ``worker_key == ""`` is the run-level row (runs,
statuses, total spend, planning); other rows are one worker's steps. Counters only ever grow by
database-side additions (one ``INSERT ... ON CONFLICT DO UPDATE`` per event and table,
``apps.insights.upsert``), so concurrent runs never lose an increment.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

RUN_ROW = ""  # worker_key of the run-level row
# Every count is kept twice: per hour (24 h views) and per UTC day (longer ranges read ~24x fewer rows).
HOUR = "h"
DAY = "d"


class Rollup(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("workers.Pool", on_delete=models.CASCADE, related_name="+")
    strategy = models.CharField(max_length=12)
    worker_key = models.CharField(max_length=60, blank=True, default=RUN_ROW)
    grain = models.CharField(max_length=1, default=HOUR)  # "h": the hour; "d": the UTC day
    hour = models.DateTimeField()  # start of the bucket
    # run-level row
    runs = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    blocked = models.PositiveIntegerField(default=0)
    held = models.PositiveIntegerField(default=0)
    repairs = models.PositiveIntegerField(default=0)
    fallbacks = models.PositiveIntegerField(default=0)
    plans_blocked = models.PositiveIntegerField(default=0)
    orch_input_tokens = models.PositiveBigIntegerField(default=0)
    orch_output_tokens = models.PositiveBigIntegerField(default=0)
    orch_cost_usd = models.DecimalField(max_digits=18, decimal_places=8, default=0)
    # both kinds: tokens, spend and latency of what the row counts (runs or steps)
    steps = models.PositiveIntegerField(default=0)
    steps_failed = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=18, decimal_places=8, default=0)
    latency_ms_sum = models.FloatField(default=0)
    latency_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "pool", "strategy", "worker_key", "grain", "hour"], name="rollup_unique_grain"
            )
        ]
        indexes = [models.Index(fields=["grain", "hour", "team"], name="rollup_grain_hour_team")]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.strategy}/{self.worker_key or '*'} @ {self.hour:%Y-%m-%d %H}h"


class GuardrailRollup(models.Model):
    """Guardrail checks per rule, stage, status and action per hour."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("workers.Pool", on_delete=models.CASCADE, related_name="+")
    strategy = models.CharField(max_length=12)
    grain = models.CharField(max_length=1, default=HOUR)  # "h": the hour; "d": the UTC day
    hour = models.DateTimeField()  # start of the bucket
    rule = models.CharField(max_length=80)
    stage = models.CharField(max_length=16)
    status = models.CharField(max_length=12)
    action = models.CharField(max_length=24, blank=True, default="")
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "pool", "strategy", "grain", "hour", "rule", "stage", "status", "action"],
                name="guardrailrollup_unique_grain",
            )
        ]
        indexes = [models.Index(fields=["grain", "hour", "team"], name="grollup_grain_hour_team")]

    def __str__(self) -> str:
        return f"{self.rule} {self.status}/{self.action} @ {self.hour:%Y-%m-%d %H}h"


class HistogramRollup(models.Model):
    """Bucketed distributions (latency, steps per run, recursion depth): percentiles without rows.

    ``bucket`` is the bucket's upper bound (ms for latencies, a count for steps and depth)."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("workers.Pool", on_delete=models.CASCADE, related_name="+")
    strategy = models.CharField(max_length=12)
    worker_key = models.CharField(max_length=60, blank=True, default=RUN_ROW)
    grain = models.CharField(max_length=1, default=HOUR)  # "h": the hour; "d": the UTC day
    hour = models.DateTimeField()  # start of the bucket
    metric = models.CharField(max_length=16)
    bucket = models.FloatField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "pool", "strategy", "worker_key", "grain", "hour", "metric", "bucket"],
                name="histrollup_unique_grain",
            )
        ]
        indexes = [models.Index(fields=["grain", "metric", "hour", "team"], name="hrollup_grain_metric_hour")]

    def __str__(self) -> str:
        return f"{self.metric}≤{self.bucket} x{self.count}"


class ReviewRollup(models.Model):
    """Review state of runs per team, pool, strategy and the hour (or UTC day) the run was
    *created* — the bucket the page's range means for reviews. Unlike the other rollups these
    counts are states, not events: a verdict moves a run from one counter to another
    (``apps.insights.reviews``), so they may go down (hence plain integers)."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("workers.Pool", on_delete=models.CASCADE, related_name="+")
    strategy = models.CharField(max_length=12)
    grain = models.CharField(max_length=1, default=HOUR)
    hour = models.DateTimeField()  # start of the bucket of Run.created_at
    pending = models.IntegerField(default=0)  # review_status == pending
    held = models.IntegerField(default=0)  # answer_held
    flagged = models.IntegerField(default=0)  # review_status == flagged
    approved = models.IntegerField(default=0)  # review_status == approved

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "pool", "strategy", "grain", "hour"], name="reviewrollup_unique_grain"
            )
        ]
        indexes = [models.Index(fields=["grain", "hour", "team"], name="rvrollup_grain_hour_team")]

    def __str__(self) -> str:
        return f"reviews {self.team_id}/{self.strategy} @ {self.hour:%Y-%m-%d %H}h"


class ReviewFact(models.Model):
    """One row per ``RunReview``, with the team of its run, so the reviews chart reads a range of
    one team's reviews by index instead of joining every run of the team (``RunReview`` has no
    team and no creation-time index; at 100k runs that join cost ~300 ms on SQLite). Written by a
    ``post_save`` of the review in the review's transaction (``apps.insights.reviews``)."""

    review = models.OneToOneField(
        "audit.RunReview", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    reviewer_label = models.CharField(max_length=150, blank=True)
    status = models.CharField(max_length=16)
    created_at = models.DateTimeField()  # the review's
    # The run's end as the review found it (set once, never changed after); None when the run
    # was still going: the chart then reads the run's own finished_at.
    run_finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Covers both reads of the chart (counts per reviewer and status; sign-off waits), so a
        # range is read from the index alone.
        indexes = [
            models.Index(
                fields=["team", "created_at", "reviewer_label", "status", "run_finished_at"],
                name="reviewfact_team_created",
            )
        ]

    def __str__(self) -> str:
        return f"review {self.review_id} of {self.run_id}"


class BudgetAlert(models.Model):
    """One threshold of one budget window crossed: raised once per team, period window and level."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    period = models.CharField(max_length=8)  # daily | monthly
    period_start = models.DateTimeField()
    threshold = models.PositiveSmallIntegerField()  # 50 | 80 | 100 (percent)
    limit_usd = models.DecimalField(max_digits=14, decimal_places=6)
    spent_usd = models.DecimalField(max_digits=18, decimal_places=8)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "period", "period_start", "threshold"], name="budgetalert_once_per_window"
            )
        ]

    def __str__(self) -> str:
        return f"{self.team_id} {self.period} budget at {self.threshold} %"


class BudgetNotice(models.Model):
    """The in-app notice of an alert, one per team admin (shown on /insights/)."""

    alert = models.ForeignKey(BudgetAlert, on_delete=models.CASCADE, related_name="notices")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["alert", "user"], name="budgetnotice_once")]

    def __str__(self) -> str:
        return f"notice of {self.alert} for {self.user_id}"


class WebhookDelivery(models.Model):
    """Delivery log of an alert's signed webhook: every attempt counted, the last outcome kept."""

    alert = models.OneToOneField(BudgetAlert, on_delete=models.CASCADE, related_name="delivery")
    url = models.URLField(max_length=500)
    attempts = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=12, default="pending")  # pending | delivered | failed
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"webhook of {self.alert_id}: {self.status} after {self.attempts}"
