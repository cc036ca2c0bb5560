"""``/api/runs/``: create, list (filters), detail, steps (exact worker messages), events, cancel, review."""

from __future__ import annotations

from typing import Any

import django_filters
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.budgets import KeyBudgetExceeded, key_budget_check
from apps.api.models import ApiScope
from apps.api.rest.base import ApiListView, ApiView
from apps.api.v1.shaping import run_url
from apps.audit.filters import as_utc
from apps.runs import approvals, search
from apps.runs import selectors as run_filters
from apps.runs.models import (
    Preset,
    ReviewStatus,
    Run,
    RunEvent,
    RunSource,
    RunStatus,
    Step,
    Strategy,
)
from apps.runs.reviews import run_review
from apps.runs.selectors import run_content_visible, withhold_event_data, withhold_step
from apps.runs.services import RunRefused, run_cancel, run_create


def run_absolute_url(request: Request, run: Run) -> str:
    return run_url(request._request, run.pk)


class RunOutput(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="The run page with its live step graph.")
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    worker: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    api_key: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="prefix", read_only=True, allow_null=True
    )
    answer = serializers.SerializerMethodField(
        help_text="Null while held for review (reviewers see it so they can decide)."
    )
    content_withheld = serializers.SerializerMethodField(
        help_text="True while the run's model output is withheld from you: its answer is (or may "
        "still be) held for review by a require_review guardrail."
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "url",
            "team",
            "pool",
            "created_by",
            "api_key",
            "source",
            "strategy",
            "preset",
            "worker",
            "classification",
            "policy_version",
            "question",
            "answer",
            "answer_held",
            "content_withheld",
            "status",
            "status_reason",
            "error",
            "review_status",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "priced",
            "latency_ms",
            "step_count",
            "last_seq",
            "cancel_requested",
            "created_at",
            "started_at",
            "finished_at",
            "payload_erased_at",
        ]

    def get_url(self, obj: Run) -> str:
        return run_absolute_url(self.context["request"], obj)

    def _visible(self, obj: Run) -> bool:
        cache = self.context.setdefault("_content_visible", {})  # type: ignore[attr-defined]  # DRF passes a dict
        if obj.pk not in cache:
            cache[obj.pk] = run_content_visible(user=self.context["request"].user, run=obj)
        return bool(cache[obj.pk])

    def get_answer(self, obj: Run) -> str | None:
        return obj.answer if self._visible(obj) else None

    def get_content_withheld(self, obj: Run) -> bool:
        return not self._visible(obj)


class RunSummaryOutput(RunOutput):
    class Meta(RunOutput.Meta):
        fields = [
            f
            for f in RunOutput.Meta.fields
            if f not in ("question", "answer", "content_withheld", "error", "status_reason")
        ]


class MessageOutput(serializers.Serializer):
    role = serializers.CharField()
    content = serializers.CharField(allow_blank=True)


class StepOutput(serializers.ModelSerializer):
    worker: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    access = serializers.JSONField(help_text="Indices of earlier steps this worker saw.")
    messages = serializers.JSONField(help_text="The exact messages sent to the worker: [{role, content}].")

    class Meta:
        model = Step
        fields = [
            "index",
            "round",
            "worker",
            "worker_key",
            "worker_name",
            "instruction",
            "access",
            "messages",
            "output",
            "status",
            "error",
            "fallback_from",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "priced",
            "latency_ms",
            "started_at",
            "finished_at",
        ]

    def to_representation(self, instance: Step) -> dict[str, Any]:
        data = super().to_representation(instance)
        # Held answers: see apps.runs.selectors.run_content_visible.
        return withhold_step(data) if self.context.get("content_withheld") else data


class RunEventOutput(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "type", "data", "created_at"]

    def to_representation(self, instance: RunEvent) -> dict[str, Any]:
        data = super().to_representation(instance)
        if self.context.get("content_withheld"):
            data["data"] = withhold_event_data(instance.type, data["data"])
        return data


