"""API key authentication (``Authorization: Bearer cw_…`` or ``X-Api-Key: cw_…``).

A key authenticates as its creator (``request.user``) with ``request.auth`` set to the ``ApiKey``;
``apps.api.selectors`` and ``apps.api.permissions`` then narrow everything to the key's team,
allowed pools and role. The key id goes into the request context so every audit row written
during the request carries it.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.request import Request

from apps.api import keyguard, ratelimit
from apps.api.models import ApiKey
from apps.api.services import ApiKeyInvalid, apikey_authenticate
from apps.core.request_context import set_api_key_id


def presented_key(request: HttpRequest) -> str | None:
    """The raw key the client presented, or None when it presented none."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    value = request.META.get("HTTP_X_API_KEY", "").strip()
    return value or None


def authenticate_key(raw: str) -> ApiKey:
    """Authenticate and put the key id into the audit request context."""
    key = apikey_authenticate(raw)
    set_api_key_id(key.pk)
    return key


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        raw = presented_key(request._request)
        if raw is None:
            if header and header.partition(" ")[0].lower() == "bearer":
                raise AuthenticationFailed("Empty bearer token.")
            return None  # not a key request: let session authentication try

        try:
            key = keyguard.authenticate(request._request, raw)
        except keyguard.KeyThrottled as exc:
            raise Throttled(wait=exc.retry_after_s, detail=exc.message) from None
        except ApiKeyInvalid as exc:
            raise AuthenticationFailed(exc.reason) from exc
        decision = ratelimit.hit_requests(key_prefix=key.prefix, limit=key.requests_per_minute)
        if not decision.allowed:
            raise Throttled(
                wait=decision.retry_after_s,
                detail=f"Rate limit of {decision.limit} requests per minute reached for this key.",
            )
        return (key.created_by, key)

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when no credentials were given.
        return 'Bearer realm="api"'
