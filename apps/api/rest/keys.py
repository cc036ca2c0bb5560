"""``/api/teams/<slug>/keys/``: list (by prefix), create (plaintext once), revoke."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import DEFAULT_SCOPES, ApiKey, ApiScope
from apps.api.rest.base import ApiListView, ApiView
from apps.api.services import MAX_RPM, MAX_TPM, apikey_create, apikey_revoke


class ApiKeyOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    allowed_pools: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", many=True, read_only=True
    )
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiScope.choices),
        read_only=True,
        help_text="What the key may do.",
    )
    acts_as = serializers.SerializerMethodField()
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "team",
            "name",
            "prefix",
            "scopes",
            "allowed_pools",
            "expires_at",
            "requests_per_minute",
            "tokens_per_minute",
            "budget_period",
            "budget_soft_usd",
            "budget_hard_usd",
            "acts_as",
            "created_at",
            "last_used_at",
            "revoked_at",
            "active",
        ]

    def get_acts_as(self, obj: ApiKey) -> str | None:
        return obj.created_by.get_username() if obj.created_by else None

    def get_active(self, obj: ApiKey) -> bool:
        from django.utils import timezone

        return obj.revoked_at is None and (obj.expires_at is None or obj.expires_at > timezone.now())


class ApiKeyCreatedOutput(ApiKeyOutput):
    key = serializers.CharField(help_text="The key itself. Shown in this response only; store it now.")

    class Meta(ApiKeyOutput.Meta):
        fields = [*ApiKeyOutput.Meta.fields, "key"]


class ApiKeyCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiScope.choices),
        required=False,
        default=lambda: list(DEFAULT_SCOPES),
        help_text="What the key may do in its team (default: runs:write, runs:read). Capped by your "
        "role in the team, and by the calling key's own scopes when a key creates a key.",
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    allowed_pools = serializers.ListField(
        child=serializers.SlugField(),
        required=False,
        default=list,
        help_text="Pool slugs; empty = every pool the team may use.",
    )
    requests_per_minute = serializers.IntegerField(min_value=1, max_value=MAX_RPM, required=False)
    tokens_per_minute = serializers.IntegerField(min_value=1, max_value=MAX_TPM, required=False)
    budget_period = serializers.ChoiceField(choices=["daily", "monthly"], required=False, default="monthly")
    budget_soft_usd = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        allow_null=True,
        help_text="Dollar budget per period; reached: calls run with x-conductor-budget-warning.",
    )
    budget_hard_usd = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        allow_null=True,
        help_text="Dollar budget per period; spent: the key's calls are refused (429 budget_exhausted).",
    )


def _managed_team(view: ApiView, slug: str) -> Any:
    from rest_framework.exceptions import PermissionDenied

    team = get_object_or_404(api_sel.teams_for(view.request.user, view.key), slug=slug)
    if not api_sel.teams_managed_for(view.request.user, view.key).filter(pk=team.pk).exists():
        raise PermissionDenied("Only the team's admins manage its API keys.")
    return team


class ApiKeyListCreate(ApiListView):
    serializer_class = ApiKeyOutput

    key_scopes = {"GET": ApiScope.TEAM_ADMIN, "POST": ApiScope.TEAM_ADMIN}  # even listing is administration

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return ApiKey.objects.none()
        team = _managed_team(self, self.kwargs["slug"])
        return (
            ApiKey.objects.filter(team=team)
            .select_related("team", "created_by")
            .prefetch_related("allowed_pools")
        )

    @extend_schema(request=ApiKeyCreateInput, responses={201: ApiKeyCreatedOutput})
    def post(self, request: Request, slug: str) -> Response:
        team = _managed_team(self, slug)
        data = ApiKeyCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        pools = list(api_sel.pools_visible_for(request.user, self.key).filter(slug__in=v["allowed_pools"]))
        missing = sorted(set(v["allowed_pools"]) - {p.slug for p in pools})
        if missing:
            from rest_framework.exceptions import ValidationError

            raise ValidationError({"allowed_pools": [f"Unknown pools: {', '.join(missing)}."]})
        created = apikey_create(
            actor=request.user,
            team=team,
            name=v["name"],
            scopes=v["scopes"],
            expires_at=v.get("expires_at"),
            allowed_pools=pools,
            requests_per_minute=v.get("requests_per_minute"),
            tokens_per_minute=v.get("tokens_per_minute"),
            issuing_key=self.key,
            budget_period=v.get("budget_period") or "monthly",
            budget_soft_usd=v.get("budget_soft_usd"),
            budget_hard_usd=v.get("budget_hard_usd"),
        )
        body = {**ApiKeyOutput(created.api_key).data, "key": created.plaintext}
        response = Response(body, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class ApiKeyDetail(ApiView):
    key_scopes = {"GET": ApiScope.TEAM_ADMIN}

    @extend_schema(responses=ApiKeyOutput)
    def get(self, request: Request, slug: str, key_id: int) -> Response:
        team = _managed_team(self, slug)
        key = get_object_or_404(ApiKey, pk=key_id, team=team)
        return Response(ApiKeyOutput(key).data)


class ApiKeyRevoke(ApiView):
    key_scopes = {"POST": ApiScope.TEAM_ADMIN}

    @extend_schema(request=None, responses=ApiKeyOutput)
    def post(self, request: Request, slug: str, key_id: int) -> Response:
        team = _managed_team(self, slug)
        key = get_object_or_404(ApiKey, pk=key_id, team=team)
        return Response(ApiKeyOutput(apikey_revoke(actor=request.user, api_key=key)).data)
