"""Writes of the feedback app: metrics, feedback items, evaluators.

Every write is one transaction with its audit row; the learning app hears about a feedback item
only after it committed (``apps.learning.services.learn_from_feedback``, looked up at call time so
this app does not depend on it being there).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from uuid import UUID

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.models import RunReview
from apps.audit.services import audit_record, audit_run_event
from apps.core.types import Actor, Viewer, stored_user
from apps.feedback.models import (
    COMMENT_MAX,
    DEFAULT_METRIC,
    REVIEW_METRIC,
    Evaluator,
    EvaluatorKind,
    Feedback,
    FeedbackSource,
    Metric,
    MetricKind,
    MetricLevel,
    Optimize,
)
from apps.governance.models import Team
from apps.governance.selectors import can_change_team_policy
from apps.runs.models import Run

logger = logging.getLogger(__name__)

# The metrics every team starts with: (name, kind, optimize, level, description).
DEFAULT_METRICS: tuple[tuple[str, str, str, str, str], ...] = (
    (DEFAULT_METRIC, MetricKind.BOOLEAN, Optimize.MAX, MetricLevel.RUN, "Was the answer helpful? (thumbs)"),
    (
        REVIEW_METRIC,
        MetricKind.BOOLEAN,
        Optimize.MAX,
        MetricLevel.RUN,
        "A reviewer signed the run off (1) or flagged it (0).",
    ),
)
CONFIG_PERMISSION = "policies.change_policy (team admins and policy admins)"


class FeedbackInvalid(Exception):
    """Bad feedback input; ``param`` names the field, ``code`` the rule (for 400 answers)."""

    def __init__(self, message: str, *, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def ensure_default_metrics(team: Any) -> None:
    """Create the team's default metrics if missing (idempotent; safe under races)."""
    for name, kind, optimize, level, description in DEFAULT_METRICS:
        if Metric.objects.filter(team_id=team.pk, name=name).exists():
            continue
        try:
            with transaction.atomic():
                Metric.objects.create(
                    team_id=team.pk,
                    name=name,
                    kind=kind,
                    optimize=optimize,
                    level=level,
                    description=description,
                )
        except IntegrityError:  # another request created it first
            pass


def on_team_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """``post_save`` of ``governance.Team``: a new team starts with the default metrics."""
    if created and not raw:
        ensure_default_metrics(instance)


def _metric_for(team: Any, name: Any) -> Metric:
    ensure_default_metrics(team)
    if not isinstance(name, str) or not name.strip():
        raise FeedbackInvalid("'metric' must be the name of one of the team's metrics.", param="metric")
    metric = Metric.objects.filter(team_id=team.pk, name=name.strip()).first()
    if metric is None:
        names = ", ".join(Metric.objects.filter(team_id=team.pk).values_list("name", flat=True))
        raise FeedbackInvalid(
            f"The metric '{name.strip()[:64]}' is not defined for team '{team.slug}'. Its metrics: {names}.",
            param="metric",
            code="metric_not_found",
        )
    return metric


