"""Shared pieces of the REST API: the base view, key-scope permission, pagination, error mapping."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import Http404
from rest_framework import exceptions, generics, permissions
from rest_framework.pagination import BasePagination, CursorPagination, LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.views import APIView

from apps.api.models import ApiKey
from apps.api.selectors import PLATFORM_REFUSAL, scope_refusal
from apps.api.services import apikey_record_denied

# ``key_scopes`` value for operations no API key may perform, whatever its scopes (platform ones).
PLATFORM_ONLY = "platform"


def request_key(request: Request) -> ApiKey | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiKey) else None


def required_scope(view: Any, method: str) -> str | None:
    """The scope a key needs for ``method`` on ``view``: ``view.key_scopes[method]``.

    Undeclared safe methods need no scope (they read the key's own team's objects, narrowed by
    ``apps.api.selectors``); undeclared writes are refused to keys (fail closed), so a new endpoint
    is never open to keys by accident.
    """
    scopes: dict[str, str | None] = getattr(view, "key_scopes", None) or {}
    if method in scopes:
        return scopes[method]
    if method == "HEAD" and "GET" in scopes:
        return scopes["GET"]
    return None if method in permissions.SAFE_METHODS else PLATFORM_ONLY


class KeyScopePermission(permissions.BasePermission):
    """API keys act only within their scopes (capped by their creator's current team role);
    session users are governed by their team roles in the services."""

    message = "This API key's scopes do not allow this operation."
    code = "insufficient_scope"

    def has_permission(self, request: Request, view: Any) -> bool:
        key = request_key(request)
        if key is None:
            return True
        needed = required_scope(view, request.method or "GET")
        if needed is None:
            return True
        code = "insufficient_scope"
        if needed == PLATFORM_ONLY:
            code = "platform_object"
            reason = (
                f"{request.method} {request.path} is not available to API keys: it acts beyond the "
                f"key's team '{key.team.slug}', and no key scope allows that."
            )
        else:
            reason = scope_refusal(key, needed) or ""
            if not reason:
                return True
        apikey_record_denied(api_key=key, reason=code, detail=f"{needed}: {request.method} {request.path}")
        self.message = reason
        return False


def key_object(
    view: Any,
    queryset: QuerySet[Any],
    *,
    platform: QuerySet[Any] | None = None,
    what: str = "This object",
    **lookup: Any,
) -> Any:
    """``get_object_or_404`` for the REST views, with one difference for keys: an object that is a
    platform object (in ``platform``) is refused with 403 naming the rule instead of a 404, since
    platform objects are no secret (every signed-in user may read them) and the caller deserves
    to know why. Other teams' objects stay 404: their existence is not the key's business."""
    obj = queryset.filter(**lookup).first()
    if obj is not None:
        return obj
    key = request_key(view.request)
    if key is not None and platform is not None and platform.filter(**lookup).exists():
        apikey_record_denied(
            api_key=key, reason="platform_object", detail=f"{view.request.method} {view.request.path}"
        )
        raise exceptions.PermissionDenied(PLATFORM_REFUSAL.format(what=what, team=key.team.slug))
    raise Http404


def require_team_object(view: Any, obj: Any, *, team_id: Any, what: str) -> None:
    """A key may change only objects its team owns (a granted platform pool is for running)."""
    key = request_key(view.request)
    if key is None or team_id == key.team_id:
        return
    apikey_record_denied(
        api_key=key, reason="platform_object", detail=f"{view.request.method} {view.request.path}"
    )
    if team_id is None:
        raise exceptions.PermissionDenied(PLATFORM_REFUSAL.format(what=what, team=key.team.slug))
    raise exceptions.PermissionDenied(
        f"{what} belongs to another team: an API key changes only objects of its team '{key.team.slug}'."
    )


def django_to_drf(exc: Exception) -> Exception:
    """Service exceptions → DRF ones, so validation errors name their field."""
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            return exceptions.ValidationError(exc.message_dict)
        return exceptions.ValidationError({"non_field_errors": exc.messages})
    if isinstance(exc, DjangoPermissionDenied | PermissionError):
        return exceptions.PermissionDenied(str(exc) or None)
    return exc


class ApiView(APIView):
    permission_classes = [permissions.IsAuthenticated, KeyScopePermission]
    # HTTP method -> the key scope it needs (None: any key of the team; PLATFORM_ONLY: no key).
    key_scopes: dict[str, str | None] = {}

    def handle_exception(self, exc: Exception) -> Any:
        return super().handle_exception(django_to_drf(exc))

    @property
    def key(self) -> ApiKey | None:
        return request_key(self.request)


class Pagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class SeqCursorPagination(CursorPagination):
    """Audit events: a cursor on ``seq`` never counts the table (fast at millions of rows)."""

    ordering = "-seq"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


def paginate(view: ApiView, queryset: Any, serializer_class: Any, paginator_class: Any = Pagination) -> Any:
    paginator = paginator_class()
    page = paginator.paginate_queryset(queryset, view.request, view=view)
    data = serializer_class(page, many=True, context={"request": view.request}).data
    return paginator.get_paginated_response(data)


class ApiListView(generics.ListAPIView, ApiView):
    """A paginated, filterable list (pagination and filters appear in the OpenAPI schema)."""

    pagination_class: type[BasePagination] | None = Pagination


class ApiRetrieveView(generics.RetrieveAPIView, ApiView):
    pass
