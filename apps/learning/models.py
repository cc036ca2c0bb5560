"""The learned router's rows: per-team router versions and one decision per routed run."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


class Router(models.Model):
    """One version of a team's router. The newest row of a team is the live one: it learns in
    place; older rows are immutable snapshots (taken every ``SNAPSHOT_EVERY`` updates, on demand,
    and before a rollback or reset), so any version can be restored."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="routers")
    version = models.PositiveIntegerField()
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    frozen = models.BooleanField(default=False)
    # Vowpal Wabbit's saved model (no prompt text: words enter it only as hashed features).
    state = models.BinaryField(null=True, blank=True)
    updates = models.PositiveIntegerField(default=0)  # learning steps since this version began
    reason = models.CharField(max_length=40, blank=True, default="")  # created, snapshot, rollback...
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "-version"]
        constraints = [models.UniqueConstraint(fields=["team", "version"], name="router_team_version")]

    def __str__(self) -> str:
        return f"router v{self.version} of team {self.team_id}"


class Decision(models.Model):
    """Which arm the router chose for a run, and why (the scores of every arm)."""

    run_id = models.UUIDField(unique=True)  # the run (runs sit above learning: no import, no FK)
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="router_decisions")
    router = models.ForeignKey(Router, null=True, on_delete=models.SET_NULL, related_name="decisions")
    router_version = models.PositiveIntegerField()
    # [{arm, kind, worker, preset, score, prob, forecast_cost_usd}] in the order the router saw them
    arms = models.JSONField(default=list)
    chosen_arm = models.CharField(max_length=120)
    explored = models.BooleanField(default=False)
    context = models.JSONField(default=dict)  # hashed words, tags, length, team (features.Context)
    context_hash = models.CharField(max_length=16, blank=True, default="")
    cost_scale_usd = models.FloatField(null=True, blank=True)
    latency_scale_ms = models.FloatField(null=True, blank=True)
    metric = models.CharField(max_length=100, blank=True, default="")
    reward = models.FloatField(null=True, blank=True)
    rewarded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "-created_at"], name="decision_team_created")]

    def __str__(self) -> str:
        return f"decision {self.chosen_arm} for run {self.run_id}"

    @property
    def chosen(self) -> dict[str, Any] | None:
        return next((a for a in self.arms if a.get("arm") == self.chosen_arm), None)
