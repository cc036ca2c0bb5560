"""``/api/providers/``, ``/api/workers/``, ``/api/pools/``. Provider keys are write-only."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.rest.base import ApiListView, ApiView, key_object, require_team_object
from apps.governance.models import Team
from apps.workers.models import Pool, Provider, ProviderKind, Worker
from apps.workers.services import (
    pool_create,
    pool_update,
    provider_create,
    provider_update,
    worker_create,
    worker_health_check,
    worker_update,
)

# --- providers ---------------------------------------------------------------------------------------


class ProviderOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    api_key_set = serializers.SerializerMethodField(help_text="Whether a key is stored (never the key).")
    api_key_hint = serializers.SerializerMethodField(help_text="'•••• last 4' of a stored key.")

    class Meta:
        model = Provider
        fields = [
            "id",
            "slug",
            "name",
            "kind",
            "team",
            "base_url",
            "model_path",
            "api_key_env",
            "api_key_set",
            "api_key_hint",
            "created_at",
            "updated_at",
        ]

    def get_api_key_set(self, obj: Provider) -> bool:
        return bool(obj.api_key_encrypted)

    def get_api_key_hint(self, obj: Provider) -> str:
        return f"•••• {obj.api_key_last4}" if obj.api_key_last4 else ""


class ProviderCreateInput(serializers.Serializer):
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=ProviderKind.choices)
    team = serializers.SlugField(
        required=False, allow_null=True, help_text="Owning team slug; null = platform."
    )
    base_url = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    model_path = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    api_key_env = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    api_key = serializers.CharField(
        required=False, allow_blank=True, write_only=True, help_text="Stored encrypted; never returned."
    )


class ProviderUpdateInput(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    kind = serializers.ChoiceField(choices=ProviderKind.choices, required=False)
    base_url = serializers.CharField(max_length=300, required=False, allow_blank=True)
    model_path = serializers.CharField(max_length=500, required=False, allow_blank=True)
    api_key_env = serializers.CharField(max_length=100, required=False, allow_blank=True)
    api_key = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        help_text="A new key (write-only); empty keeps the stored one.",
    )
    clear_api_key = serializers.BooleanField(required=False, default=False)


def _team_by_slug(view: ApiView, slug: str | None, field: str = "team") -> Team | None:
    if not slug:
        return None
    team = api_sel.teams_for(view.request.user, view.key).filter(slug=slug).first()
    if team is None:
        raise ValidationError({field: ["No team with this slug that you can see."]})
    return team


class ProviderListCreate(ApiListView):
    serializer_class = ProviderOutput
    key_scopes = {"POST": ApiScope.POOLS_WRITE}

    def get_queryset(self) -> Any:
        return (
            api_sel.providers_visible_for(self.request.user, self.key).select_related("team").order_by("slug")
        )

    @extend_schema(request=ProviderCreateInput, responses={201: ProviderOutput})
    def post(self, request: Request) -> Response:
        data = ProviderCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        v["team"] = _team_by_slug(self, v.get("team"))
        if v["team"] is None:
            require_team_object(self, None, team_id=None, what="A platform provider (no team)")
        provider = provider_create(actor=request.user, **v)
        return Response(ProviderOutput(provider).data, status=status.HTTP_201_CREATED)


class ProviderDetail(ApiView):
    key_scopes = {"PATCH": ApiScope.POOLS_WRITE}

    def _provider(self, slug: str) -> Provider:
        return key_object(
            self,
            api_sel.providers_visible_for(self.request.user, self.key),
            platform=Provider.objects.filter(team__isnull=True),
            what="A platform provider",
            slug=slug,
        )

    @extend_schema(responses=ProviderOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(ProviderOutput(self._provider(slug)).data)

    @extend_schema(request=ProviderUpdateInput, responses=ProviderOutput)
    def patch(self, request: Request, slug: str) -> Response:
        provider = self._provider(slug)
        data = ProviderUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(
            ProviderOutput(provider_update(actor=request.user, provider=provider, **data.validated_data)).data
        )


# --- workers -----------------------------------------------------------------------------------------


class WorkerOutput(serializers.ModelSerializer):
    provider: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    fallback: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    tags = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Worker
        fields = [
            "id",
            "slug",
            "display_name",
            "provider",
            "model_name",
            "strengths",
            "tags",
            "cost_rank",
            "context_window",
            "max_output_tokens",
            "input_price_per_mtok",
            "output_price_per_mtok",
            "timeout_s",
            "max_concurrency",
            "fallback",
            "enabled",
            "health_status",
            "health_detail",
            "health_latency_ms",
            "health_checked_at",
            "created_at",
            "updated_at",
        ]


class _WorkerFields(serializers.Serializer):
    display_name = serializers.CharField(max_length=100)
    model_name = serializers.CharField(max_length=200)
    strengths = serializers.CharField(required=False, allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=40), required=False)
    cost_rank = serializers.IntegerField(min_value=1, max_value=5, required=False)
    context_window = serializers.IntegerField(min_value=1, max_value=10_000_000, required=False)
    max_output_tokens = serializers.IntegerField(min_value=1, max_value=10_000_000, required=False)
    input_price_per_mtok = serializers.DecimalField(
        max_digits=12, decimal_places=6, min_value=0, required=False, allow_null=True
    )
    output_price_per_mtok = serializers.DecimalField(
        max_digits=12, decimal_places=6, min_value=0, required=False, allow_null=True
    )
    timeout_s = serializers.IntegerField(min_value=1, max_value=3600, required=False)
    max_concurrency = serializers.IntegerField(
        min_value=1,
        max_value=1000,
        required=False,
        allow_null=True,
        help_text="Calls at once; null: no limit.",
    )
    fallback = serializers.SlugField(
        required=False, allow_null=True, help_text="Slug of the fallback worker."
    )
    enabled = serializers.BooleanField(required=False)


class WorkerCreateInput(_WorkerFields):
    slug = serializers.SlugField(max_length=60)
    provider = serializers.SlugField(help_text="Provider slug")


class WorkerUpdateInput(_WorkerFields):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


class HealthOutput(serializers.Serializer):
    status = serializers.CharField()
    latency_ms = serializers.FloatField(allow_null=True)
    detail = serializers.CharField()


def _resolve_fallback(view: ApiView, values: dict[str, Any]) -> None:
    if "fallback" in values:
        slug = values["fallback"]
        if slug:
            worker = api_sel.workers_visible_for(view.request.user, view.key).filter(slug=slug).first()
            if worker is None:
                raise ValidationError({"fallback": ["No worker with this slug that you can see."]})
            values["fallback"] = worker
        else:
            values["fallback"] = None


class WorkerListCreate(ApiListView):
    serializer_class = WorkerOutput
    key_scopes = {"POST": ApiScope.POOLS_WRITE}

    def get_queryset(self) -> Any:
        return (
            api_sel.workers_visible_for(self.request.user, self.key)
            .select_related("provider", "fallback")
            .order_by("slug")
        )

    @extend_schema(request=WorkerCreateInput, responses={201: WorkerOutput})
    def post(self, request: Request) -> Response:
        data = WorkerCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        provider = (
            api_sel.providers_visible_for(request.user, self.key).filter(slug=v.pop("provider")).first()
        )
        if provider is None:
            raise ValidationError({"provider": ["No provider with this slug that you can see."]})
        _resolve_fallback(self, v)
        worker = worker_create(actor=request.user, provider=provider, **v)
        return Response(WorkerOutput(worker).data, status=status.HTTP_201_CREATED)


class WorkerDetail(ApiView):
    key_scopes = {"PATCH": ApiScope.POOLS_WRITE}

    def _worker(self, slug: str) -> Worker:
        return get_object_or_404(api_sel.workers_visible_for(self.request.user, self.key), slug=slug)

    @extend_schema(responses=WorkerOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(WorkerOutput(self._worker(slug)).data)

    @extend_schema(request=WorkerUpdateInput, responses=WorkerOutput)
    def patch(self, request: Request, slug: str) -> Response:
        worker = self._worker(slug)
        require_team_object(self, worker, team_id=worker.provider.team_id, what=f"The worker '{worker.slug}'")
        data = WorkerUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        _resolve_fallback(self, v)
        return Response(WorkerOutput(worker_update(actor=request.user, worker=worker, **v)).data)


class WorkerHealthCheck(ApiView):
    key_scopes = {"POST": ApiScope.POOLS_WRITE}

    @extend_schema(request=None, responses=HealthOutput)
    def post(self, request: Request, slug: str) -> Response:
        worker = get_object_or_404(api_sel.workers_visible_for(request.user, self.key), slug=slug)
        require_team_object(self, worker, team_id=worker.provider.team_id, what=f"The worker '{worker.slug}'")
        result = worker_health_check(actor=request.user, worker=worker)
        return Response({"status": result.status, "latency_ms": result.latency_ms, "detail": result.detail})


# --- pools -------------------------------------------------------------------------------------------


class PoolOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    workers = serializers.SerializerMethodField(help_text="Worker slugs in plan order (index = position).")
    default_worker: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    conductor_worker: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    mini_conductor: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug",
        read_only=True,
        allow_null=True,
        help_text="Plans conductor-mini; null: conductor_worker.",
    )
    ultra_conductor: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug",
        read_only=True,
        allow_null=True,
        help_text="Plans conductor-ultra; null: conductor_worker.",
    )
    usable = serializers.SerializerMethodField(help_text="Whether the caller may run on this pool.")

    class Meta:
        model = Pool
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "team",
            "workers",
            "default_worker",
            "conductor_worker",
            "mini_conductor",
            "ultra_conductor",
            "enabled",
            "usable",
            "created_at",
            "updated_at",
        ]

    def get_workers(self, obj: Pool) -> list[str]:
        return [e.worker.slug for e in sorted(obj.pool_workers.all(), key=lambda e: e.position)]

    def get_usable(self, obj: Pool) -> bool:
        usable = self.context.get("usable_ids")
        return obj.pk in usable if usable is not None else False


class _PoolFields(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)
    workers = serializers.ListField(
        child=serializers.SlugField(), required=False, help_text="Worker slugs in plan order."
    )
    default_worker = serializers.SlugField(required=False, allow_null=True)
    conductor_worker = serializers.SlugField(required=False, allow_null=True)
    mini_conductor = serializers.SlugField(
        required=False,
        allow_null=True,
        help_text="Worker slug that plans conductor-mini; null: conductor_worker.",
    )
    ultra_conductor = serializers.SlugField(
        required=False,
        allow_null=True,
        help_text="Worker slug that plans conductor-ultra; null: conductor_worker.",
    )
    enabled = serializers.BooleanField(required=False)


class PoolCreateInput(_PoolFields):
    slug = serializers.SlugField(max_length=50)
    team = serializers.SlugField(
        required=False, allow_null=True, help_text="Owning team; null = platform pool."
    )


class PoolUpdateInput(_PoolFields):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


def _resolve_pool_workers(view: ApiView, v: dict[str, Any]) -> None:
    visible = api_sel.workers_visible_for(view.request.user, view.key)
    if "workers" in v:
        slugs = v["workers"]
        found = {w.slug: w for w in visible.filter(slug__in=slugs)}
        missing = [s for s in slugs if s not in found]
        if missing:
            raise ValidationError({"workers": [f"Unknown workers: {', '.join(missing)}."]})
        v["workers"] = [found[s] for s in slugs]
    for field in ("default_worker", "conductor_worker", "mini_conductor", "ultra_conductor"):
        if field in v:
            slug = v[field]
            if slug:
                worker = visible.filter(slug=slug).first()
                if worker is None:
                    raise ValidationError({field: ["No worker with this slug that you can see."]})
                v[field] = worker
            else:
                v[field] = None


def _pool_context(view: ApiView) -> dict[str, Any]:
    return {
        "usable_ids": set(api_sel.pools_usable_for(view.request.user, view.key).values_list("pk", flat=True))
    }


class PoolListCreate(ApiListView):
    serializer_class = PoolOutput
    key_scopes = {"POST": ApiScope.POOLS_WRITE}

    def get_queryset(self) -> Any:
        return (
            api_sel.pools_visible_for(self.request.user, self.key)
            .select_related("team", "default_worker", "conductor_worker", "mini_conductor", "ultra_conductor")
            .prefetch_related("pool_workers__worker")
            .order_by("slug")
        )

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), **_pool_context(self)}

    @extend_schema(request=PoolCreateInput, responses={201: PoolOutput})
    def post(self, request: Request) -> Response:
        data = PoolCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        v["team"] = _team_by_slug(self, v.get("team"))
        if v["team"] is None:
            require_team_object(self, None, team_id=None, what="A platform pool (no team)")
        _resolve_pool_workers(self, v)
        pool = pool_create(actor=request.user, **v)
        return Response(PoolOutput(pool, context=_pool_context(self)).data, status=status.HTTP_201_CREATED)


class PoolDetail(ApiView):
    key_scopes = {"PATCH": ApiScope.POOLS_WRITE}

    def _pool(self, slug: str) -> Pool:
        return get_object_or_404(api_sel.pools_visible_for(self.request.user, self.key), slug=slug)

    @extend_schema(responses=PoolOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(PoolOutput(self._pool(slug), context=_pool_context(self)).data)

    @extend_schema(request=PoolUpdateInput, responses=PoolOutput)
    def patch(self, request: Request, slug: str) -> Response:
        pool = self._pool(slug)
        require_team_object(self, pool, team_id=pool.team_id, what=f"The pool '{pool.slug}'")
        data = PoolUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        _resolve_pool_workers(self, v)
        pool = pool_update(actor=request.user, pool=pool, **v)
        return Response(PoolOutput(pool, context=_pool_context(self)).data)