class ContentWithheldMixin:
    """List views of one run's content: withhold it from a viewer who may not see it."""

    content_withheld = False

    def withhold_for(self, run: Run) -> None:
        self.content_withheld = not run_content_visible(user=self.request.user, run=run)  # type: ignore[attr-defined]

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "content_withheld": self.content_withheld}  # type: ignore[misc]


class RunCreateInput(serializers.Serializer):
    question = serializers.CharField(max_length=32_000, trim_whitespace=True)
    team = serializers.SlugField(
        required=False, help_text="Team slug; default: the key's team / your first team."
    )
    pool = serializers.SlugField(required=False, help_text="Pool slug; default: the team's default pool.")
    strategy = serializers.ChoiceField(choices=Strategy.choices, default=Strategy.CONDUCTOR)
    preset = serializers.ChoiceField(choices=[Preset.MINI, Preset.ULTRA], default=Preset.MINI)
    worker = serializers.SlugField(required=False, help_text="For the single strategy: the worker's slug.")
    classification = serializers.ChoiceField(
        choices=["", "public", "internal", "confidential"], required=False, default=""
    )


class ReviewInput(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=[ReviewStatus.APPROVED, ReviewStatus.FLAGGED, ReviewStatus.NEEDS_FOLLOW_UP]
    )
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class ReviewOutput(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.UUIDField(source="run_id")
    status = serializers.CharField()
    reason = serializers.CharField()
    comment = serializers.CharField()
    reviewer = serializers.CharField(source="reviewer_label")
    released_answer = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class RunRefusedError(APIException):
    status_code = 400
    default_code = "invalid"

    def __init__(self, refused: Any) -> None:
        self.status_code = {
            "budget_exhausted": 429,
            "pool_not_allowed": 403,
            "pool_unavailable": 503,
        }.get(refused.code, 400)
        super().__init__(detail={"detail": refused.message, "code": refused.code}, code=refused.code)
        self.wait = refused.retry_after_s


class RunFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug", help_text="team slug")
    user = django_filters.CharFilter(field_name="created_by__username", help_text="username of the creator")
    status = django_filters.ChoiceFilter(choices=RunStatus.choices)
    strategy = django_filters.ChoiceFilter(choices=Strategy.choices)
    source = django_filters.ChoiceFilter(choices=RunSource.choices)
    pool = django_filters.CharFilter(field_name="pool__slug", help_text="pool slug")
    review_status = django_filters.ChoiceFilter(choices=ReviewStatus.choices)
    worker = django_filters.CharFilter(method="filter_worker", help_text="worker key used by any step")
    since = django_filters.IsoDateTimeFilter(
        method="filter_moment", help_text="created at or after (ISO 8601)"
    )
    until = django_filters.IsoDateTimeFilter(method="filter_moment", help_text="created before (ISO 8601)")
    q = django_filters.CharFilter(
        method="filter_text",
        help_text="Full-text search: every word in the question, or in the answer where you may see "
        "it (never a held or erased answer you may not see); a run id (full or its first 8 "
        "characters) matches that run.",
    )
    id = django_filters.CharFilter(method="filter_id", help_text="A run id, full or its first 8+ characters")
    key = django_filters.CharFilter(method="filter_key", help_text="API key prefix or name")
    model = django_filters.CharFilter(method="filter_model", help_text="worker slug or provider model name")
    request_id = django_filters.CharFilter(
        field_name="request_id", help_text="the /v1 request's x-request-id"
    )
    metadata = django_filters.CharFilter(
        method="filter_metadata", help_text="key=value of the /v1 request's metadata"
    )
    client_user = django_filters.CharFilter(method="filter_client_user", help_text="the /v1 request's user")

    class Meta:
        model = Run
        fields: list[str] = []

    def filter_worker(self, qs: Any, name: str, value: str) -> Any:
        # A subquery on the (worker_key, run) index instead of a row-duplicating join.
        return qs.filter(pk__in=Step.objects.filter(worker_key=value).values("run_id"))

    def filter_moment(self, qs: Any, name: str, value: Any) -> Any:
        try:
            moment = as_utc(value)
        except ValueError as exc:
            raise ValidationError({name: [f"Enter a date and time within range ({exc})."]}) from None
        return qs.filter(**{"created_at__gte" if name == "since" else "created_at__lt": moment})

    def filter_text(self, qs: Any, name: str, value: str) -> Any:
        if len(value) > search.MAX_QUERY_CHARS:
            raise ValidationError({"q": [f"A search is at most {search.MAX_QUERY_CHARS} characters."]})
        return search.text_search(qs, user=self.request.user, text=value)

    def filter_id(self, qs: Any, name: str, value: str) -> Any:
        try:
            return search.filter_run_ref(qs, value)
        except search.BadRunRef as exc:
            raise ValidationError({"id": [str(exc)]}) from None

    def filter_key(self, qs: Any, name: str, value: str) -> Any:
        return run_filters.by_api_key(qs, value)

    def filter_model(self, qs: Any, name: str, value: str) -> Any:
        return run_filters.by_model(qs, value)

    def filter_metadata(self, qs: Any, name: str, value: str) -> Any:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise ValidationError({"metadata": ["Write metadata as key=value, e.g. customer=acme."]})
        return run_filters.by_metadata(qs, key.strip(), val.strip())

    def filter_client_user(self, qs: Any, name: str, value: str) -> Any:
        return run_filters.by_metadata(qs, "user", value)


def visible_run(view: ApiView, run_id: Any) -> Run:
    """``run_id``: the full id, or a short one (8+ characters) naming exactly one visible run."""
    qs = api_sel.runs_for(view.request.user, view.key).select_related(
        "team", "pool", "created_by", "api_key", "worker"
    )
    run, count = search.resolve_run_ref(qs, str(run_id))
    if count > 1:
        raise ValidationError(
            {"run": [f"The id {run_id} names {count} or more runs: give more of it (or the full id)."]}
        )
    if run is None:
        raise Http404("No such run.")
    return run


class RunListCreate(ApiListView):
    serializer_class = RunSummaryOutput
    filterset_class = RunFilter

    key_scopes = {"GET": ApiScope.RUNS_READ, "POST": ApiScope.RUNS_WRITE}

    def get_queryset(self) -> Any:
        return (
            api_sel.runs_for(self.request.user, self.key)
            .select_related("team", "pool", "created_by", "api_key", "worker")
            .order_by("-created_at", "-pk")
        )

    @extend_schema(request=RunCreateInput, responses={201: RunOutput})
    def post(self, request: Request) -> Response:
        data = RunCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        team = None
        if self.key is not None:
            team = self.key.team
            if v.get("team") and v["team"] != team.slug:
                raise ValidationError({"team": ["An API key runs on its own team only."]})
        elif v.get("team"):
            team = api_sel.teams_for(request.user, None).filter(slug=v["team"]).first()
            if team is None:
                raise ValidationError({"team": ["No team with this slug that you can see."]})
        pool = None
        if v.get("pool"):
            pool = api_sel.pools_visible_for(request.user, self.key).filter(slug=v["pool"]).first()
            if pool is None:
                raise ValidationError({"pool": ["No pool with this slug that you can see."]})
        elif self.key is not None:
            pool = self.key.team.default_pool
        if (
            pool is not None
            and not api_sel.pools_usable_for(request.user, self.key).filter(pk=pool.pk).exists()
        ):
            from rest_framework.exceptions import PermissionDenied

            raise PermissionDenied(f"You may not run on the pool '{pool.slug}'.")
        worker = None
        if v.get("worker"):
            worker = api_sel.workers_visible_for(request.user, self.key).filter(slug=v["worker"]).first()
            if worker is None:
                raise ValidationError({"worker": ["No worker with this slug that you can see."]})
        warning = None
        if self.key is not None:
            # The key's own dollar budget, as on /v1 (apps.api.budgets).
            try:
                warning = key_budget_check(self.key)
            except KeyBudgetExceeded as exc:
                raise RunRefusedError(
                    RunRefused("budget_exhausted", str(exc), retry_after_s=exc.retry_after_s)
                ) from None
        try:
            run = run_create(
                actor=request.user,
                team=team,
                pool=pool,
                question=v["question"],
                strategy=v["strategy"],
                preset=v["preset"],
                worker=worker,
                source=RunSource.REST_API,
                api_key=self.key,
                classification=v.get("classification", ""),
            )
        except RunRefused as refused:
            raise RunRefusedError(refused) from None
        response = Response(RunOutput(run, context={"request": request}).data, status=status.HTTP_201_CREATED)
        response["X-Conductor-Run"] = str(run.pk)
        response["Location"] = run_absolute_url(request, run)
        if warning:
            response["X-Conductor-Budget-Warning"] = warning
        return response


class RunDetail(ApiView):
    key_scopes = {"GET": ApiScope.RUNS_READ}

    @extend_schema(responses=RunOutput)
    def get(self, request: Request, run_id: Any) -> Response:
        return Response(RunOutput(visible_run(self, run_id), context={"request": request}).data)


class RunSteps(ContentWithheldMixin, ApiListView):
    """Each step with the exact messages its worker received."""

    serializer_class = StepOutput
    key_scopes = {"GET": ApiScope.RUNS_READ}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Step.objects.none()
        run = visible_run(self, self.kwargs["run_id"])
        self.withhold_for(run)
        return Step.objects.filter(run=run).select_related("worker").order_by("index")


class RunEvents(ContentWithheldMixin, ApiListView):
    """The run's protocol events in ``seq`` order; ``after`` resumes where a client left off."""

    serializer_class = RunEventOutput
    key_scopes = {"GET": ApiScope.RUNS_READ}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return RunEvent.objects.none()
        run = visible_run(self, self.kwargs["run_id"])
        self.withhold_for(run)
        after = self.request.query_params.get("after") or "0"
        if not after.isdigit():
            raise ValidationError({"after": ["Give the last seq you have (a non-negative integer)."]})
        return RunEvent.objects.filter(run=run, seq__gt=int(after)).order_by("seq")


class RunCancel(ApiView):
    key_scopes = {"POST": ApiScope.RUNS_WRITE}

    @extend_schema(request=None, responses=RunOutput)
    def post(self, request: Request, run_id: Any) -> Response:
        run = visible_run(self, run_id)
        run = run_cancel(actor=request.user, run=run)
        return Response(RunOutput(visible_run(self, run.pk), context={"request": request}).data)


class RunReview(ApiView):
    key_scopes = {"POST": ApiScope.RUNS_REVIEW}

    @extend_schema(request=ReviewInput, responses={201: ReviewOutput})
    def post(self, request: Request, run_id: Any) -> Response:
        run = visible_run(self, run_id)
        data = ReviewInput(data=request.data)
        data.is_valid(raise_exception=True)
        review = run_review(actor=request.user, run=run, **data.validated_data)
        return Response(ReviewOutput(review).data, status=status.HTTP_201_CREATED)


class ApprovalInput(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class ApprovalRefused(APIException):
    status_code = 409
    default_code = "approval_refused"


class RunApproval(ApiView):
    """Decide a plan held for an approver: ``approve`` resumes the run, ``reject`` ends it blocked
    (a note is required). A held tool call (issue 43) is decided the same way; either decision
    resumes the run, whose call then runs or is refused. Team admins and reviewers; never on
    their own run."""

    key_scopes = {"POST": ApiScope.RUNS_REVIEW}

    @extend_schema(request=ApprovalInput, responses=RunOutput)
    def post(self, request: Request, run_id: Any) -> Response:
        from rest_framework.exceptions import PermissionDenied

        run = visible_run(self, run_id)
        data = ApprovalInput(data=request.data)
        data.is_valid(raise_exception=True)
        decide = (
            approvals.plan_approve if data.validated_data["decision"] == "approve" else approvals.plan_reject
        )
        try:
            run = decide(actor=request.user, run=run, note=data.validated_data["note"])
        except approvals.ApprovalError as exc:
            if exc.status == 403:
                raise PermissionDenied(str(exc)) from None
            if exc.status == 400:
                raise ValidationError({exc.rule: [str(exc)]}) from None
            raise ApprovalRefused(str(exc)) from None
        return Response(RunOutput(visible_run(self, run.pk), context={"request": request}).data)
