"""Shared pieces of the REST API: the base view, key-role permission, pagination, error mapping."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, generics, permissions
from rest_framework.pagination import BasePagination, CursorPagination, LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.views import APIView

from apps.api.models import ApiKey
from apps.api.selectors import key_allows
from apps.api.services import apikey_record_denied


def request_key(request: Request) -> ApiKey | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiKey) else None


class KeyRolePermission(permissions.BasePermission):
    """API keys act only within their role: ``read`` for safe methods unless the view says
    otherwise (``key_role``); session users are governed by their team roles in the services."""

    message = "This API key's role does not allow this operation."

    def has_permission(self, request: Request, view: Any) -> bool:
        key = request_key(request)
        if key is None:
            return True
        needed = getattr(view, "key_role", None) or (
            "read" if request.method in permissions.SAFE_METHODS else "admin"
        )
        if key_allows(key, needed):
            return True
        apikey_record_denied(
            api_key=key, reason="insufficient_role", detail=f"{request.method} {request.path}"
        )
        self.message = f"This API key has the role '{key.role}'; this operation needs '{needed}'."
        return False


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
    permission_classes = [permissions.IsAuthenticated, KeyRolePermission]
    key_role: str | None = None

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
