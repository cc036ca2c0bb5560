"""``/api/audit/``: events (filters ``run team actor type object since until``, cursor-paginated), export."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.rest.base import ApiListView, ApiView, SeqCursorPagination
from apps.audit import export
from apps.audit.checkpoints import checkpoint_create, served_note
from apps.audit.filters import FILTER_PARAMS, AuditEventFilterSet, active_filters, filter_audit_events
from apps.audit.models import AuditEvent
from apps.audit.services import audit_export_record
from apps.core.types import Viewer
from apps.governance.selectors import teams_with_audit_visible_to
from apps.governance.visibility import is_platform_admin


class AuditEventOutput(serializers.ModelSerializer):
    actor: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    payload = serializers.JSONField()

    class Meta:
        model = AuditEvent
        fields = [
            "seq",
            "created_at",
            "event_type",
            "kind",
            "actor",
            "actor_label",
            "api_key_id",
            "ip",
            "user_agent",
            "team",
            "object_type",
            "object_id",
            "object_repr",
            "run_id",
            "policy_version_id",
            "payload",
            "prev_digest",
            "digest",
        ]


class AuditEventList(ApiListView):
    serializer_class = AuditEventOutput
    filterset_class = AuditEventFilterSet
    pagination_class = SeqCursorPagination
    key_scopes = {"GET": ApiScope.AUDIT_READ}

    def get_queryset(self) -> Any:
        # Pending events (no seq until the audit sequencer numbers them) cannot be seq-paginated.
        qs = api_sel.audit_events_for(self.request.user, self.key).filter(seq__isnull=False)
        return qs.select_related("actor", "team")


class AuditEventDetail(ApiView):
    key_scopes = {"GET": ApiScope.AUDIT_READ}

    @extend_schema(responses=AuditEventOutput)
    def get(self, request: Request, seq: int) -> Response:
        event = get_object_or_404(
            api_sel.audit_events_for(request.user, self.key).select_related("actor", "team"), seq=seq
        )
        return Response(AuditEventOutput(event).data)


class AnyAccept(BaseContentNegotiation):
    """The export's format comes from ``?format=``; an Accept header must not turn it into a 406."""

    def select_parser(self, request: Any, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class AuditExport(ApiView):
    """A streamed CSV or JSON Lines export of the filtered selection, with chain digests."""

    content_negotiation_class = AnyAccept
    key_scopes = {"GET": ApiScope.AUDIT_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=["csv", "jsonl"], default="jsonl"),
            *[OpenApiParameter(name, str) for name in FILTER_PARAMS],
        ],
        responses={
            (200, "application/x-ndjson"): OpenApiTypes.BINARY,
            (200, "text/csv"): OpenApiTypes.BINARY,
        },
    )
    def get(self, request: Request) -> Any:
        export_format = request.query_params.get("format") or "jsonl"
        if export_format not in export.FORMATS:
            raise ValidationError({"format": ["Use csv or jsonl."]})
        params = active_filters(request.query_params)
        try:
            qs = filter_audit_events(api_sel.audit_events_for(request.user, self.key), params)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        recorded = audit_export_record(actor=request.user, export_format=export_format, filters=params)
        assert recorded.seq is not None  # audit_export_record returns the event sequenced
        chunks = export.export_chunks(qs.filter(seq__lt=recorded.seq), export_format)
        content_type, ext = export.FORMATS[export_format]
        django_request = request._request
        streaming = export.as_async(chunks) if isinstance(django_request, ASGIRequest) else chunks
        response = StreamingHttpResponse(streaming, content_type=content_type)
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}-upto{recorded.seq - 1}.{ext}"'
        response["X-Audit-Export-Seq"] = str(recorded.seq)
        return response


class LogCheckpoint(ApiView):
    """``/audit/log/checkpoint``: the log's latest checkpoint as a C2SP signed note (text), with
    the witnesses' cosignatures, as a tlog-tiles log serves ``<prefix>/checkpoint``.

    For who reviews the audit trail (``view_team_audit`` on a team, or a platform administrator)
    and for API keys with ``audit:read``; anyone else gets 403 naming the rule."""

    key_scopes = {"GET": ApiScope.AUDIT_READ}
    content_negotiation_class = AnyAccept  # text/plain, whatever the client accepts

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        if self.key is None and not can_read_audit_log(request.user):
            raise PermissionDenied(
                "Reading the log's checkpoint needs the audit trail of a team (permission "
                "view_team_audit: reviewers, admins, policy admins) or an API key with audit:read."
            )
        response = HttpResponse(served_note(checkpoint_create()), content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-store"
        return response


def can_read_audit_log(user: Viewer) -> bool:
    return is_platform_admin(user) or teams_with_audit_visible_to(user).exists()
