"""Reads of the feedback app. Callers decide visibility of the run first (governance selectors)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apps.feedback.models import Evaluator, Feedback, Metric
from apps.feedback.services import ensure_default_metrics
from apps.runs.models import Run


def feedback_of_run(run: Run) -> QuerySet[Feedback]:
    return Feedback.objects.filter(run_id=run.pk).select_related("metric", "author", "api_key")


def metrics_of_team(team: Any) -> QuerySet[Metric]:
    ensure_default_metrics(team)
    return Metric.objects.filter(team_id=team.pk).order_by("name")


def evaluators_of_team(team: Any) -> QuerySet[Evaluator]:
    return Evaluator.objects.filter(team_id=team.pk).select_related("metric").order_by("name")