def coerce_value(metric: Metric, value: Any) -> float:
    """The stored number for ``value`` under ``metric``'s kind, or FeedbackInvalid naming the rule."""
    if metric.kind == MetricKind.BOOLEAN:
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, int | float) and value in (0, 1):
            return float(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return 1.0 if value.strip().lower() in ("true", "1") else 0.0
        raise FeedbackInvalid(
            f"The metric '{metric.name}' is boolean: 'value' must be true, false, 1 or 0.", param="value"
        )
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise FeedbackInvalid(
            f"The metric '{metric.name}' is a float: 'value' must be a finite number.", param="value"
        )
    return number


def _clean_comment(comment: Any) -> str:
    if comment is None:
        return ""
    if not isinstance(comment, str):
        raise FeedbackInvalid("'comment' must be a string.", param="comment", code="invalid_type")
    comment = comment.strip()
    if len(comment) > COMMENT_MAX:
        raise FeedbackInvalid(
            f"'comment' is {len(comment)} characters long; keep it to {COMMENT_MAX}.",
            param="comment",
            code="string_above_max_length",
        )
    return comment


def _step_index(run: Run, metric: Metric, step_index: Any) -> int | None:
    if metric.level == MetricLevel.RUN:
        if step_index is not None:
            raise FeedbackInvalid(
                f"The metric '{metric.name}' is about whole runs: leave out 'step_index'.",
                param="step_index",
            )
        return None
    if isinstance(step_index, bool) or not isinstance(step_index, int):
        raise FeedbackInvalid(
            f"The metric '{metric.name}' is about steps: 'step_index' (an integer) is required.",
            param="step_index",
            code="missing_required_parameter" if step_index is None else "invalid_type",
        )
    if not run.steps.filter(index=step_index).exists():
        raise FeedbackInvalid(f"The run has no step {step_index}.", param="step_index", code="step_not_found")
    return step_index


def _learn_on_commit(*, run_id: UUID, team_id: int, metric: str, value: float) -> None:
    def call() -> None:
        try:
            learn = getattr(import_module("apps.learning.services"), "learn_from_feedback", None)
            if learn is not None:
                learn(run_id, team_id, metric, value)
        except Exception:  # learning must never cost a feedback request anything
            logger.exception("learn_from_feedback failed for run %s (%s)", run_id, metric)

    transaction.on_commit(call)


def feedback_record(
    *,
    run: Run,
    metric_name: Any,
    value: Any,
    comment: Any = "",
    source: str,
    user: Viewer = None,
    api_key: Any = None,
    step_index: Any = None,
    evaluator_name: str = "",
) -> Feedback:
    """Validate and store one feedback item with its audit row; the learner hears of it on commit.

    The caller has already decided that the actor may see ``run`` (visibility is the view's job).
    Raises ``FeedbackInvalid`` naming the field and the rule.
    """
    if source not in FeedbackSource.values:
        raise FeedbackInvalid(f"Unknown feedback source '{source}'.", param="source")
    metric = _metric_for(run.team, metric_name)
    number = coerce_value(metric, value)
    text = _clean_comment(comment)
    index = _step_index(run, metric, step_index)
    author = stored_user(user)
    with transaction.atomic():
        item = Feedback.objects.create(
            run=run,
            step_index=index,
            metric=metric,
            value=number,
            comment=text,
            source=source,
            author=author,
            api_key=api_key,
            evaluator_name=evaluator_name[:64],
        )
        # The comment is the author's text about run content: the audit keeps its hash only.
        audit_run_event(
            event_type=AuditEventType.FEEDBACK_RECORDED,
            run=run,
            actor=author,
            actor_label="" if author else (f"evaluator {evaluator_name}" if evaluator_name else "system"),
            payload={
                "feedback_id": item.pk,
                "metric": metric.name,
                "value": number,
                "source": source,
                "step_index": index,
                "evaluator": evaluator_name,
                "api_key_id": getattr(api_key, "pk", None),
                "comment": content_sha256(text) if text else None,
            },
        )
        _learn_on_commit(run_id=run.pk, team_id=run.team_id, metric=metric.name, value=number)
    return item


# --- reviewers' verdicts are feedback ---------------------------------------------------------------

# A sign-off is 1, a flag 0; "needs follow-up" is no verdict on the answer yet.
REVIEW_VALUES = {"approved": 1.0, "flagged": 0.0}


def on_review_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """``post_save`` of ``audit.RunReview``: once the review committed, record its verdict as
    ``review_approved`` feedback (its own transaction and audit row, after ``run.reviewed`` in
    the run's evidence). A failure here costs the learner a signal, never the review."""
    if not created or raw or instance.status not in REVIEW_VALUES:
        return
    review_id, value = instance.pk, REVIEW_VALUES[instance.status]

    def record() -> None:
        try:
            review = RunReview.objects.select_related("run__team", "reviewer").get(pk=review_id)
            feedback_record(
                run=review.run,
                metric_name=REVIEW_METRIC,
                value=value,
                comment="",  # the review's own text is audited by the review
                source=FeedbackSource.REVIEWER,
                user=review.reviewer,
            )
        except Exception:
            logger.exception("could not record review %s as feedback", review_id)

    transaction.on_commit(record)


# --- configuration (team admins and policy admins) -------------------------------------------------


def can_configure_feedback(user: Viewer, team: Team) -> bool:
    return bool(getattr(user, "is_authenticated", False)) and can_change_team_policy(user, team)


def _require_config(actor: Actor, team: Team, what: str) -> None:
    if not can_configure_feedback(actor, team):
        raise PermissionDenied(f"You may not {what} of team '{team.slug}': it needs {CONFIG_PERMISSION}.")


def metric_create(
    *,
    actor: Actor,
    team: Team,
    name: str,
    kind: str = MetricKind.BOOLEAN,
    optimize: str = Optimize.MAX,
    level: str = MetricLevel.RUN,
    description: str = "",
) -> Metric:
    _require_config(actor, team, "define metrics")
    ensure_default_metrics(team)
    if Metric.objects.filter(team_id=team.pk, name=name).exists():
        raise FeedbackInvalid(
            f"Team '{team.slug}' already has a metric '{name}'.", param="name", code="exists"
        )
    with transaction.atomic():
        metric = Metric.objects.create(
            team=team, name=name, kind=kind, optimize=optimize, level=level, description=description
        )
        audit_record(
            event_type=AuditEventType.FEEDBACK_METRIC_CREATED,
            actor=actor,
            team=team,
            obj=metric,
            after={"name": name, "kind": kind, "optimize": optimize, "level": level},
        )
    return metric


@dataclass(frozen=True)
class EvaluatorSpec:
    name: str
    metric: Metric
    kind: str
    config: dict[str, Any]
    enabled: bool = True


def evaluator_config_problem(kind: str, metric: Metric, config: Any) -> tuple[str, str] | None:
    """(param, reason) when ``config`` does not fit ``kind``, else None."""
    if not isinstance(config, dict):
        return "config", "the configuration must be a JSON object"
    if kind == EvaluatorKind.JSON_SCHEMA:
        import jsonschema

        schema = config.get("schema")
        if not isinstance(schema, dict):
            return "config", 'a json_schema evaluator needs {"schema": {...}}'
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(
                schema
            )
        except jsonschema.SchemaError as err:
            return "config", f"the schema is not a valid JSON schema: {err.message}"
    elif kind == EvaluatorKind.JUDGE:
        rubric = config.get("rubric")
        if not isinstance(rubric, str) or not rubric.strip():
            return "config", 'a judge evaluator needs {"rubric": "..."} (what a good answer does)'
        if "worker" in config and not isinstance(config["worker"], str):
            return "config", "'worker' must be the slug of a worker in the run's pool"
    elif kind not in (EvaluatorKind.REGEX, EvaluatorKind.EXACT_MATCH):
        return "kind", f"unknown evaluator kind '{kind}'"
    if kind != EvaluatorKind.JUDGE and metric.kind != MetricKind.BOOLEAN:
        return "metric", f"a {kind} evaluator passes or fails: pick a boolean metric"
    return None


def evaluator_create(*, actor: Actor, team: Team, spec: EvaluatorSpec) -> Evaluator:
    _require_config(actor, team, "define evaluators")
    if spec.metric.team_id != team.pk:
        raise FeedbackInvalid("Pick a metric of this team.", param="metric")
    if problem := evaluator_config_problem(spec.kind, spec.metric, spec.config):
        raise FeedbackInvalid(problem[1], param=problem[0])
    if Evaluator.objects.filter(team_id=team.pk, name=spec.name).exists():
        raise FeedbackInvalid(
            f"Team '{team.slug}' already has an evaluator '{spec.name}'.", param="name", code="exists"
        )
    with transaction.atomic():
        evaluator = Evaluator.objects.create(
            team=team,
            name=spec.name,
            metric=spec.metric,
            kind=spec.kind,
            config=spec.config,
            enabled=spec.enabled,
        )
        audit_record(
            event_type=AuditEventType.FEEDBACK_EVALUATOR_CREATED,
            actor=actor,
            team=team,
            obj=evaluator,
            after={"name": spec.name, "metric": spec.metric.name, "kind": spec.kind, "enabled": spec.enabled},
        )
    return evaluator
