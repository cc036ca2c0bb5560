"""``/api/teams/``: teams and memberships."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.rest.base import PLATFORM_ONLY, ApiListView, ApiView
from apps.governance import selectors as gov
from apps.governance.models import Membership, Role, Team
from apps.governance.services import (
    membership_remove,
    membership_set,
    team_create,
    team_set_default_pool,
    team_update,
)
from apps.workers.grants import pools_granted_to


class TeamOutput(serializers.ModelSerializer):
    default_pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    role = serializers.SerializerMethodField(help_text="The caller's role in the team (null for superusers).")

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "default_pool", "retention_days", "created_at", "role"]

    def get_role(self, obj: Team) -> str | None:
        request = self.context.get("request")
        return gov.role_in(request.user, obj) if request else None


class TeamCreateInput(serializers.Serializer):
    slug = serializers.SlugField(max_length=50)
    name = serializers.CharField(max_length=100)
    retention_days = serializers.IntegerField(min_value=1, required=False, allow_null=True)


class TeamUpdateInput(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    retention_days = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    default_pool = serializers.SlugField(
        required=False, allow_null=True, help_text="Slug of a pool granted to the team, or null."
    )


class MembershipOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )

    class Meta:
        model = Membership
        fields = ["id", "team", "user", "role", "created_at"]


class MembershipInput(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipRoleInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


def visible_team(view: ApiView, slug: str) -> Team:
    return get_object_or_404(api_sel.teams_for(view.request.user, view.key), slug=slug)


class TeamListCreate(ApiListView):
    serializer_class = TeamOutput
    key_scopes = {"POST": PLATFORM_ONLY}  # creating teams is a platform operation

    def get_queryset(self) -> Any:
        return api_sel.teams_for(self.request.user, self.key).select_related("default_pool").order_by("slug")

    @extend_schema(request=TeamCreateInput, responses={201: TeamOutput})
    def post(self, request: Request) -> Response:
        data = TeamCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        team = team_create(actor=request.user, **data.validated_data)
        return Response(TeamOutput(team, context={"request": request}).data, status=status.HTTP_201_CREATED)


class TeamDetail(ApiView):
    key_scopes = {"PATCH": ApiScope.TEAM_ADMIN}

    @extend_schema(responses=TeamOutput)
    def get(self, request: Request, slug: str) -> Response:
        return Response(TeamOutput(visible_team(self, slug), context={"request": request}).data)

    @extend_schema(request=TeamUpdateInput, responses=TeamOutput)
    def patch(self, request: Request, slug: str) -> Response:
        team = visible_team(self, slug)
        data = TeamUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        changes: dict[str, Any] = {}
        if "name" in v:
            changes["name"] = v["name"]
        if "retention_days" in v:
            changes["retention_days"] = v["retention_days"]
        if changes:
            team = team_update(actor=request.user, team=team, **changes)
        if "default_pool" in v:
            pool = None
            if v["default_pool"]:
                pool = pools_granted_to(team).filter(slug=v["default_pool"]).first()
                if pool is None:
                    raise ValidationError({"default_pool": ["Choose a pool granted to this team."]})
            team = team_set_default_pool(actor=request.user, team=team, pool=pool)
        return Response(TeamOutput(team, context={"request": request}).data)


class MemberListCreate(ApiListView):
    serializer_class = MembershipOutput
    key_scopes = {"POST": ApiScope.TEAM_ADMIN}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Membership.objects.none()
        return gov.team_members(visible_team(self, self.kwargs["slug"])).select_related("team")

    @extend_schema(request=MembershipInput, responses={201: MembershipOutput})
    def post(self, request: Request, slug: str) -> Response:
        team = visible_team(self, slug)
        data = MembershipInput(data=request.data)
        data.is_valid(raise_exception=True)
        user = get_user_model().objects.filter(username=data.validated_data["username"]).first()
        if user is None:
            raise ValidationError({"username": ["No user with this username."]})
        membership = membership_set(
            actor=request.user, team=team, user=user, role=data.validated_data["role"]
        )
        return Response(MembershipOutput(membership).data, status=status.HTTP_201_CREATED)


class MemberDetail(ApiView):
    key_scopes = {"PATCH": ApiScope.TEAM_ADMIN, "DELETE": ApiScope.TEAM_ADMIN}

    def _membership(self, slug: str, username: str) -> Membership:
        team = visible_team(self, slug)
        return get_object_or_404(gov.team_members(team), user__username=username)

    @extend_schema(responses=MembershipOutput)
    def get(self, request: Request, slug: str, username: str) -> Response:
        return Response(MembershipOutput(self._membership(slug, username)).data)

    @extend_schema(request=MembershipRoleInput, responses=MembershipOutput)
    def patch(self, request: Request, slug: str, username: str) -> Response:
        membership = self._membership(slug, username)
        data = MembershipRoleInput(data=request.data)
        data.is_valid(raise_exception=True)
        updated = membership_set(
            actor=request.user, team=membership.team, user=membership.user, role=data.validated_data["role"]
        )
        return Response(MembershipOutput(updated).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str, username: str) -> Response:
        membership = self._membership(slug, username)
        membership_remove(actor=request.user, team=membership.team, user=membership.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
