"""Feedback pages and the REST view ``/api/runs/<id>/feedback/``.

Pages sit above every app (import-linter), so this module may use the API's key authentication
and selectors; the core (models, services, selectors) stays below ``apps.api``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.rest.base import ApiView
from apps.core.types import Viewer
from apps.feedback import selectors, services
from apps.feedback.forms import EvaluatorForm, MetricForm
from apps.feedback.models import COMMENT_MAX, Feedback, FeedbackSource
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.runs.selectors import run_content_visible

# --- REST ---------------------------------------------------------------------------------------


class FeedbackOutput(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True)
    metric: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    who = serializers.CharField(
        read_only=True, help_text="Who or what gave it (user, key prefix, evaluator)."
    )
    evaluator = serializers.CharField(source="evaluator_name", read_only=True)

    class Meta:
        model = Feedback
        fields = [
            "id",
            "run",
            "step_index",
            "metric",
            "value",
            "comment",
            "source",
            "who",
            "evaluator",
            "created_at",
        ]

    def to_representation(self, instance: Feedback) -> dict[str, Any]:
        data = super().to_representation(instance)
        if self.context.get("content_withheld"):
            data["comment"] = None  # may quote an answer still held for review
        return data


class FeedbackInput(serializers.Serializer):
    metric = serializers.CharField(max_length=64, default="helpful")
    value = serializers.JSONField(
        help_text="true/false/1/0 for boolean metrics; a finite number for float ones."
    )
    comment = serializers.CharField(max_length=COMMENT_MAX, required=False, allow_blank=True, default="")
    step_index = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0)
    source = serializers.ChoiceField(  # type: ignore[assignment]  # the JSON field is named "source"
        choices=[FeedbackSource.THUMBS, FeedbackSource.API],
        required=False,
        help_text="thumbs (the run page's control, session only) or api (default).",
    )


class RunFeedback(ApiView):
    """A run's feedback (GET) and a new feedback item (POST) for a run you can see."""

    key_scopes = {"GET": ApiScope.RUNS_READ, "POST": ApiScope.RUNS_WRITE}

    def _run(self, run_id: Any) -> Any:
        return get_object_or_404(
            api_sel.runs_for(self.request.user, self.key).select_related("team"), pk=run_id
        )

    @extend_schema(responses={200: FeedbackOutput(many=True)})
    def get(self, request: Request, run_id: Any) -> Response:
        run = self._run(run_id)
        withheld = not run_content_visible(user=request.user, run=run)
        items = selectors.feedback_of_run(run)[:500]
        return Response(FeedbackOutput(items, many=True, context={"content_withheld": withheld}).data)

    @extend_schema(request=FeedbackInput, responses={201: FeedbackOutput})
    def post(self, request: Request, run_id: Any) -> Response:
        run = self._run(run_id)
        data = FeedbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        source = FeedbackSource.API
        if v.get("source") == FeedbackSource.THUMBS and self.key is None:
            source = FeedbackSource.THUMBS
        try:
            item = services.feedback_record(
                run=run,
                metric_name=v["metric"],
                value=v["value"],
                comment=v.get("comment") or "",
                source=source,
                user=request.user,
                api_key=self.key,
                step_index=v.get("step_index"),
            )
        except services.FeedbackInvalid as err:
            raise ValidationError({err.param: [err.message]}) from None
        return Response(FeedbackOutput(item).data, status=status.HTTP_201_CREATED)


# --- team settings page (metrics, evaluators) --------------------------------------------------------


def _team_for_config(user: Viewer, slug: str) -> Team:
    team = get_object_or_404(Team, slug=slug)
    if not gov.can_view_team(user, team):
        raise Http404("No such team.")  # other teams' existence is not revealed
    if not services.can_configure_feedback(user, team):
        raise PermissionDenied(
            f"You may not configure feedback of team '{team.slug}': it needs {services.CONFIG_PERMISSION}."
        )
    return team


@require_http_methods(["GET", "POST"])
def team_feedback(request: HttpRequest, slug: str) -> HttpResponse:
    """List and create the team's metrics and evaluators (team admins and policy admins)."""
    team = _team_for_config(request.user, slug)
    metric_form = MetricForm(prefix="metric")
    evaluator_form = EvaluatorForm(prefix="evaluator", team=team)
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "metric":
                metric_form = MetricForm(request.POST, prefix="metric")
                if metric_form.is_valid():
                    metric = services.metric_create(actor=request.user, team=team, **metric_form.cleaned_data)
                    messages.success(request, f"Metric {metric.name} created.")
                    return redirect("feedback:team", slug=team.slug)
            elif action == "evaluator":
                evaluator_form = EvaluatorForm(request.POST, prefix="evaluator", team=team)
                if evaluator_form.is_valid():
                    c = evaluator_form.cleaned_data
                    evaluator = services.evaluator_create(
                        actor=request.user,
                        team=team,
                        spec=services.EvaluatorSpec(
                            name=c["name"],
                            metric=c["metric"],
                            kind=c["kind"],
                            config=c["config"],
                            enabled=c["enabled"],
                        ),
                    )
                    messages.success(request, f"Evaluator {evaluator.name} created.")
                    return redirect("feedback:team", slug=team.slug)
            else:
                messages.error(request, "Choose what to create: action=metric or action=evaluator.")
        except services.FeedbackInvalid as err:
            form = metric_form if action == "metric" else evaluator_form
            field = err.param if err.param in form.fields else None
            form.add_error(field, err.message)
    status_code = 400 if request.method == "POST" else 200
    return render(
        request,
        "feedback/team_feedback.html",
        {
            "team": team,
            "metrics": selectors.metrics_of_team(team),
            "evaluators": selectors.evaluators_of_team(team),
            "metric_form": metric_form,
            "evaluator_form": evaluator_form,
        },
        status=status_code,
    )
