"""``/api/policies/``: policies, versions (draft, publish, rollback) and diffs."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.rest.base import ApiListView, ApiView, key_object
from apps.policies.models import Policy, PolicyVersion
from apps.policies.services import policy_diff, policy_publish, policy_rollback, policy_save_draft
from apps.policies.spec import SpecError


class PolicyVersionSummaryOutput(serializers.ModelSerializer):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    published_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = PolicyVersion
        fields = [
            "id",
            "number",
            "status",
            "note",
            "created_by",
            "created_at",
            "published_by",
            "published_at",
        ]


class PolicyVersionOutput(PolicyVersionSummaryOutput):
    spec = serializers.JSONField()

    class Meta(PolicyVersionSummaryOutput.Meta):
        fields = [*PolicyVersionSummaryOutput.Meta.fields, "spec"]


class PolicyOutput(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    current_version = PolicyVersionSummaryOutput(read_only=True, allow_null=True)

    class Meta:
        model = Policy
        fields = ["id", "name", "team", "current_version", "created_at"]


class DraftInput(serializers.Serializer):
    spec = serializers.JSONField(help_text="The policy spec (see the policy editor's help for every field).")
    note = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class NoteInput(serializers.Serializer):
    note = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class DiffEntry(serializers.Serializer):
    path = serializers.CharField()
    old = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)


class DiffOutput(serializers.Serializer):
    policy = serializers.IntegerField()
    from_version = serializers.IntegerField()
    to_version = serializers.IntegerField()
    changes = DiffEntry(many=True)


def spec_errors(exc: Any) -> ValidationError:
    """A SpecError as field errors under ``spec`` (``spec.guardrails.input.pii.action``…)."""
    errors: dict[str, list[str]] = {}
    for err in getattr(exc, "errors", []) or []:
        key = f"spec.{err.path}" if err.path else "spec"
        errors.setdefault(key, []).append(err.message)
    return ValidationError(errors or {"spec": [str(exc)]})


def visible_policy(view: ApiView, policy_id: int) -> Policy:
    return key_object(
        view,
        api_sel.policies_for(view.request.user, view.key).select_related("team"),
        platform=Policy.objects.filter(team__isnull=True),
        what="The platform default policy",
        pk=policy_id,
    )


def policy_version(policy: Policy, number: int) -> PolicyVersion:
    return get_object_or_404(
        PolicyVersion.objects.select_related("created_by", "published_by"), policy=policy, number=number
    )


class PolicyList(ApiListView):
    serializer_class = PolicyOutput

    def get_queryset(self) -> Any:
        return (
            api_sel.policies_for(self.request.user, self.key)
            .select_related(
                "team", "current_version", "current_version__created_by", "current_version__published_by"
            )
            .order_by("pk")
        )


class PolicyDetail(ApiView):
    @extend_schema(responses=PolicyOutput)
    def get(self, request: Request, policy_id: int) -> Response:
        return Response(PolicyOutput(visible_policy(self, policy_id)).data)


class PolicyVersionListCreate(ApiListView):
    serializer_class = PolicyVersionSummaryOutput
    key_scopes = {"POST": ApiScope.POLICIES_WRITE}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return PolicyVersion.objects.none()
        policy = visible_policy(self, self.kwargs["policy_id"])
        return policy.versions.select_related("created_by", "published_by").order_by("-number")

    @extend_schema(request=DraftInput, responses={201: PolicyVersionOutput})
    def post(self, request: Request, policy_id: int) -> Response:
        policy = visible_policy(self, policy_id)
        data = DraftInput(data=request.data)
        data.is_valid(raise_exception=True)
        if not isinstance(data.validated_data["spec"], dict):
            raise ValidationError({"spec": ["The spec must be a JSON object."]})
        try:
            draft = policy_save_draft(
                actor=request.user,
                policy=policy,
                spec=data.validated_data["spec"],
                note=data.validated_data["note"],
            )
        except SpecError as exc:
            raise spec_errors(exc) from None
        return Response(PolicyVersionOutput(draft).data, status=status.HTTP_201_CREATED)


class PolicyVersionDetail(ApiView):
    @extend_schema(responses=PolicyVersionOutput)
    def get(self, request: Request, policy_id: int, number: int) -> Response:
        return Response(PolicyVersionOutput(policy_version(visible_policy(self, policy_id), number)).data)


class PolicyVersionPublish(ApiView):
    key_scopes = {"POST": ApiScope.POLICIES_WRITE}

    @extend_schema(request=NoteInput, responses=PolicyVersionOutput)
    def post(self, request: Request, policy_id: int, number: int) -> Response:
        policy = visible_policy(self, policy_id)
        version = policy_version(policy, number)
        data = NoteInput(data=request.data)
        data.is_valid(raise_exception=True)
        note = data.validated_data["note"]
        try:
            if version.status == "draft":
                result = policy_publish(actor=request.user, version=version, note=note)
            elif policy.current_version_id == version.pk:
                raise ValidationError({"number": [f"Version {number} is already in force."]})
            else:
                # Publishing an old version again is a rollback: a new version with its spec.
                result = policy_rollback(actor=request.user, policy=policy, to_version=version, note=note)
        except SpecError as exc:
            raise spec_errors(exc) from None
        except ValueError as exc:
            raise ValidationError({"number": [str(exc)]}) from None
        return Response(PolicyVersionOutput(result).data)


class PolicyDiff(ApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter("from", int, required=True, description="older version number"),
            OpenApiParameter("to", int, required=True, description="newer version number"),
        ],
        responses=DiffOutput,
    )
    def get(self, request: Request, policy_id: int) -> Response:
        policy = visible_policy(self, policy_id)
        numbers: dict[str, int] = {}
        errors: dict[str, list[str]] = {}
        for name in ("from", "to"):
            raw = request.query_params.get(name, "")
            if not raw.isdigit():
                errors[name] = ["Give a version number."]
            else:
                numbers[name] = int(raw)
        if errors:
            raise ValidationError(errors)
        old = policy_version(policy, numbers["from"])
        new = policy_version(policy, numbers["to"])
        return Response(
            {
                "policy": policy.pk,
                "from_version": old.number,
                "to_version": new.number,
                "changes": policy_diff(old, new),
            }
        )
